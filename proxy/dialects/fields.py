"""Field checks shared by the dialect parsers: each failure is a 400 naming the field."""

from __future__ import annotations

from typing import Any

from proxy.errors import ProxyError
from schemas.completion import SamplingParams


def require(cond: bool, message: str, param: str | None = None) -> None:
    """Raise a 400 ProxyError with ``message`` (about ``param``) unless ``cond`` holds."""
    if not cond:
        raise ProxyError(400, message, param=param)


INT64 = (-(2**63), 2**63 - 1)


def number(
    body: dict[str, Any],
    name: str,
    kind: type = float,
    low: float | None = None,
    high: float | None = None,
) -> Any:
    """An optional numeric field, type-checked (bools are not numbers) and range-checked:
    integers within int64 (the records' type) and ``[low, high]``, floats finite."""
    value = body.get(name)
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        ok = ok and (isinstance(value, int) or value.is_integer())
    require(ok, f"'{name}' must be a {'integer' if kind is int else 'number'}", name)
    lo, hi = INT64 if kind is int else (-1.7e308, 1.7e308)  # float: a finite float64
    lo, hi = max(lo, low) if low is not None else lo, min(hi, high) if high is not None else hi
    require(lo <= value <= hi, f"'{name}' must be from {lo} to {hi}, not {str(value)[:40]}", name)
    return kind(value)


def sampling_from(body: dict[str, Any], max_tokens_field: str) -> SamplingParams:
    """The sampling parameters of a body whose generation budget is ``max_tokens_field``."""
    stop = body.get("stop") if "stop" in body else body.get("stop_sequences")
    if isinstance(stop, str):
        stop = [stop]
    require(
        stop is None or (isinstance(stop, list) and all(isinstance(s, str) for s in stop)),
        "'stop' must be a string or a list of strings",
        "stop",
    )
    return SamplingParams(
        temperature=number(body, "temperature"),  # the engine checks its own ranges
        top_p=number(body, "top_p"),
        top_k=number(body, "top_k", int, low=-1),
        max_tokens=number(body, max_tokens_field, int, low=1),
        seed=number(body, "seed", int),
        stop=list(stop or []),
    )
