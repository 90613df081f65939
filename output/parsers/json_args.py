"""Forwarding a tool call's JSON arguments as the model writes them: the bytes of the scanned
arguments value past what was sent, and, when the call's JSON breaks, the raw rest of its body.
"""

from __future__ import annotations

from output.parsers.emit import Out
from output.parsers.jsonscan import Field, JsonScan


def forward_args(out: Out, call: int, buf: str, field: Field | None, sent: int,
                 open_end: int) -> int:
    """Send ``call`` the bytes of its arguments ``field`` known valid past ``sent`` (up to the
    value's end, else ``open_end``); returns how far they are sent now."""
    if field is None or field.start is None:
        return sent
    sent = max(sent, field.start)
    end = field.end if field.end is not None else open_end
    if end > sent:
        out.args(call, buf[sent:end])
        return end
    return sent


def forward_broken(out: Out, call: int, buf: str, field: Field | None, sent: int,
                   scan: JsonScan) -> int:
    """The JSON of an announced call broke: the raw rest of its body, from its arguments' start
    (else from where the scan stopped), is its arguments. Returns where the sent text ends in
    ``buf``."""
    start = field.start if field is not None and field.start is not None else scan.pos
    sent = forward_args(out, call, buf, field, max(sent, start), scan.open_end)
    cut = max(sent, scan.pos)
    out.args(call, buf[sent:cut])
    return cut
