"""The DNS source: a headless Service's A/AAAA (or SRV) records, re-resolved on an interval.

A headless Service publishes one A/AAAA record per ready pod (publishNotReadyAddresses off), and
one SRV record per ready pod and named port (``_PORT._tcp.SERVICE``), whose target is the pod's
own name when the pods have a hostname and subdomain (a StatefulSet's do). So every answer is
the ready set, and an engine that drops out of it leaves.

A name that does not exist or has no records (NXDOMAIN, no answer: a Service with no ready pod)
is the empty set. A failed resolution (timeout, SERVFAIL, no server answering) announces
nothing: the engines found last stay, since a DNS outage is no reason to drain the fleet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver

from discovery.endpoints import Endpoint, EngineSet, base_url
from discovery.options import DnsOptions

log = logging.getLogger("kvroute.discovery")

# Answers that mean "no such records": the set is empty. Anything else failed: keep the last.
EMPTY = (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer)
FAILED = (dns.exception.DNSException,)


def _nameserver(address: str) -> dns.nameserver.Nameserver:
    host, sep, port = address.rpartition(":")
    if sep and port.isdigit() and (host.startswith("[") or ":" not in host):
        return dns.nameserver.Do53Nameserver(host.strip("[]"), int(port))
    return dns.nameserver.Do53Nameserver(address.strip("[]"))


class DnsSource:
    """Resolves the name every ``interval`` seconds; each successful answer is a snapshot."""

    def __init__(self, options: DnsOptions) -> None:
        self.options = options
        self.resolver = dns.asyncresolver.Resolver(configure=not options.nameservers)
        if options.nameservers:
            self.resolver.nameservers = [_nameserver(a) for a in options.nameservers]
        self.resolutions = 0  # successful ones
        self.failures = 0

    async def snapshots(self) -> AsyncGenerator[EngineSet, None]:
        while True:
            # The resolution runs as a task of its own: dnspython waits with asyncio.wait_for,
            # which on Python 3.11 can swallow a cancellation that lands as its answer
            # arrives, and a source must stop when it is closed.
            resolution = asyncio.ensure_future(self.resolve())
            resolution.add_done_callback(_retrieve)
            try:
                await asyncio.wait({resolution})
            finally:
                resolution.cancel()
            try:
                found = resolution.result()
            except FAILED as exc:
                self.failures += 1
                log.warning("DNS discovery: resolution failed; keeping the engines found last",
                            extra={"dns_name": self.options.name, "error": repr(exc)})
            else:
                self.resolutions += 1
                yield found
            await asyncio.sleep(self.options.interval)

    async def resolve(self) -> dict[str, Endpoint]:
        """The engine set the records give now; raises a DNSException when resolution failed."""
        port = self.options.port
        if isinstance(port, int):
            addresses = await self._addresses(self.options.name)
            return {_host_port(a, port): Endpoint(_host_port(a, port),
                                                  base_url(self.options.scheme, a, port))
                    for a in addresses}
        return await self._srv(f"_{port}._tcp.{self.options.name}")

    async def _query(self, name: str, rdtype: str) -> dns.resolver.Answer | None:
        try:
            return await self.resolver.resolve(name, rdtype, lifetime=self.options.timeout,
                                               search=False)
        except EMPTY:
            return None

    async def _addresses(self, name: str) -> list[str]:
        answers = await asyncio.gather(self._query(name, "A"), self._query(name, "AAAA"))
        return sorted({r.to_text() for answer in answers if answer is not None for r in answer})

    async def _srv(self, name: str) -> dict[str, Endpoint]:
        answer = await self._query(name, "SRV")
        if answer is None:
            return {}
        records = sorted({(r.target.to_text(), int(r.port)) for r in answer})
        # The server usually sends the targets' addresses along (kube-dns does): use them.
        known: dict[str, set[str]] = {}
        for rrset in answer.response.additional:
            if rrset.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
                known.setdefault(rrset.name.to_text(), set()).update(r.to_text() for r in rrset)
        missing = sorted({t for t, _ in records if t not in known})
        for target, addresses in zip(missing, await asyncio.gather(
                *(self._addresses(t) for t in missing)), strict=True):
            known[target] = set(addresses)
        labels = [t.split(".", 1)[0] for t, _ in records]
        found: dict[str, Endpoint] = {}
        for (target, port), label in zip(records, labels, strict=True):
            addresses = sorted(known.get(target, ()))
            if not addresses:
                continue  # a target without an address: not reachable yet
            # The pod's name (the target's first label) names the engine; a pod behind two
            # records of the name gets its port as well.
            name = label if labels.count(label) == 1 else f"{label}:{port}"
            found[name] = Endpoint(name, base_url(self.options.scheme, addresses[0], port))
        return found


def _retrieve(task: asyncio.Future[dict[str, Endpoint]]) -> None:
    """A resolution left behind by a closed source may still fail: its error is not news."""
    if not task.cancelled():
        task.exception()


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
