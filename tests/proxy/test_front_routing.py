"""The pool's front sends what concerns an open-mode session's rollout (a reward, a finish by
rollout id) to the worker its calls went to: the worker of its session identity."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.front import _session_of

IDENTITY = st.text(alphabet="abcdef0123456789-_.", min_size=1, max_size=40).filter(
    lambda s: not s.rpartition(".")[2].isdigit()
)


@given(identity=IDENTITY, ms=st.integers(0, 2**42))
def test_a_sessions_rollouts_map_back_to_its_identity(identity: str, ms: int) -> None:
    assert _session_of(f"session-{identity}") == identity  # its first rollout
    assert _session_of(f"session-{identity}.{ms}") == identity  # a later one


def test_other_rollouts_have_no_session() -> None:
    assert _session_of(None) is None
    assert _session_of("ro-123") is None
