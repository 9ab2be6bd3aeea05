"""Request bodies: the fast parser gives exactly the standard library's values, and what the
checks reject is rejected with the same 400, whichever parser read it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.bodies import MAX_DEPTH, parse_json
from proxy.errors import ProxyError

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(body=st.dictionaries(st.text(), JSON))
def test_bodies_parse_to_the_standard_librarys_values(body: dict[str, Any]) -> None:
    raw = json.dumps(body, ensure_ascii=False).encode()
    got = parse_json(raw)
    assert got == json.loads(raw)
    # Integers past 64 bits stay integers (orjson alone would read them as floats).
    assert json.dumps(got, ensure_ascii=False) == json.dumps(body, ensure_ascii=False)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"a": NaN}', "JSON numbers must be finite"),
        (b'{"a": 1e400}', "beyond a float64"),
        (b'{"a": "\\ud800"}', "not valid unicode"),
        (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), "nested deeper"),
        (b'{"a": ', "not valid JSON"),
    ],
)
def test_bad_bodies_get_the_same_400(raw: bytes, message: str) -> None:
    with pytest.raises(ProxyError) as info:
        parse_json(raw)
    assert info.value.status == 400 and message in str(info.value)


@pytest.mark.parametrize(
    "raw",
    [
        b"12345678901234567890123",
        b'"text"',
        b"1.5",
        b"null",
        b"[[1e300], {}]",
        b"-9223372036854775809",
    ],
)
def test_any_json_value_parses_to_the_standard_librarys(raw: bytes) -> None:
    """Scalars at the top too, and floats past 2**63 that really are floats."""
    got = parse_json(raw)
    assert got == json.loads(raw) and type(got) is type(json.loads(raw))
