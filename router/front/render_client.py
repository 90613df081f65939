"""Remote render: the router asks a `kvroute render` service (over httpx) instead of rendering."""

from __future__ import annotations

import httpx
import msgspec

from render.protocol import GenerateRequest
from serving.errors import APIError, ServiceUnavailableError


class _ErrorBody(msgspec.Struct):
    message: str = "render service error"
    type: str = "BadRequestError"
    param: str | None = None


class _Error(msgspec.Struct):
    error: _ErrorBody


class RenderClient:
    """Forwards the client's JSON body unchanged; a render error comes back as
    the APIError it answered."""

    def __init__(self, base_url: str, timeout: float = 60.0) -> None:
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout)
        self._one = msgspec.json.Decoder(GenerateRequest)
        self._many = msgspec.json.Decoder(list[GenerateRequest])
        self._error = msgspec.json.Decoder(_Error)

    async def close(self) -> None:
        await self._http.aclose()

    async def _post(self, path: str, body: bytes) -> bytes:
        try:
            resp = await self._http.post(
                path, content=body, headers={"content-type": "application/json"}
            )
        except httpx.HTTPError as exc:
            raise ServiceUnavailableError(f"render service unreachable: {exc}") from exc
        if resp.status_code != 200:
            try:
                err = self._error.decode(resp.content).error
            except msgspec.DecodeError:
                err = _ErrorBody(resp.text[:500] or "render service error")
            # A render 5xx is the render service's fault, not the client's: surface it as 502.
            status = resp.status_code if resp.status_code < 500 else 502
            raise APIError(status, err.message, err.type, err.param)
        return resp.content

    async def render_chat(self, body: bytes) -> GenerateRequest:
        return self._one.decode(await self._post("/v1/chat/completions/render", body))

    async def render_completion(self, body: bytes) -> list[GenerateRequest]:
        return self._many.decode(await self._post("/v1/completions/render", body))
