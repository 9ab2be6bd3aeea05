"""Render canonical messages with the model's chat template, and build token-in prompts.

The proxy renders prompts itself (instead of letting the engine do it) so that a later turn can
reuse the engine's own token ids for the history it generated, and render only what is new.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from proxy.canonical import Message
from schemas.errors import ConfigError


class Renderer:
    """A chat template and tokenizer, loaded from a model directory (``tokenizer_config.json``)."""

    def __init__(self, tokenizer_dir: Path) -> None:
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
        self.eos_token: str = self._tok.eos_token or ""
        self.eos_token_id: int | None = self._tok.eos_token_id

    def render(self, messages: list[Message], tools: list[dict[str, Any]], generation: bool) -> str:
        text = self._tok.apply_chat_template(
            messages,
            tools=tools or None,  # type: ignore[arg-type]
            tokenize=False,
            add_generation_prompt=generation,
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Text of ids with special tokens spelled out (for aligning with rendered text)."""
        return str(self._tok.decode(ids, skip_special_tokens=False))

    def decode_text(self, ids: list[int]) -> str:
        """Text of ids as the harness sees it (special tokens dropped)."""
        return str(self._tok.decode(ids, skip_special_tokens=True))

    def count(self, messages: list[Message], tools: list[dict[str, Any]]) -> int:
        return len(self.encode(self.render(messages, tools, generation=True)))

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
        base_prompt = self.render(base_messages, tools, generation=True)
        with_assistant = self.render([*base_messages, assistant], tools, generation=False)
        full = self.render(messages, tools, generation=True)
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


@lru_cache(maxsize=8)
def renderer_for(tokenizer_dir: str) -> Renderer:
    return Renderer(Path(tokenizer_dir))


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
