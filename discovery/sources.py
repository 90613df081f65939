"""Opens the source a configuration names (the sources' libraries load only when used)."""

from __future__ import annotations

from discovery.endpoints import Source
from discovery.options import DnsOptions, KubernetesOptions, SourceOptions, StaticOptions


def open_source(options: SourceOptions) -> Source:
    """The source for ``options``; a Kubernetes source reads its kubeconfig (or in-cluster
    account) here, so a bad one fails at startup, not on the first list."""
    if isinstance(options, StaticOptions):
        from discovery.static import StaticSource

        return StaticSource(options)
    if isinstance(options, DnsOptions):
        from discovery.dns import DnsSource

        return DnsSource(options)
    assert isinstance(options, KubernetesOptions)
    from discovery.kubernetes import KubernetesSource

    return KubernetesSource(options)
