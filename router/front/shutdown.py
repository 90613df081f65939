"""The drain deadline: every request still open ends with OpenAI's error and its engine stops."""

from __future__ import annotations

from router.front.state import RouterState
from serving.errors import ShuttingDownError


async def cut_open_requests(st: RouterState) -> int:
    """Fail every unfinished engine stream of the open requests with a ShuttingDownError (a
    stream writes it as its error event, then [DONE]; a collected answer is that 503) and abort
    them on their engines. The outputs already received are still delivered first. Returns how
    many engine requests were cut."""
    error = ShuttingDownError(
        "The router is shutting down: this request was still running at the drain deadline.")
    cut: list[str] = []
    for routed in list(st.active.values()):
        for stream in routed.streams:
            if not stream.finished:
                stream.fail(error)
                cut.append(stream.request_id)
    if cut:
        st.router_metrics.aborts.labels("shutdown").inc(len(cut))
        await st.client.abort(cut)  # their streams already failed: they stay failed
    return len(cut)
