"""The chat template engine: the tokenizer's own (Jinja2, through transformers) or MiniJinja.

Rendering a chat template is on every call's path (a continuation renders its window three
times). transformers' ``apply_chat_template`` runs the template in Jinja2 behind a layer of
per-call Python; MiniJinja (Rust) renders the same template several times faster
(``bench/chat_template.py``). Jinja2 and MiniJinja are two implementations of one language
with known differences at the edges, so MiniJinja is used only where it renders exactly what
the tokenizer's own template renders:

- at load, a set of probe conversations (system prompt, tools, tool calls with string and
  object arguments, runs of tool results, non-ASCII text, with and without the generation
  prompt) is rendered by both; any difference, or an error only MiniJinja raises, keeps Jinja2;
- then the first :data:`VERIFIED_CALLS` renderings of real calls are compared too; one
  difference turns MiniJinja off for good (logged, counted in :class:`TemplateStats`), and the
  call gets Jinja2's text;
- a call MiniJinja fails on is rendered by Jinja2, which raises the template's own error where
  there is one (``raise_exception`` in a template), as without MiniJinja.

``TemplateEngine.JINJA2`` keeps the tokenizer's own path for every call.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from proxy.canonical import Message

log = logging.getLogger(__name__)

VERIFIED_CALLS = 16  # renderings of real calls compared with Jinja2's in auto mode


class TemplateEngine(StrEnum):
    """Which engine renders the chat template."""

    AUTO = "auto"  # MiniJinja where it renders as Jinja2 does (checked), Jinja2 otherwise
    JINJA2 = "jinja2"  # the tokenizer's own apply_chat_template on every call


@dataclass
class TemplateStats:
    """What the template engine did, for metrics and benchmarks."""

    engine: str = "jinja2"  # the engine rendering calls now
    fast: int = 0  # renderings by MiniJinja
    slow: int = 0  # renderings by Jinja2
    checks: int = 0  # MiniJinja renderings of real calls compared with Jinja2's
    mismatches: int = 0  # of those, the ones that differed (the first turns MiniJinja off)
    fallbacks: int = 0  # calls MiniJinja failed on, rendered by Jinja2
    reason: str = ""  # why Jinja2 renders, when it does


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson`` filter (not Jinja's, which escapes HTML characters)."""
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise ValueError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command ✓",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
}


def probe_conversations() -> list[tuple[list[Message], list[dict[str, Any]], bool]]:
    """Conversations both engines render at load: (messages, tools, generation prompt)."""
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    obj_call = {"id": "c2", "type": "function", "function": {"name": "bash", "arguments": {"a": 1}}}
    turns: list[Message] = [
        {"role": "system", "content": "You are an agent. Ünïcode ✓"},
        {"role": "user", "content": "  list files\n"},
        {"role": "assistant", "content": "", "tool_calls": [call, obj_call]},
        {"role": "tool", "content": "a\nb", "tool_call_id": "c1"},
        {"role": "tool", "content": '{"x": 1}', "tool_call_id": "c2"},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "again <b>&</b>"},
    ]
    return [
        (turns[1:2], [], True),
        (turns[:2], [], False),
        (turns, [], True),
        (turns, [_TOOL], True),
        (turns[:6], [_TOOL], False),
        (turns[1:], [], True),
    ]


class ChatTemplate:
    """Renders a tokenizer's chat template with the engine chosen as the module says."""

    def __init__(self, tokenizer: Any, engine: TemplateEngine | str = TemplateEngine.AUTO) -> None:
        self._tok = tokenizer
        self.engine = TemplateEngine(engine)
        self.stats = TemplateStats(
            reason="asked for" if self.engine is TemplateEngine.JINJA2 else ""
        )
        self._env: Any = None
        self._names: dict[str, str] = {}  # template text -> its name in the MiniJinja environment
        self._globals = {k: v for k, v in tokenizer.special_tokens_map.items()}
        if self.engine is TemplateEngine.AUTO:
            self._env = self._minijinja()
            if self._env is not None:
                self._probe()

    def render(self, messages: list[Message], tools: list[dict[str, Any]], generation: bool) -> str:
        """The template's text for ``messages`` (``generation``: with the generation prompt)."""
        if self._env is None:
            return self._slow(messages, tools, generation)
        try:
            text = self._fast(messages, tools, generation)
        except Exception as exc:
            self.stats.fallbacks += 1
            log.debug("MiniJinja failed on a call (%s); rendered by Jinja2", exc)
            return self._slow(messages, tools, generation)
        if self.stats.checks < VERIFIED_CALLS:
            self.stats.checks += 1
            expected = self._slow(messages, tools, generation)
            if expected != text:
                self.stats.mismatches += 1
                self._turn_off("a call rendered differently from the tokenizer's own template")
                return expected
        return text

    def _slow(self, messages: list[Message], tools: list[dict[str, Any]], generation: bool) -> str:
        self.stats.slow += 1
        text = self._tok.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation
        )
        return str(text)

    def _fast(self, messages: list[Message], tools: list[dict[str, Any]], generation: bool) -> str:
        template = self._tok.get_chat_template(None, tools or None)
        name = self._names.get(template)
        if name is None:
            name = f"chat{len(self._names)}"
            self._env.add_template(name, template)
            self._names[template] = name
        text = self._env.render_template(
            name,
            messages=messages,
            tools=tools or None,
            documents=None,
            add_generation_prompt=generation,
            **self._globals,
        )
        self.stats.fast += 1
        return str(text)

    def _minijinja(self) -> Any:
        """A MiniJinja environment set up as transformers sets up Jinja2, or None."""
        try:
            import minijinja
        except ImportError:
            self._turn_off("minijinja is not installed (pip install 'openforge[proxy]')")
            return None
        env = minijinja.Environment()
        env.trim_blocks = True
        env.lstrip_blocks = True
        env.add_filter("tojson", _tojson)
        env.add_global("raise_exception", _raise_exception)
        env.add_global("strftime_now", _strftime_now)
        self.stats.engine = "minijinja"
        return env

    def _probe(self) -> None:
        for messages, tools, generation in probe_conversations():
            try:
                expected = self._slow(messages, tools, generation)
            except Exception:
                continue
            try:
                text = self._fast(messages, tools, generation)
            except Exception as exc:
                self._turn_off(f"MiniJinja failed on a probe Jinja2 renders: {exc}")
                return
            if text != expected:
                self._turn_off("MiniJinja rendered a probe differently from Jinja2")
                return
        self.stats.fast = self.stats.slow = 0

    def _turn_off(self, reason: str) -> None:
        if self._env is not None:
            log.warning("chat template: Jinja2 renders from now on: %s", reason)
        self._env = None
        self.stats.engine = "jinja2"
        self.stats.reason = reason
