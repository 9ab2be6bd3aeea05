"""Faults injected into rollouts on purpose, declared per run: which kinds, how often, the seed.

The proxy injects the model-server faults a harness meets in production, into the calls of a
rollout as the harness sees them (issue 53):

- ``http_500``, ``http_503``: the call is answered with that status before the engine is called;
- ``http_429``: a rate limit, with ``Retry-After``;
- ``stream_cut``: a streamed answer stops after ``cut_after_chunks`` chunks, the connection
  closed mid-stream (non-streamed calls are never cut);
- ``slow_first_byte``: the answer waits ``delay_s`` before its first byte, then comes whole.

The rollout's sandbox injects the faults of the environment as the agent sees it, without
touching the harness (``orchestrator/sandbox_faults.py``):

- ``command_fails_once``: the first command of the rollout that bash runs (``bash -c`` or
  ``bash -lc``: the shell tool of the built-in agent, Codex and Claude Code) fails once, with
  ``Resource temporarily unavailable`` and exit code 126, before it runs; every later command
  runs. The rate is per rollout, not per call.

Which call gets which fault is a function of the seed, the rollout id and the call's index only
(:meth:`FaultPlan.pick`), and which rollout gets a sandbox fault of the seed and the rollout id
only (:meth:`FaultPlan.pick_rollout`), so a run replays with the same faults, and a clean run of
the same rollouts (no plan) pairs with it call for call. Each fault is transient: a retried call
is a new call, drawn again. The call a fault hit is recorded with it (``CompletionEvent.fault``),
and the command a sandbox fault hit with the rollout's end (:data:`SANDBOX_FAULTS`, a
:class:`SandboxFault` each), so an injected fault is never taken for an infrastructure failure
or for the agent's own error.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from schemas.errors import ConfigError
from schemas.registry import one_of


class FaultKind(StrEnum):
    """A fault injected on purpose: into one call (the proxy's) or one rollout (its sandbox's)."""

    HTTP_500 = "http_500"
    HTTP_503 = "http_503"
    HTTP_429 = "http_429"
    STREAM_CUT = "stream_cut"
    SLOW_FIRST_BYTE = "slow_first_byte"
    COMMAND_FAILS_ONCE = "command_fails_once"


# The faults drawn once per rollout and injected by its sandbox (the rest: per call, by the proxy).
ROLLOUT_FAULTS: frozenset[FaultKind] = frozenset({FaultKind.COMMAND_FAILS_ONCE})
_CALL_FAULTS: frozenset[FaultKind] = frozenset(FaultKind) - ROLLOUT_FAULTS

# ``RolloutEvent.metadata`` of a ``started`` event: the sandbox fault drawn for the attempt (its
# kind); of its ``verified`` event: the sandbox faults that fired in it, a JSON list of
# :meth:`SandboxFault.to_json` objects (``[]``: drawn, and it never fired).
SANDBOX_FAULT = "sandbox_fault"
SANDBOX_FAULTS = "sandbox_faults"


# The faults that answer a call with an error status instead of the engine's answer.
REFUSALS: Mapping[FaultKind, int] = {
    FaultKind.HTTP_500: 500,
    FaultKind.HTTP_503: 503,
    FaultKind.HTTP_429: 429,
}


@dataclass(frozen=True)
class FaultPlan:
    """Attributes:
    rates: the probability of each kind per call (the call kinds' sum at most 1), or per
        rollout for :data:`ROLLOUT_FAULTS` (the rollout kinds' sum at most 1).
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
        for level, kinds in (("call", _CALL_FAULTS), ("rollout", ROLLOUT_FAULTS)):
            total = sum(rate for kind, rate in rates.items() if kind in kinds)
            if total > 1.0 + 1e-9:
                raise ConfigError(
                    f"the {level} fault rates add up to {total:g}: at most one fault per "
                    f"{level}, so their sum must be at most 1"
                )
        if self.retry_after_s < 0 or self.cut_after_chunks < 0 or self.delay_s < 0:
            raise ConfigError("retry_after_s, cut_after_chunks and delay_s must not be negative")
        object.__setattr__(self, "rates", rates)

    @property
    def active(self) -> bool:
        """Whether any call can get a fault."""
        return any(rate > 0 for kind, rate in self.rates.items() if kind in _CALL_FAULTS)

    @property
    def in_sandbox(self) -> bool:
        """Whether any rollout can get a sandbox fault."""
        return any(rate > 0 for kind, rate in self.rates.items() if kind in ROLLOUT_FAULTS)

    def pick(self, rollout_id: str, call_index: int, streamed: bool) -> FaultKind | None:
        """The fault of call ``call_index`` of ``rollout_id`` (None: none). A uniform draw
        from the seed, the rollout id and the index falls in one kind's share of [0, 1), in
        the kinds' declared order; a ``stream_cut`` of a call that is not streamed is none."""
        kind = self._draw(f"{self.seed}\0{rollout_id}\0{call_index}", _CALL_FAULTS)
        return None if kind is FaultKind.STREAM_CUT and not streamed else kind

    def pick_rollout(self, rollout_id: str) -> FaultKind | None:
        """The sandbox fault of ``rollout_id`` (None: none), drawn as :meth:`pick` draws, from
        the seed and the rollout id only (a draw of its own, not any call's)."""
        return self._draw(f"{self.seed}\0{rollout_id}\0rollout", ROLLOUT_FAULTS)

    def _draw(self, key: str, kinds: frozenset[FaultKind]) -> FaultKind | None:
        draw = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
        edge = 0.0
        for kind in FaultKind:  # the declared order
            if kind in kinds:
                edge += self.rates.get(kind, 0.0)
                if draw < edge:
                    return kind
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


@dataclass(frozen=True)
class SandboxFault:
    """A sandbox fault that fired: its kind, when (microseconds since the Unix epoch) and the
    command it hit (as bash was given it)."""

    kind: FaultKind
    at_us: int
    command: str

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind.value, "at_us": self.at_us, "command": self.command}

    @staticmethod
    def dumps(faults: Iterable[SandboxFault]) -> str:
        """The value of :data:`SANDBOX_FAULTS`."""
        return json.dumps([f.to_json() for f in faults])

    @staticmethod
    def loads(text: str) -> list[SandboxFault]:
        """The faults a :data:`SANDBOX_FAULTS` value names; ValueError for anything else."""
        items = json.loads(text)
        if not isinstance(items, list):
            raise ValueError(f"{SANDBOX_FAULTS} must be a JSON list, not {text[:80]!r}")
        return [
            SandboxFault(FaultKind(i["kind"]), int(i["at_us"]), str(i["command"])) for i in items
        ]


def fault_kind(name: str | FaultKind) -> FaultKind:
    """The kind named ``name``; an unknown name is a ConfigError that lists the kinds."""
    try:
        return FaultKind(name)
    except ValueError:
        raise ConfigError(f"unknown fault {name!r}: one of {one_of(FaultKind)}") from None
