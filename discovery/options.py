"""How each discovery source is configured: frozen, checked when built (docs/operations.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from discovery.selector import Selector

SCHEMES = ("http", "https")
# A container port name (IANA_SVC_NAME): at most 15 lowercase alphanumerics and '-', a letter.
PORT_NAME = re.compile(r"(?=.{1,15}$)[a-z0-9]+(-[a-z0-9]+)*")


def _check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")


def _check_port(port: int | str, *, named: bool) -> None:
    if isinstance(port, bool) or not isinstance(port, int | str):
        raise ValueError(f"port must be a number or a port name, got {port!r}")
    if isinstance(port, int):
        if not 1 <= port <= 65535:
            raise ValueError(f"port must be in 1..65535, got {port}")
    elif not named or not PORT_NAME.fullmatch(port) or not re.search(r"[a-z]", port):
        raise ValueError(f"port must be a number{' or a port name' if named else ''}, got "
                         f"{port!r}")


@dataclass(frozen=True, slots=True)
class StaticOptions:
    """A fixed list: ``urls`` of ``http://HOST:PORT`` or ``NAME=http://HOST:PORT``."""

    urls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        from discovery.static import parse_entry

        names = [parse_entry(u).name for u in self.urls]
        if len(set(names)) != len(names):
            raise ValueError(f"urls: duplicate engine names in {names}")


@dataclass(frozen=True, slots=True)
class DnsOptions:
    """A (headless Service's) DNS name, re-resolved every ``interval`` seconds.

    ``port`` a number: the name's A and AAAA records, each ``IP:port`` an engine. ``port`` a name
    (the Service's port name): the SRV records ``_PORT._tcp.NAME``, each target and port an
    engine (a StatefulSet's pods keep their names)."""

    name: str = ""
    port: int | str = 8000
    interval: float = 5.0
    scheme: str = "http"
    # ``HOST`` or ``HOST:PORT`` of the servers to ask; empty: the system's (/etc/resolv.conf).
    nameservers: tuple[str, ...] = ()
    timeout: float = 2.0  # per query, all servers together

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name is required (the Service's DNS name)")
        _check_port(self.port, named=True)
        _check_scheme(self.scheme)
        if not self.interval > 0 or not self.timeout > 0:
            raise ValueError("interval and timeout must be positive")


@dataclass(frozen=True, slots=True)
class KubernetesOptions:
    """Pods in ``namespace`` matching ``selector``, listed then watched.

    ``port``: a container port name (looked up in the pod's containers) or a number.
    ``kubeconfig``: a kubeconfig file; unset, the in-cluster service account (and its namespace
    when ``namespace`` is unset)."""

    selector: str = ""
    namespace: str | None = None
    port: int | str = 8000
    scheme: str = "http"
    kubeconfig: str | None = None
    context: str | None = None  # of the kubeconfig; default its current context
    # The server closes each watch after about this long (jittered up to 2x, as client-go
    # does); the source resumes from the last version it saw.
    watch_timeout: int = 300
    retry_min: float = 0.5  # seconds before retrying after an error, doubling per error
    retry_max: float = 30.0

    def __post_init__(self) -> None:
        if not self.selector:
            raise ValueError("selector is required (a label selector such as app=vllm)")
        Selector.parse(self.selector)  # raises SelectorError, a ValueError
        _check_port(self.port, named=True)
        _check_scheme(self.scheme)
        if self.watch_timeout < 1:
            raise ValueError(f"watch_timeout must be at least 1 s, got {self.watch_timeout}")
        if not 0 < self.retry_min <= self.retry_max:
            raise ValueError("retry_min must be positive and at most retry_max")


SourceOptions = StaticOptions | DnsOptions | KubernetesOptions
KINDS: dict[str, type[StaticOptions] | type[DnsOptions] | type[KubernetesOptions]] = {
    "static": StaticOptions, "dns": DnsOptions, "kubernetes": KubernetesOptions}
