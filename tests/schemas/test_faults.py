"""The fault plan (``schemas.faults``): a call's fault is a function of the seed, the rollout and
the call only; each kind comes at about its rate; bad plans are refused with the fix."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.errors import ConfigError
from schemas.faults import ROLLOUT_FAULTS, FaultKind, FaultPlan, SandboxFault

rates = st.dictionaries(st.sampled_from(list(FaultKind)), st.floats(0, 0.2), max_size=5)


@given(rates, st.integers(0, 2**31), st.text(max_size=20), st.integers(0, 1000), st.booleans())
def test_a_calls_fault_depends_only_on_seed_rollout_and_call(
    r: dict[FaultKind, float], seed: int, rollout: str, index: int, streamed: bool
) -> None:
    plan = FaultPlan(r, seed)
    kind = plan.pick(rollout, index, streamed)
    assert kind == FaultPlan(dict(r), seed).pick(rollout, index, streamed)  # replays the same
    assert kind is None or r.get(kind, 0) > 0
    assert kind not in ROLLOUT_FAULTS  # a call never gets a sandbox fault
    if not streamed:
        assert kind is not FaultKind.STREAM_CUT  # only a stream can be cut


def test_each_kind_comes_at_about_its_rate() -> None:
    plan = FaultPlan({FaultKind.HTTP_503: 0.1, FaultKind.STREAM_CUT: 0.2}, seed=7)
    picks = [plan.pick(f"r{i % 50}", i // 50, True) for i in range(20_000)]
    assert abs(picks.count(FaultKind.HTTP_503) / len(picks) - 0.1) < 0.01
    assert abs(picks.count(FaultKind.STREAM_CUT) / len(picks) - 0.2) < 0.015
    assert picks.count(None) + picks.count(FaultKind.HTTP_503) + picks.count(
        FaultKind.STREAM_CUT
    ) == len(picks)
    other = FaultPlan(plan.rates, seed=8)  # another seed, other calls hit
    assert [other.pick(f"r{i}", 0, True) for i in range(200)] != picks[:200]


@pytest.mark.parametrize(
    ("specs", "said"),
    [
        (["http_418=0.1"], "unknown fault 'http_418': one of http_500"),
        (["http_503"], "write KIND=RATE, e.g. http_503=0.1"),
        (["http_503=lots"], "write KIND=RATE"),
        (["http_503=1.5"], r"must be in \[0, 1\]"),
        (["http_503=0.6", "stream_cut=0.6"], "add up to 1.2"),
    ],
)
def test_a_bad_fault_spec_says_how_to_write_it(specs: list[str], said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        FaultPlan.parse(specs)


def test_parse_reads_kinds_and_rates() -> None:
    plan = FaultPlan.parse(["http_429=0.25", "slow_first_byte=0.5"], seed=3)
    assert plan.rates == {FaultKind.HTTP_429: 0.25, FaultKind.SLOW_FIRST_BYTE: 0.5}
    assert plan.seed == 3 and plan.active
    assert not FaultPlan({FaultKind.HTTP_500: 0.0}).active


def test_a_rollouts_sandbox_fault_is_drawn_per_rollout_at_about_its_rate() -> None:
    plan = FaultPlan({FaultKind.COMMAND_FAILS_ONCE: 0.5, FaultKind.HTTP_503: 1.0}, seed=1)
    assert plan.active and plan.in_sandbox  # a call rate of 1 beside a rollout rate: both fit
    drawn = [plan.pick_rollout(f"r{i}") for i in range(2000)]
    assert 900 < drawn.count(FaultKind.COMMAND_FAILS_ONCE) < 1100
    assert drawn == [plan.pick_rollout(f"r{i}") for i in range(2000)]  # the same, replayed
    assert FaultPlan({FaultKind.COMMAND_FAILS_ONCE: 0.0}).pick_rollout("r") is None
    assert not FaultPlan({FaultKind.COMMAND_FAILS_ONCE: 1.0}).active  # nothing for the proxy
    with pytest.raises(ConfigError, match=r"command_fails_once must be in \[0, 1\]"):
        FaultPlan({FaultKind.COMMAND_FAILS_ONCE: 1.5})


@given(st.lists(st.tuples(st.integers(0, 2**62), st.text(max_size=200)), max_size=4))
def test_fired_sandbox_faults_read_back_as_written(items: list[tuple[int, str]]) -> None:
    faults = [SandboxFault(FaultKind.COMMAND_FAILS_ONCE, at, command) for at, command in items]
    assert SandboxFault.loads(SandboxFault.dumps(faults)) == faults
