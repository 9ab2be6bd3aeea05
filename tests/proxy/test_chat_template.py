"""The chat template engine: MiniJinja renders exactly what the tokenizer's own Jinja2 template
renders (text and token ids) on randomized conversations, and a template it renders differently
or cannot render is caught, at load or on the first calls, and Jinja2 renders from then on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from proxy.chat_template import VERIFIED_CALLS, ChatTemplate, TemplateEngine
from proxy.config import ProxyConfig
from schemas.errors import ConfigError

TEXT = st.text(alphabet="abc xyz\n\t{}\"'<>&✓é\\", max_size=30)
CALL = st.fixed_dictionaries(
    {
        "id": st.just("c"),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {
                "name": st.sampled_from(["bash", "read"]),
                "arguments": st.one_of(
                    TEXT, st.dictionaries(st.sampled_from("ab"), st.integers() | TEXT)
                ),
            }
        ),
    }
)
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": st.just("user"), "content": TEXT}),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": TEXT, "tool_calls": st.lists(CALL, max_size=2)}
    ),
    st.fixed_dictionaries({"role": st.just("tool"), "content": TEXT, "tool_call_id": st.just("c")}),
)
TOOL = st.builds(
    lambda name, desc: {
        "type": "function",
        "function": {"name": name, "description": desc, "parameters": {"type": "object"}},
    },
    st.sampled_from(["bash", "read", "édit"]),
    TEXT,
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


# The template's line that renders one message; the variants below edit it.
MESSAGE_LINE = "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"


def _variant(tiny_model_dir: Path, tmp: Path, old: str, new: str) -> Any:
    """The tiny model's tokenizer with its chat template edited."""
    template = (tiny_model_dir / "chat_template.jinja").read_text()
    assert old in template
    out = tmp / "tok"
    out.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(tiny_model_dir / name, out / name)
    (out / "chat_template.jinja").write_text(template.replace(old, new))
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return AutoTokenizer.from_pretrained(str(out))


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    system=st.one_of(st.none(), TEXT),
    first=TEXT,
    rest=st.lists(MESSAGE, max_size=8),
    tools=st.lists(TOOL, max_size=2),
    generation=st.booleans(),
)
def test_minijinja_renders_the_tokenizers_own_text_and_ids(
    tokenizer: Any,
    system: str | None,
    first: str,
    rest: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    generation: bool,
) -> None:
    fast = ChatTemplate(tokenizer, TemplateEngine.AUTO)
    own = ChatTemplate(tokenizer, TemplateEngine.JINJA2)
    assert fast.stats.engine == "minijinja", fast.stats.reason
    head = [{"role": "system", "content": system}] if system is not None else []
    messages = [*head, {"role": "user", "content": first}, *rest]
    text = fast._fast(messages, tools, generation)  # MiniJinja alone, not its checked path
    expected = own.render(messages, tools, generation)
    assert text == expected
    assert tokenizer.encode(text, add_special_tokens=False) == tokenizer.encode(
        expected, add_special_tokens=False
    )


def test_checked_calls_are_counted_and_then_minijinja_renders_alone(tokenizer: Any) -> None:
    engine = ChatTemplate(tokenizer)
    messages = [{"role": "user", "content": "hi"}]
    for _ in range(VERIFIED_CALLS + 5):
        engine.render(messages, [], True)
    assert engine.stats.engine == "minijinja"
    assert (engine.stats.checks, engine.stats.mismatches) == (VERIFIED_CALLS, 0)
    assert engine.stats.fast == VERIFIED_CALLS + 5 and engine.stats.slow == VERIFIED_CALLS


def test_a_template_minijinja_renders_differently_is_caught_at_load(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Python's ``str.title`` and MiniJinja's differ on "1x": the probes see it."""
    tok = _variant(
        tiny_model_dir,
        tmp_path,
        MESSAGE_LINE,
        "{{- '<|im_start|>' + message.role + '\\n' + ('1x ' ~ message.content).title() "
        "+ '<|im_end|>\\n' }}",
    )
    engine = ChatTemplate(tok)
    assert engine.stats.engine == "jinja2"
    assert "differently" in engine.stats.reason
    messages = [{"role": "user", "content": "hi"}]
    assert engine.render(messages, [], True) == tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert "1X Hi" in engine.render(messages, [], True)


def test_a_template_only_jinja2_can_render_is_caught_at_load(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tok = _variant(
        tiny_model_dir,
        tmp_path,
        MESSAGE_LINE,
        "{{- '<|im_start|>' + message.role + '\\n' + message.content.zfill(3) + '<|im_end|>\\n' }}",
    )
    engine = ChatTemplate(tok)
    assert engine.stats.engine == "jinja2"
    assert "zfill" in engine.stats.reason
    assert "<|im_start|>user\n0hi" in engine.render([{"role": "user", "content": "hi"}], [], True)


def test_a_difference_the_probes_miss_is_caught_on_a_call_and_the_call_gets_jinja2s_text(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The difference shows only past 8 messages (no probe is that long)."""
    tok = _variant(
        tiny_model_dir,
        tmp_path,
        "{%- if add_generation_prompt %}",
        "{%- if messages|length > 8 %}{{- ('1x').title() }}{%- endif %}\n"
        "{%- if add_generation_prompt %}",
    )
    engine = ChatTemplate(tok)
    assert engine.stats.engine == "minijinja"
    short = [{"role": "user", "content": "hi"}]
    long = short * 9
    engine.render(short, [], True)
    text = engine.render(long, [], True)
    assert "1X" in text  # Jinja2's, not MiniJinja's "1x"
    assert engine.stats.engine == "jinja2" and engine.stats.mismatches == 1
    assert engine.render(long, [], True) == text


def test_a_templates_own_error_is_raised_as_jinja2_raises_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tok = _variant(
        tiny_model_dir,
        tmp_path,
        "{%- elif message.role == 'tool' %}",
        "{%- elif message.role == 'oops' %}{{ raise_exception('no oops here') }}\n"
        "{%- elif message.role == 'tool' %}",
    )
    engine = ChatTemplate(tok)
    assert engine.stats.engine == "minijinja"
    with pytest.raises(Exception, match="no oops here") as raised:
        engine.render([{"role": "oops", "content": "x"}], [], True)
    assert type(raised.value).__module__.startswith("jinja2")
    assert engine.stats.fallbacks == 1


def test_the_engine_is_checked_when_the_config_is_built() -> None:
    with pytest.raises(ConfigError, match="template_engine"):
        ProxyConfig(upstream_url="http://x", template_engine="minijinj")  # type: ignore[arg-type]
    assert ProxyConfig(upstream_url="http://x", template_engine="jinja2").template_engine is (
        TemplateEngine.JINJA2
    )
