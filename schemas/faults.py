"""Faults injected into rollouts on purpose, declared per run: which kinds, how often, the seed.

The proxy injects the model-server faults a harness meets in production, into the calls of a
rollout as the harness sees them (issue 53):

- ``http_500``, ``http_503``: the call is answered with that status before the engine is called;
- ``http_429``: a rate limit, with ``Retry-After``;
- ``stream_cut``: a streamed answer stops after ``cut_after_chunks`` chunks, the connection
  closed mid-stream (non-streamed calls are never cut);
- ``slow_first_byte``: the answer waits ``delay_s`` before its first byte, then comes whole.

Which call gets which fault is a function of the seed, the rollout id and the call's index only
(:meth:`FaultPlan.pick`), so a run replays with the same faults, and a clean run of the same
rollouts (no plan) pairs with it call for call. Each fault is transient: a retried call is a new
call, drawn again. The call a fault hit is recorded with it (``CompletionEvent.fault``), so an
injected fault is never taken for an infrastructure failure or for the agent's own error.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from schemas.errors import ConfigError
from schemas.registry import one_of


class FaultKind(StrEnum):
    """A fault the proxy injects into one call."""

    HTTP_500 = "http_500"
    HTTP_503 = "http_503"
    HTTP_429 = "http_429"
    STREAM_CUT = "stream_cut"
    SLOW_FIRST_BYTE = "slow_first_byte"


# The faults that answer a call with an error status instead of the engine's answer.
REFUSALS: Mapping[FaultKind, int] = {
    FaultKind.HTTP_500: 500,
    FaultKind.HTTP_503: 503,
    FaultKind.HTTP_429: 429,
}


@dataclass(frozen=True)
class FaultPlan:
    """Attributes:
    rates: the probability of each kind per call (their sum at most 1).
    seed: with the rollout id and the call index, decides every call's fault.
    retry_after_s: the ``Retry-After`` of an injected 429 and 503.
    cut_after_chunks: the chunks of a ``stream_cut`` answer sent before the cut.
    delay_s: the wait before the first byte of a ``slow_first_byte`` answer.
    """

    rates: Mapping[FaultKind, float] = field(default_factory=dict)
    seed: int = 0
    retry_after_s: int = 1
    cut_after_chunks: int = 2
    delay_s: float = 3.0

    def __post_init__(self) -> None:
        rates = {fault_kind(k): float(v) for k, v in self.rates.items()}
        for kind, rate in rates.items():
            if not 0.0 <= rate <= 1.0:
                raise ConfigError(f"the rate of fault {kind} must be in [0, 1], not {rate}")
        if sum(rates.values()) > 1.0 + 1e-9:
            raise ConfigError(
                f"the fault rates add up to {sum(rates.values()):g}: at most one fault per call, "
                "so their sum must be at most 1"
            )
        if self.retry_after_s < 0 or self.cut_after_chunks < 0 or self.delay_s < 0:
            raise ConfigError("retry_after_s, cut_after_chunks and delay_s must not be negative")
        object.__setattr__(self, "rates", rates)

    @property
    def active(self) -> bool:
        """Whether any call can get a fault."""
        return any(rate > 0 for rate in self.rates.values())

    def pick(self, rollout_id: str, call_index: int, streamed: bool) -> FaultKind | None:
        """The fault of call ``call_index`` of ``rollout_id`` (None: none). A uniform draw
        from the seed, the rollout id and the index falls in one kind's share of [0, 1), in
        the kinds' declared order; a ``stream_cut`` of a call that is not streamed is none."""
        digest = hashlib.sha256(f"{self.seed}\0{rollout_id}\0{call_index}".encode()).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        edge = 0.0
        for kind in FaultKind:
            edge += self.rates.get(kind, 0.0)
            if draw < edge:
                return None if kind is FaultKind.STREAM_CUT and not streamed else kind
        return None

    @classmethod
    def parse(cls, specs: Iterable[str], seed: int = 0) -> FaultPlan:
        """A plan from ``KIND=RATE`` strings (``--fault http_503=0.1``)."""
        rates: dict[FaultKind, float] = {}
        for spec in specs:
            name, _, value = spec.partition("=")
            kind = fault_kind(name.strip())
            try:
                rates[kind] = float(value)
            except ValueError:
                raise ConfigError(
                    f"--fault {spec!r}: write KIND=RATE, e.g. {kind}=0.1 (a probability per call)"
                ) from None
        return cls(rates, seed)


def fault_kind(name: str | FaultKind) -> FaultKind:
    """The kind named ``name``; an unknown name is a ConfigError that lists the kinds."""
    try:
        return FaultKind(name)
    except ValueError:
        raise ConfigError(f"unknown fault {name!r}: one of {one_of(FaultKind)}") from None
