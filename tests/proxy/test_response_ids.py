"""Response ids name their rollout (proxy.response_ids): any rollout id round-trips through
each dialect's id, ids are unique, and a string the proxy did not make names no rollout."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.dialects.registry import dialects
from proxy.response_ids import PREFIXES, response_id, rollout_of


@given(st.text(min_size=1, max_size=200), st.sampled_from(PREFIXES))
def test_a_rollout_id_round_trips_through_a_response_id(rollout_id: str, prefix: str) -> None:
    rid = response_id(prefix, rollout_id)
    assert rid.startswith(prefix) and rid.isascii() and rid.replace("-", "_").isidentifier()
    assert rollout_of(rid) == rollout_id
    assert response_id(prefix, rollout_id) != rid


@given(st.text(max_size=80))
def test_anything_else_names_no_rollout_or_decodes_cleanly(text: str) -> None:
    got = rollout_of(text)  # never raises
    assert got is None or isinstance(got, str)
    assert rollout_of("chatcmpl-" + "0" * 16) is None and rollout_of("resp_x") is None


def test_every_dialect_answers_with_an_id_the_proxy_can_read() -> None:
    assert {d.id_prefix for d in dialects()} == set(PREFIXES)
