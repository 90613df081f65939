"""The static source: a fixed list of engine URLs from the config, announced once."""

from __future__ import annotations

import asyncio
import re
import urllib.parse
from collections.abc import AsyncGenerator

from discovery.endpoints import Endpoint, EngineSet, base_url
from discovery.options import SCHEMES, StaticOptions

NAME = re.compile(r"[A-Za-z0-9[][A-Za-z0-9._:[\]-]{0,127}")


def parse_entry(entry: str) -> Endpoint:
    """``http://HOST:PORT`` (named ``HOST:PORT``) or ``NAME=http://HOST:PORT``."""
    name, sep, url = entry.partition("=")
    if not sep or "://" in name:
        name, url = "", entry
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in SCHEMES or not parts.hostname or port is None \
            or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{entry!r}: expected [NAME=]http://HOST:PORT")
    endpoint_url = base_url(parts.scheme, parts.hostname, port)
    name = name or endpoint_url.split("://", 1)[1]
    if not NAME.fullmatch(name):
        raise ValueError(f"{entry!r}: a name is 1-128 letters, digits, '.', '_', ':', '-' or "
                         "brackets")
    return Endpoint(name, endpoint_url)


class StaticSource:
    """Announces its list once, then holds it for as long as it runs."""

    def __init__(self, options: StaticOptions) -> None:
        self.engines = {e.name: e for e in map(parse_entry, options.urls)}

    async def snapshots(self) -> AsyncGenerator[EngineSet, None]:
        yield dict(self.engines)
        await asyncio.Event().wait()  # nothing changes until the source is closed
