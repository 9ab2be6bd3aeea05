"""Anthropic Messages parsing."""

from __future__ import annotations

from proxy.dialects import messages


def test_messages_accepts_mid_conversation_system_messages() -> None:
    """Claude Code sends ``role: system`` items inside ``messages`` (environment context)."""
    req = messages.parse(
        {
            "model": "tiny",
            "max_tokens": 8,
            "system": [{"type": "text", "text": "You are an agent."}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "system", "content": [{"type": "text", "text": "cwd: /work"}]},
            ],
        }
    )
    assert [m["role"] for m in req.messages] == ["system", "user", "system"]
    assert req.messages[2]["content"] == "cwd: /work"
