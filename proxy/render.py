"""Render canonical messages with the model's chat template, and build token-in prompts.

The proxy renders prompts itself (instead of letting the engine do it) so that a later turn can
reuse the engine's own token ids for the history it generated, and render only what is new.

Per-call work is kept proportional to what changed, not to the history:

- **Continuations** (:meth:`Renderer.continuation`) render a *window*: the leading system
  messages, the last message before our answer, our answer and the new messages. Chat templates
  render each turn from its neighbours (the tiny model's, Qwen's, Llama's), so the window's
  rendering of the new messages equals the full conversation's. A template whose rendering of
  a turn depends on turns further back would break that, so in ``auto`` mode the first
  :data:`VERIFIED_WINDOWS` windowed results are compared with a full rendering; one mismatch
  turns windows off for the renderer (logged, counted in ``stats``). ``verify`` compares every
  call (and answers with the full rendering), ``full`` never uses windows.
- The window's **head is a stand-in**: its system messages with one-character contents and only
  the first of the tools. A template renders the system prompt and the tools' JSON at the top,
  before any turn, so the text after the last message does not depend on them, and rendering
  a short head three times a call instead of a 30k-token one keeps the cost independent of the
  history. The stand-in is verified like the window (one mismatch turns it off, the window goes
  on with the real head).
- **First calls** (:meth:`Renderer.prompt_ids`) reuse the token ids of the rendered system
  prompt and tools, which every rollout of a run shares, when the rendered text is cut right
  after a special token (the tokenizer splits its input at special tokens, so the ids of the
  two sides concatenate); the split is checked against a full encoding on the first
  :data:`VERIFIED_WINDOWS` system prompts (in ``verify`` mode, on all of them), and one
  failure turns it off.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from proxy.canonical import Message
from proxy.chat_template import ChatTemplate, TemplateEngine
from schemas.errors import ConfigError

log = logging.getLogger(__name__)

VERIFIED_WINDOWS = 16  # windowed continuations checked against a full rendering in auto mode
HEAD_CACHE_SIZE = 16  # distinct system prompts + tools whose token ids are kept


class RenderMode(StrEnum):
    """How a continuation's new messages are rendered (see the module docstring)."""

    AUTO = "auto"  # windows, verified on the first calls
    VERIFY = "verify"  # windows compared with a full rendering on every call; full one used
    FULL = "full"  # always the full conversation, and first calls encoded in full


@dataclass
class RenderStats:
    """What the renderer did, for metrics and benchmarks."""

    stubbed: int = 0  # continuations rendered from a window with a stand-in head
    windowed: int = 0  # continuations rendered from a window
    full: int = 0  # continuations rendered from the whole conversation
    window_checks: int = 0  # windows compared with a full rendering
    window_mismatches: int = 0  # windows whose result differed from the full rendering
    stub_mismatches: int = 0  # stand-in heads whose result differed from the full rendering
    head_hits: int = 0  # first calls that reused a cached system prompt's ids
    head_misses: int = 0
    head_checks: int = 0  # first calls whose split encoding was compared with a full one


def leading_system(messages: list[Message]) -> int:
    """Number of leading system messages: a harness's system prompt, shared by unrelated threads
    (so no evidence that two calls belong to one)."""
    n = 0
    while n < len(messages) and messages[n].get("role") == "system":
        n += 1
    return n


class Renderer:
    """A chat template and tokenizer, loaded from a model directory (``tokenizer_config.json``)."""

    def __init__(
        self,
        tokenizer_dir: Path,
        mode: RenderMode | str = RenderMode.AUTO,
        verify_first: int = VERIFIED_WINDOWS,
        engine: TemplateEngine | str = TemplateEngine.AUTO,
    ) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:  # pragma: no cover - the proxy extra installs it
            raise ConfigError(
                "the proxy needs transformers: pip install 'openforge[proxy]'"
            ) from exc
        try:
            self._tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot load a tokenizer from {tokenizer_dir}: {exc}. Pass --tokenizer DIR "
                "(the model directory the upstream serves)."
            ) from exc
        if not self._tok.chat_template:
            raise ConfigError(f"the tokenizer in {tokenizer_dir} has no chat template")
        self.mode = RenderMode(mode)
        self.verify_first = verify_first
        self.eos_token: str = self._tok.eos_token or ""
        self.eos_token_id: int | None = self._tok.eos_token_id
        self.stats = RenderStats()
        self.template = ChatTemplate(self._tok, engine)
        self._windows_ok = self.mode is not RenderMode.FULL
        self._stubs_ok = self.mode is not RenderMode.FULL
        self._specials = sorted(
            {str(t) for t in self._tok.all_special_tokens if t}, key=len, reverse=True
        )
        self._heads: OrderedDict[str, list[int]] = OrderedDict()
        self._splits_ok = self.mode is not RenderMode.FULL
        # The Rust tokenizer under a fast tokenizer: the same ids without the Python wrapper's
        # per-call work (which dominates on the short texts of continuations). Decoding
        # goes through it only where the wrapper would not clean up spaces afterwards.
        self._backend = getattr(self._tok, "backend_tokenizer", None)
        self._backend_decodes = self._backend is not None and not getattr(
            self._tok, "clean_up_tokenization_spaces", False
        )

    def render(self, messages: list[Message], tools: list[dict[str, Any]], generation: bool) -> str:
        return self.template.render(messages, tools, generation)

    def encode(self, text: str) -> list[int]:
        if self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Text of ids with special tokens spelled out (for aligning with rendered text)."""
        if self._backend_decodes and self._backend is not None:
            return str(self._backend.decode(ids, skip_special_tokens=False))
        return str(self._tok.decode(ids, skip_special_tokens=False))

    def decode_text(self, ids: list[int]) -> str:
        """Text of ids as the harness sees it (special tokens dropped)."""
        if self._backend_decodes and self._backend is not None:
            return str(self._backend.decode(ids, skip_special_tokens=True))
        return str(self._tok.decode(ids, skip_special_tokens=True))

    def count(self, messages: list[Message], tools: list[dict[str, Any]]) -> int:
        return len(self.prompt_ids(messages, tools))

    # --- first calls: the shared system prompt's ids ---------------------------------------

    def _head_cut(self, messages: list[Message], tools: list[dict[str, Any]], text: str) -> int:
        """Where the rendering of the leading system messages (and tools) ends in ``text``, cut
        right after the last special token in it; 0 when there is no such point."""
        h = leading_system(messages)
        if h == 0 or h == len(messages):
            return 0
        try:
            head = self.render(messages[:h], tools, generation=False)
        except Exception:  # a template that cannot render the system turn alone
            return 0
        if not text.startswith(head):
            return 0
        ends = [head.rfind(s) + len(s) for s in self._specials if head.rfind(s) >= 0]
        return max(ends, default=0)

    def prompt_ids(self, messages: list[Message], tools: list[dict[str, Any]]) -> list[int]:
        """The prompt for ``messages`` (with the generation prompt), encoded in full except for a
        cached system prompt."""
        text = self.render(messages, tools, generation=True)
        cut = self._head_cut(messages, tools, text) if self._splits_ok else 0
        if cut == 0:
            return self.encode(text)
        key = text[:cut]
        head_ids = self._heads.get(key)
        if head_ids is not None:
            self._heads.move_to_end(key)
            self.stats.head_hits += 1
            return [*head_ids, *self.encode(text[cut:])]
        self.stats.head_misses += 1
        head_ids, rest = self.encode(key), self.encode(text[cut:])
        if self.mode is RenderMode.VERIFY or self.stats.head_checks < self.verify_first:
            self.stats.head_checks += 1
            full = self.encode(text)
            if full != [*head_ids, *rest]:
                if self.mode is RenderMode.AUTO:
                    self._splits_ok = False
                    self._heads.clear()
                    log.warning(
                        "this tokenizer does not split at special tokens: first calls are "
                        "encoded in full from now on (slower, still exact)"
                    )
                return full
        self._heads[key] = head_ids
        if len(self._heads) > HEAD_CACHE_SIZE:
            self._heads.popitem(last=False)
        return [*head_ids, *rest]

    # --- continuations ----------------------------------------------------------------------

    def _suffix(
        self,
        base_messages: list[Message],
        assistant: Message,
        completion_ids: list[int],
        new: list[Message],
        tools: list[dict[str, Any]],
    ) -> list[int] | None:
        base_prompt = self.render(base_messages, tools, generation=True)
        with_assistant = self.render([*base_messages, assistant], tools, generation=False)
        full = self.render([*base_messages, assistant, *new], tools, generation=True)
        if not (with_assistant.startswith(base_prompt) and full.startswith(with_assistant)):
            return None
        rendered_turn = with_assistant[len(base_prompt) :]
        # What the template puts after the generated tokens: from the end-of-turn token on.
        generated = self.decode(completion_ids)
        if rendered_turn.startswith(generated):
            gap = rendered_turn[len(generated) :]
        elif self.eos_token and self.eos_token in rendered_turn:
            cut = rendered_turn.rfind(self.eos_token)
            ends_with_eos = bool(completion_ids) and completion_ids[-1] == self.eos_token_id
            gap = rendered_turn[cut + (len(self.eos_token) if ends_with_eos else 0) :]
        else:
            return None
        return self.encode(gap + full[len(with_assistant) :])

    def continuation(
        self,
        base_messages: list[Message],
        assistant: Message,
        completion_ids: list[int],
        messages: list[Message],
        tools: list[dict[str, Any]],
    ) -> list[int] | None:
        """Tokens that follow ``base prompt + completion`` to make the prompt for ``messages``.

        ``messages`` must extend ``base_messages + [assistant]``. Returns None when the template
        does not render the longer conversation as an extension of the shorter one (templates
        that rewrite earlier turns), so the caller falls back to rendering in full.
        """
        new = messages[len(base_messages) + 1 :]
        h = leading_system(base_messages)
        window = [*base_messages[:h], *base_messages[max(h, len(base_messages) - 1) :]]
        # Cheapest first: the window with a stand-in head, the window, the whole conversation.
        candidates: list[tuple[str, list[Message], list[dict[str, Any]]]] = []
        if self._stubs_ok and (h or tools):
            candidates.append(("stubbed", [*_stub_head(window[:h]), *window[h:]], tools[:1]))
        if self._windows_ok and len(window) < len(base_messages):
            candidates.append(("windowed", window, tools))
        checking = self.mode is RenderMode.VERIFY or self.stats.window_checks < self.verify_first
        if candidates and not checking:
            kind, msgs, kind_tools = candidates[0]
            try:
                out = self._suffix(msgs, assistant, completion_ids, new, kind_tools)
            except Exception:  # a template that cannot render the stand-in head after all
                self._mismatch(kind, force=True)
                return self.continuation(base_messages, assistant, completion_ids, messages, tools)
            if out is not None:
                setattr(self.stats, kind, getattr(self.stats, kind) + 1)
            return out
        self.stats.full += 1
        full = self._suffix(base_messages, assistant, completion_ids, new, tools)
        if not candidates:
            return full
        self.stats.window_checks += 1
        for kind, msgs, kind_tools in candidates:
            try:
                same = self._suffix(msgs, assistant, completion_ids, new, kind_tools) == full
            except Exception:  # a template that cannot render the stand-in head
                same = False
            if not same:
                self._mismatch(kind)
        return full

    def _mismatch(self, kind: str, force: bool = False) -> None:
        """A cheaper rendering differed from the full one (or failed, ``force``): stop using it
        (in auto mode; always when it failed)."""
        if kind == "stubbed":
            self.stats.stub_mismatches += 1
            if self.mode is RenderMode.AUTO or force:
                self._stubs_ok = False
                log.warning(
                    "this chat template renders a turn differently with another system prompt "
                    "or tools: continuations render the real ones from now on (slower, exact)"
                )
            return
        self.stats.window_mismatches += 1
        if self.mode is RenderMode.AUTO or force:
            self._windows_ok = False
            self._stubs_ok = False
            log.warning(
                "this chat template renders a turn differently without the turns before "
                "it: continuations are rendered in full from now on (slower, still exact)"
            )


STUB_TEXT = "."  # the content of a stand-in system message


def _stub_head(head: list[Message]) -> list[Message]:
    """Stand-ins for the leading system messages: same roles, a one-character content."""
    return [{**m, "content": STUB_TEXT} for m in head]
