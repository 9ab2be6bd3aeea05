"""Build a tiny Qwen2-style causal LM and a byte-level BPE tokenizer locally (no model hub).

Same seed, same bytes: the corpus, the tokenizer and the weights all derive from ``seed``. The
tokenizer carries a Qwen/hermes-style chat template with tools, so vLLM's ``hermes`` tool parser
and the proxy's renderer both work on it.

    build_tiny_model(Path("models/tiny"), seed=0)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from schemas.errors import SetupError

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
CHAT_TEMPLATE = (Path(__file__).with_name("chat_template.jinja")).read_text()

_WORDS = (
    "the a an of to and in is it you that for on with as are this be at or have from by not "
    "what all were we when your can said there use each which she do how their if will up other"
    " about out many then them these so some her would make like him into time has look two "
    "more write go see number no way could people my than first water been call who its now "
    "find long down day did get come made may part file read list run test code python function"
    " return print import def class self value name path data error result true false null none"
    " done hello world answer question task tool shell command output input json args bash echo"
    " cat ls "
).split()
_TOOLS = ["shell", "read_file", "write_file", "apply_patch", "list_dir", "search", "exec_command"]


def corpus_words() -> list[str]:
    """The words the tiny model's tokenizer was trained on (the most common are one token)."""
    return list(_WORDS)


@dataclass(frozen=True)
class TinyModelSpec:
    """Architecture of the tiny model. Defaults: ~0.4 M parameters, fast on one CPU core."""

    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 4096


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    """Generated text in the shapes the model will see: prose, chat turns, JSON tool calls."""
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(lines):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 16)))
        kind = i % 4
        if kind == 0:
            out.append(words.capitalize() + rng.choice([".", "?", "!", ":"]))
        elif kind == 1:
            role = rng.choice(["system", "user", "assistant"])
            out.append(f"<|im_start|>{role}\n{words}<|im_end|>\n")
        elif kind == 2:
            args = {rng.choice(_WORDS): rng.choice([*_WORDS, str(rng.randint(0, 999))])}
            call = {"name": rng.choice(_TOOLS), "arguments": args}
            out.append(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")
        else:
            out.append(f"{rng.choice(_WORDS)}_{rng.randint(0, 99)} = {words!r}  # {words[:20]}")
    return out


def _build_tokenizer(out_dir: Path, spec: TinyModelSpec, seed: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size - len(ADDED_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=spec.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )
    fast.add_tokens(ADDED_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


def _build_weights(out_dir: Path, spec: TinyModelSpec, seed: int, vocab_size: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
        dtype="float32",
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = Qwen2ForCausalLM(config)
    # The default init (std 0.02) gives near-uniform logits. An untied head with std 2/sqrt(d)
    # gives logits of std ~2 after the final RMSNorm: peaked enough to have shape, never one-hot.
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 2.0 / spec.hidden_size**0.5)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    GenerationConfig().save_pretrained(str(out_dir))


def build_tiny_model(out_dir: Path, seed: int = 0, spec: TinyModelSpec | None = None) -> Path:
    """Build (or reuse) the tiny model in ``out_dir``; returns ``out_dir``.

    A directory holding a ``openforge-tiny.json`` stamp with the same seed and spec is reused
    (:func:`build_once`).
    """
    spec = spec or TinyModelSpec()
    stamp = {"seed": seed, "spec": asdict(spec), "format": 1}
    return build_once(out_dir, "openforge-tiny.json", stamp, lambda: _build(out_dir, spec, seed))


def build_once(
    out_dir: Path, stamp_name: str, stamp: dict[str, object], build: Callable[[], None]
) -> Path:
    """``build()`` into ``out_dir`` unless it holds the stamp file ``stamp_name`` with ``stamp``;
    then the stamp is written. Processes building the same directory at once (the suite's
    workers) take turns on a lock file beside it: the first builds, the others reuse its work."""
    stamp_path = out_dir / stamp_name
    if _stamped(stamp_path, stamp):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f"{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _stamped(stamp_path, stamp):
            build()
            stamp_path.write_text(json.dumps(stamp, sort_keys=True))
    return out_dir


def _stamped(stamp_path: Path, stamp: dict[str, object]) -> bool:
    return stamp_path.exists() and json.loads(stamp_path.read_text()) == stamp


def _build(out_dir: Path, spec: TinyModelSpec, seed: int) -> None:
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise SetupError(
            "building the tiny model needs the trainer extra: pip install 'openforge[trainer]'"
        ) from exc
    out_dir.mkdir(parents=True, exist_ok=True)
    _build_tokenizer(out_dir, spec, seed)
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(str(out_dir)))
    _build_weights(out_dir, spec, seed, vocab_size=max(vocab, spec.vocab_size))


def directory_digest(path: Path) -> str:
    """sha256 over the names and bytes of every file in ``path`` (for reproducibility checks)."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()
