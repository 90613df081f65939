"""LoRA endpoints of the router: vLLM's runtime load and unload, and the models list with adapters.

    POST /v1/load_lora_adapter    {"lora_name", "lora_path", "load_inplace"?, "is_3d_lora_weight"?}
    POST /v1/unload_lora_adapter  {"lora_name", "lora_int_id"?}
    GET  /v1/models               the base models, then the adapters (parent: base, root: path)

The two POSTs exist only with VLLM_ALLOW_RUNTIME_LORA_UPDATING (RouterConfig
.allow_runtime_lora_updating), as in vLLM; they answer vLLM's plain-text success line or its
error JSON (router/routing/adapters.py).
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from render.protocol import decode_request
from render.service.server import model_card, model_cards, models_body
from router.front.state import router_state
from serving.body import json_response, read_body

MAX_BODY = 64 * 1024


class LoadLoRAAdapterRequest(msgspec.Struct):
    lora_name: str
    lora_path: str
    load_inplace: bool = False
    is_3d_lora_weight: bool = False


class UnloadLoRAAdapterRequest(msgspec.Struct):
    lora_name: str
    lora_int_id: int | None = None  # accepted, as by vLLM, and not used


_LOAD = msgspec.json.Decoder(LoadLoRAAdapterRequest)
_UNLOAD = msgspec.json.Decoder(UnloadLoRAAdapterRequest)


async def load_lora_adapter(request: Request) -> Response:
    st = router_state(request.scope["state"])
    req = decode_request(_LOAD, await read_body(request, MAX_BODY))
    message = await st.adapters.load(req.lora_name, req.lora_path,
                                     load_inplace=req.load_inplace,
                                     is_3d_lora_weight=req.is_3d_lora_weight)
    return Response(message, status_code=200)


async def unload_lora_adapter(request: Request) -> Response:
    st = router_state(request.scope["state"])
    req = decode_request(_UNLOAD, await read_body(request, MAX_BODY))
    return Response(await st.adapters.unload(req.lora_name), status_code=200)


async def list_models(request: Request) -> Response:
    st = router_state(request.scope["state"])
    created = st.models.created
    default = st.models.registry.names()[0]
    cards = model_cards(st.render) + [
        model_card(lora.lora_name, created, lora.lora_path, lora.base_model_name or default,
                   None)
        for lora in st.adapters.by_name.values()]
    return json_response(st.render.codecs.encoder, models_body(cards))
