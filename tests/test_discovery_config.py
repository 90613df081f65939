"""[discovery] in the router's config and its flags: parsed once, every mistake named; label
selectors parsed as the API server does (and round-tripped through lightkube's encoding)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lightkube.core.selector import build_selector

from discovery.kubernetes import lightkube_labels
from discovery.options import DnsOptions, KubernetesOptions, StaticOptions
from discovery.selector import Op, Requirement, Selector, SelectorError
from router.config import ConfigError, DiscoveryConfig, from_mapping
from router.main import parse


def test_a_discovery_table_per_kind(tmp_path: Path) -> None:
    kube = from_mapping({"discovery": {"kind": "kubernetes", "selector": "app=vllm",
                                       "port": "http", "namespace": "llm",
                                       "drain_timeout": 5.0}}).discovery
    assert kube == DiscoveryConfig(KubernetesOptions(selector="app=vllm", port="http",
                                                     namespace="llm"), drain_timeout=5.0)
    assert kube.kind == "kubernetes"
    dns = from_mapping({"discovery": {"kind": "dns", "name": "vllm.llm.svc", "port": "8000",
                                      "nameservers": ["10.0.0.10"]}}).discovery
    assert dns is not None and dns.source == DnsOptions(name="vllm.llm.svc", port=8000,
                                                        nameservers=("10.0.0.10",))
    static = from_mapping({"discovery": {"kind": "static", "urls": ["http://127.0.0.2:8000"]}})
    assert static.discovery is not None
    assert static.discovery.source == StaticOptions(("http://127.0.0.2:8000",))
    assert from_mapping({}).discovery is None


@pytest.mark.parametrize(("table", "message"), [
    ({"kind": "consul"}, "kind must be one of"),
    ({"kind": "kubernetes"}, "selector is required"),
    ({"kind": "kubernetes", "selector": "app in ()"}, "label selector"),
    ({"kind": "kubernetes", "selector": "a=b,a!=c"}, "one requirement per key"),
    ({"kind": "kubernetes", "selector": "app=x", "port": "HTTP_port"}, "port must be"),
    ({"kind": "kubernetes", "selector": "app=x", "port": 70000}, "port must be in"),
    ({"kind": "kubernetes", "selector": "app=x", "watch_timeout": "long"}, "watch_timeout"),
    ({"kind": "kubernetes", "selector": "app=x", "urls": []}, "unknown key"),
    ({"kind": "dns"}, "name is required"),
    ({"kind": "dns", "name": "x", "nameservers": "10.0.0.1"}, "list of strings"),
    ({"kind": "static", "urls": ["ftp://x:1"]}, "expected [NAME=]http"),
    ({"kind": "static", "urls": [], "drain_timeout": -1}, "drain_timeout"),
])
def test_mistakes_name_the_key(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match="discovery") as err:
        from_mapping({"discovery": table})
    assert message in str(err.value)


def test_flags_over_the_table(tmp_path: Path) -> None:
    cfg_file = tmp_path / "router.toml"
    cfg_file.write_text('[discovery]\nkind = "kubernetes"\nselector = "app=vllm"\n'
                        'port = "http"\ndrain_timeout = 7.0\n')
    cfg = parse(["--config", str(cfg_file), "--discovery-namespace", "llm",
                 "--kubeconfig", str(tmp_path / "kc")])
    assert cfg.discovery == DiscoveryConfig(KubernetesOptions(
        selector="app=vllm", port="http", namespace="llm", kubeconfig=str(tmp_path / "kc")),
        drain_timeout=7.0)
    cfg = parse(["--discovery", "kubernetes", "--discovery-selector", "app=x",
                 "--discovery-port", "8001"])
    assert cfg.discovery is not None and cfg.discovery.source == KubernetesOptions(
        selector="app=x", port=8001)
    cfg = parse(["--config", str(cfg_file), "--discovery", "static",
                 "--discovery-url", "a=http://127.0.0.2:8000"])  # another kind: a fresh table
    assert cfg.discovery == DiscoveryConfig(StaticOptions(("a=http://127.0.0.2:8000",)))
    cfg = parse(["--discovery", "dns", "--discovery-name", "vllm.svc", "--discovery-port",
                 "http"])
    assert cfg.discovery is not None and cfg.discovery.source == DnsOptions(name="vllm.svc",
                                                                            port="http")
    with pytest.raises(ConfigError, match="need --discovery"):
        parse(["--discovery-selector", "app=x"])


# ---- label selectors ----

KEYS = st.sampled_from(["app", "tier", "example.com/role", "a.b_c-d"])
VALUES = st.sampled_from(["vllm", "x", "", "v1.2", "A_b-c"])
REQS = st.one_of(
    st.builds(lambda k: Requirement(k, Op.EXISTS), KEYS),
    st.builds(lambda k: Requirement(k, Op.NOT_EXISTS), KEYS),
    st.builds(lambda k, v: Requirement(k, Op.EQUAL, (v,)), KEYS, VALUES),
    st.builds(lambda k, v: Requirement(k, Op.NOT_EQUAL, (v,)), KEYS, VALUES),
    st.builds(lambda k, vs: Requirement(k, Op.IN, tuple(sorted(vs))), KEYS,
              st.sets(VALUES.filter(bool), min_size=1, max_size=3)),
    st.builds(lambda k, vs: Requirement(k, Op.NOT_IN, tuple(sorted(vs))), KEYS,
              st.sets(VALUES.filter(bool), min_size=1, max_size=3)),
)
SELECTORS = st.lists(REQS, max_size=4, unique_by=lambda r: r.key).map(
    lambda rs: Selector(tuple(rs)))
LABELS = st.dictionaries(KEYS, VALUES, max_size=4)


@given(SELECTORS)
def test_selectors_round_trip_through_text_and_lightkube(selector: Selector) -> None:
    assert Selector.parse(selector.encode()) == selector
    assert Selector.parse(build_selector(lightkube_labels(selector))) == selector
    spaced = ", ".join(r.encode().replace("=", " = ").replace("! =", " != ")
                       for r in selector.requirements)
    assert Selector.parse(spaced) == selector


@given(SELECTORS, LABELS)
def test_a_selector_matches_as_the_api_server_does(selector: Selector,
                                                   labels: dict[str, str]) -> None:
    def holds(r: Requirement) -> bool:
        if r.op is Op.EXISTS:
            return r.key in labels
        if r.op is Op.NOT_EXISTS:
            return r.key not in labels
        if r.op in (Op.EQUAL, Op.IN):
            return r.key in labels and labels[r.key] in r.values
        return r.key not in labels or labels[r.key] not in r.values

    assert selector.matches(labels) == all(holds(r) for r in selector.requirements)


@pytest.mark.parametrize("text", ["app in ()", "app in (a", "app=(x)", "=x", "app===x", "a b",
                                  "app=x,", "!", "app notin x", "-bad=x", "app=x y",
                                  "k" * 64 + "=x"])
def test_bad_selectors_are_refused(text: str) -> None:
    with pytest.raises(SelectorError):
        Selector.parse(text)
