"""The fields of the admin routes' JSON bodies, checked alike by every route
(:mod:`proxy.admin`, :mod:`proxy.rewards`, :mod:`proxy.phases`): a bad field is a 400 that
names it."""

from __future__ import annotations

import math
from typing import Any

from starlette.requests import Request

from proxy.attribution import read_body
from proxy.errors import ProxyError
from proxy.state import ProxyState


def opt_str(body: dict[str, Any], name: str) -> str | None:
    """``body[name]``: a string or absent (None); anything else is a 400."""
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise ProxyError(400, f"'{name}' must be a string", param=name)
    return value


def finite_number(value: object) -> bool:
    """A JSON number (not a bool) that is a finite float64."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an integer beyond float64
        return False


def str_map(body: dict[str, Any], name: str) -> dict[str, str]:
    """``body[name]``: an object (absent or null: empty), its keys and values as strings."""
    value = body.get(name) or {}
    if not isinstance(value, dict):
        raise ProxyError(400, f"'{name}' must be an object", param=name)
    return {str(k): str(v) for k, v in value.items()}


async def optional_body(state: ProxyState, request: Request) -> dict[str, Any]:
    """The admin request's JSON object; an empty body is ``{}``."""
    return await read_body(state, request, admin=True, optional=True)


async def body_of(state: ProxyState, request: Request) -> dict[str, Any]:
    """The admin request's JSON object, held to ``max_admin_body_bytes``."""
    return await read_body(state, request, admin=True)
