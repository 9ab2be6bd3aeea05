"""What harnesses ask about the model: the model list, and Anthropic's token counting.

    GET  /v1/models                 the upstream model, in the caller's dialect
    POST /v1/messages/count_tokens  prompt tokens of a Messages body, as rendered here

Both also under ``/rollout/{rollout_id}``; they are attributed like calls but record nothing.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.attribution import attribute, read_body
from proxy.dialects.registry import DIALECTS, dialect_for
from proxy.state import ProxyState
from schemas.enums import Dialect


async def models(state: ProxyState, request: Request) -> Response:
    if not (request.path_params.get("rollout_id") or state.config.open_mode):
        attribute(state, request)
    dialect = dialect_for(request.url.path, request.headers)
    return JSONResponse(dialect.models_body(state.upstream.model, state.max_model_len))


async def count_tokens(state: ProxyState, request: Request) -> Response:
    attribute(state, request)
    body = await read_body(state, request)
    body.setdefault("max_tokens", 1)
    req = DIALECTS.get(Dialect.MESSAGES).parse(body)
    return JSONResponse({"input_tokens": state.renderer.count(req.messages, req.tools)})
