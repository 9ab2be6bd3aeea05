"""Property tests of task.toml parsing: any valid settings (with unknown keys mixed in) read
back as written; a known key of a wrong type is refused with its field named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.tasks import parse_task_toml
from schemas.errors import TaskError

FILE = Path("/tasks/t/task.toml")
SECTIONS = ("metadata", "agent", "verifier", "environment")

# TOML basic strings take any character but surrogates; DEL must be escaped, which JSON doesn't.
TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x7f"), max_size=12)
SECONDS = st.integers(1, 10**6) | st.floats(1e-3, 1e6, allow_nan=False, allow_infinity=False)
STRINGS = st.lists(TEXT, max_size=4)
STRING_TABLE = st.dictionaries(TEXT, TEXT, max_size=3)
UNKNOWN = st.dictionaries(
    st.from_regex(r"x_[a-z]{1,6}", fullmatch=True),
    TEXT | st.integers(-(2**63), 2**63 - 1) | st.booleans() | STRINGS,
    max_size=2,
)

# Each known key: (a valid value, a value of a wrong type).
KNOWN: dict[str, dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]]] = {
    "": {"version": (TEXT, st.integers() | st.booleans() | STRINGS)},
    "metadata": {
        "author_name": (TEXT, st.integers() | STRINGS),
        "author_email": (TEXT, st.booleans()),
        "difficulty": (TEXT, st.integers()),
        "category": (TEXT, st.floats(allow_nan=False)),
        "tags": (STRINGS, TEXT | st.lists(st.integers(), min_size=1)),
    },
    "agent": {"timeout_sec": (SECONDS, TEXT | st.booleans() | st.integers(max_value=0))},
    "verifier": {
        "timeout_sec": (SECONDS, TEXT | st.booleans() | STRINGS),
        "env": (STRING_TABLE, st.dictionaries(TEXT, st.integers(), min_size=1)),
    },
    "environment": {
        "build_timeout_sec": (SECONDS, TEXT | st.booleans() | st.floats(max_value=0)),
        "docker_image": (TEXT, st.integers() | st.booleans()),
        "cpus": (st.integers(1, 512), TEXT | st.booleans() | st.floats(0.1, 0.9)),
        "memory_mb": (st.integers(1, 2**40), TEXT | st.integers(max_value=0)),
        "storage_mb": (st.integers(1, 2**40), st.booleans() | STRINGS),
        "gpus": (st.integers(0, 64), st.integers(max_value=-1) | TEXT),
        "gpu_types": (STRINGS, TEXT | st.lists(st.booleans(), min_size=1)),
        "allow_internet": (st.booleans(), st.integers() | TEXT),
        "env": (STRING_TABLE, st.dictionaries(TEXT, st.booleans(), min_size=1)),
        "workdir": (TEXT.map(lambda s: "/" + s), st.integers() | STRINGS),
    },
}


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    assert isinstance(value, dict)
    pairs = (f"{toml_value(str(k))} = {toml_value(v)}" for k, v in value.items())
    return "{" + ", ".join(pairs) + "}"


def render(doc: dict[str, Any]) -> str:
    """A task.toml: top-level keys, then one table per section."""
    lines = [f"{k} = {toml_value(v)}" for k, v in doc.items() if k not in SECTIONS]
    for section in SECTIONS:
        if section in doc:
            lines.append(f"[{section}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in doc[section].items()]
    return "\n".join(lines) + "\n"


def _section(name: str, pick: int) -> st.SearchStrategy[dict[str, Any]]:
    """Some of the section's known keys, valid (pick 0) or wrong (pick 1)."""
    return st.fixed_dictionaries({}, optional={k: v[pick] for k, v in KNOWN[name].items()})


@st.composite
def valid_documents(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {**draw(_section("", 0)), **draw(UNKNOWN)}
    for name in SECTIONS:
        if draw(st.booleans()):
            doc[name] = {**draw(_section(name, 0)), **draw(UNKNOWN)}
    return doc


def _plain(value: Any) -> Any:
    """A parsed value with read-only containers turned back into dicts and lists."""
    if hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


@given(valid_documents())
def test_valid_settings_read_back_as_written(doc: dict[str, Any]) -> None:
    settings = parse_task_toml(render(doc), FILE)
    top_known = set(KNOWN[""])
    assert _plain(settings["extra"]) == {
        k: v for k, v in doc.items() if k not in {*SECTIONS, *top_known}
    }
    if "version" in doc:
        assert settings["version"] == doc["version"]
    for name in SECTIONS:
        section = doc.get(name, {})
        parsed = settings[name]
        for key, value in section.items():
            if key in KNOWN[name]:
                got = _plain(getattr(parsed, key))
                assert got == value and type(got) is (float if "timeout" in key else type(value))
        unknown = {k: v for k, v in section.items() if k not in KNOWN[name]}
        assert _plain(parsed.extra) == unknown


FIELDS = [(section, key) for section, keys in KNOWN.items() for key in sorted(keys)]


@pytest.mark.parametrize(("section", "key"), FIELDS, ids=[f"{s or 'top'}.{k}" for s, k in FIELDS])
@settings(max_examples=30)
@given(data=st.data())
def test_a_wrong_type_is_refused_naming_the_field(
    section: str, key: str, data: st.DataObject
) -> None:
    """A valid document with one known key given a value of the wrong type."""
    doc = data.draw(valid_documents())
    wrong = data.draw(KNOWN[section][key][1], label="wrong value")
    if section:
        doc.setdefault(section, {})[key] = wrong
    else:
        doc[key] = wrong
    field = f"[{section}] {key}" if section else key
    with pytest.raises(TaskError) as err:
        parse_task_toml(render(doc), FILE)
    message = str(err.value)
    assert message.startswith(f"{FILE}: {field} must be "), message
