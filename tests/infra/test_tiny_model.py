"""The tiny model builder: reproducible bytes and a usable tool chat template."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from infra.tiny_model import build_tiny_model, directory_digest


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a = directory_digest(build_tiny_model(tmp_path / "a", seed=3))
    b = directory_digest(build_tiny_model(tmp_path / "b", seed=3))
    c = directory_digest(build_tiny_model(tmp_path / "c", seed=4))
    assert a == b
    assert a != c


def test_chat_template_renders_tools_and_tool_calls(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    tools = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "shell", "arguments": '{"cmd": "ls"}'}}
            ],
        },
        {"role": "tool", "content": "a.txt"},
    ]
    text = tok.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert '<tools>\n{"type": "function"' in text
    assert '<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n</tool_call>' in text
    assert "<tool_response>\na.txt\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    # The markers are single tokens, as the hermes tool parser expects.
    for marker in ("<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>"):
        assert len(tok.encode(marker, add_special_tokens=False)) == 1
