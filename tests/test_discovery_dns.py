"""DNS discovery (dnspython) against a DNS server on loopback (dnslib): A/AAAA and SRV records
of a headless Service, re-resolved; an empty name empties the set, a failing server keeps it.
Also the static source."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from dnslib import AAAA, QTYPE, RCODE, RR, SRV, A, DNSRecord
from dnslib.server import BaseResolver, DNSHandler, DNSLogger, DNSServer

from discovery.dns import DnsSource
from discovery.endpoints import Endpoint
from discovery.options import DnsOptions, StaticOptions
from discovery.static import StaticSource, parse_entry
from tests.discovery_follow import Follower
from tests.waits import arrives

SERVICE = "engines.ns.svc.cluster.local."


class Zone(BaseResolver):  # type: ignore[misc]
    """Answers from a record table the test edits; ``rcode`` set: every answer fails so."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[RR] = []
        self.additional = True  # SRV answers carry the targets' addresses
        self.rcode: int | None = None
        self.queries: list[tuple[str, str]] = []

    def set(self, *records: RR) -> None:
        with self.lock:
            self.records = list(records)

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        reply = request.reply()
        qname, qtype = str(request.q.qname), QTYPE[request.q.qtype]
        with self.lock:
            self.queries.append((qname, qtype))
            if self.rcode is not None:
                reply.header.rcode = self.rcode
                return reply
            names = {str(r.rname) for r in self.records}
            answers = [r for r in self.records
                       if str(r.rname) == qname and QTYPE[r.rtype] == qtype]
            if not answers and qname not in names:
                reply.header.rcode = RCODE.NXDOMAIN
            for r in answers:
                reply.add_answer(r)
                if qtype == "SRV" and self.additional:
                    target = str(r.rdata.target)
                    for extra in self.records:
                        if str(extra.rname) == target and QTYPE[extra.rtype] in ("A", "AAAA"):
                            reply.add_ar(extra)
        return reply


@pytest.fixture
def zone() -> Iterator[tuple[Zone, int]]:
    z = Zone()
    server = DNSServer(z, address="127.0.0.1", port=0, logger=DNSLogger(logf=lambda s: None))
    server.start_thread()
    try:
        yield z, server.server.server_address[1]
    finally:
        server.stop()
        server.server.server_close()


def _a(name: str, ip: str) -> RR:
    return RR(name, QTYPE.AAAA if ":" in ip else QTYPE.A, rdata=AAAA(ip) if ":" in ip else A(ip),
              ttl=5)


def _srv(port_name: str, target: str, port: int) -> RR:
    return RR(f"_{port_name}._tcp.{SERVICE}", QTYPE.SRV, rdata=SRV(0, 100, port, target), ttl=5)


def _source(server_port: int, **options: Any) -> DnsSource:
    return DnsSource(DnsOptions(**{"name": SERVICE, "port": 8000, "interval": 0.01,
                                   "nameservers": (f"127.0.0.1:{server_port}",), **options}))


async def test_a_and_aaaa_records_follow_the_service(zone: tuple[Zone, int]) -> None:
    z, port = zone
    z.set(_a(SERVICE, "10.1.0.1"), _a(SERVICE, "10.1.0.2"), _a(SERVICE, "fd00::3"))
    source = _source(port)
    async with Follower(source) as f:
        await arrives(lambda: len(f.engines) == 3)
        assert f.engines == {
            "10.1.0.1:8000": Endpoint("10.1.0.1:8000", "http://10.1.0.1:8000"),
            "10.1.0.2:8000": Endpoint("10.1.0.2:8000", "http://10.1.0.2:8000"),
            "[fd00::3]:8000": Endpoint("[fd00::3]:8000", "http://[fd00::3]:8000")}
        z.set(_a(SERVICE, "10.1.0.2"), _a(SERVICE, "10.1.0.4"))  # one pod went, one came
        await arrives(lambda: set(f.engines) == {"10.1.0.2:8000", "10.1.0.4:8000"})
        z.set()  # no ready pod: the name is gone (NXDOMAIN)
        await arrives(lambda: f.engines == {})
    # A and AAAA are two queries, so a change can land between them: within one change the
    # order of the events is not fixed, but each change's events all come before the next's.
    changes = [(c.kind.value, c.endpoint.name) for c in f.log]
    assert len(changes) == 8
    assert set(changes[3:6]) == {("left", "10.1.0.1:8000"), ("left", "[fd00::3]:8000"),
                                 ("joined", "10.1.0.4:8000")}
    assert set(changes[6:]) == {("left", "10.1.0.2:8000"), ("left", "10.1.0.4:8000")}


@pytest.mark.parametrize("rcode", [RCODE.SERVFAIL, RCODE.REFUSED])
async def test_a_failing_server_keeps_the_engines(zone: tuple[Zone, int], rcode: int) -> None:
    z, port = zone
    z.set(_a(SERVICE, "10.1.0.1"))
    source = _source(port)
    async with Follower(source) as f:
        await arrives(lambda: len(f.engines) == 1)
        z.rcode = rcode
        await arrives(lambda: source.failures >= 3)
        assert list(f.engines) == ["10.1.0.1:8000"]
        z.rcode = None
        z.set(_a(SERVICE, "10.1.0.1"), _a(SERVICE, "10.1.0.2"))
        await arrives(lambda: len(f.engines) == 2)


@pytest.mark.parametrize("additional", [True, False])
async def test_srv_records_name_engines_after_their_pods(zone: tuple[Zone, int],
                                                         additional: bool) -> None:
    z, port = zone
    z.additional = additional
    pod0, pod1 = f"vllm-0.{SERVICE}", f"vllm-1.{SERVICE}"
    z.set(_srv("http", pod0, 8000), _srv("http", pod1, 8001), _srv("metrics", pod0, 9090),
          _a(pod0, "10.1.0.1"), _a(pod1, "10.1.0.2"))
    source = _source(port, port="http")
    async with Follower(source) as f:
        await arrives(lambda: len(f.engines) == 2)
        assert f.engines == {"vllm-0": Endpoint("vllm-0", "http://10.1.0.1:8000"),
                             "vllm-1": Endpoint("vllm-1", "http://10.1.0.2:8001")}
        # vllm-0 recreated elsewhere: same name, a new address.
        z.set(_srv("http", pod0, 8000), _srv("http", pod1, 8001), _a(pod0, "10.1.0.7"),
              _a(pod1, "10.1.0.2"))
        await arrives(lambda: f.engines["vllm-0"].url == "http://10.1.0.7:8000")
        assert f.log[-1].kind.value == "updated"
    asked = {q for q in z.queries if q[1] in ("A", "AAAA")}
    assert bool(asked) is not additional  # targets are looked up only when not sent along


async def test_the_static_source_announces_its_list_once() -> None:
    opts = StaticOptions(("a=http://127.0.0.2:8000", "http://[::1]:9000"))
    source = StaticSource(opts)
    async with Follower(source) as f:
        await arrives(lambda: len(f.engines) == 2)
        assert f.engines == {"a": Endpoint("a", "http://127.0.0.2:8000"),
                             "[::1]:9000": Endpoint("[::1]:9000", "http://[::1]:9000")}


@pytest.mark.parametrize("entry", ["http://h", "ftp://h:1", "http://h:1/path", "a=b=http://h:1",
                                   "http://h:99999", "bad name=http://h:1"])
def test_static_entries_are_checked(entry: str) -> None:
    with pytest.raises(ValueError):
        parse_entry(entry)
    with pytest.raises(ValueError):
        StaticOptions((entry,))


def test_static_names_are_unique() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        StaticOptions(("a=http://h:1", "a=http://h:2"))
