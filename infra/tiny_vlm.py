"""Build a tiny vision-language model locally, for vLLM on CPU (no model hub).

The architecture is Idefics3's (SmolVLM's): a SigLIP-style vision tower, a pixel-shuffle
connector and a Llama text model, here ~0.5 M parameters with random weights, over the tiny
model's tokenizer (:mod:`infra.tiny_model`) with the image tokens added, and its processor's
config (Idefics3's image processor, which vLLM's transformers runs with PIL). Each image becomes
one 64x64 tile (no splitting): ``<image>`` in a prompt is expanded to
``<fake_token_around_image><global-img>`` + 4 ``<image>`` tokens + ``<fake_token_around_image>``.

Why Idefics3: vLLM 0.32's Qwen2-VL, Qwen2.5-VL, LLaVA and Gemma 3 modules import image
processors of transformers that need torchvision, which the CPU vLLM environment leaves out (its
wheels pin another torch); Idefics3's has a PIL fallback, and vLLM serves it on CPU with images
(``tests/infra/test_tiny_vlm.py``).

    build_tiny_vlm(Path("models/tiny-vlm"), text_dir=Path("models/tiny"))
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from infra.tiny_model import build_once
from schemas.errors import SetupError

IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<global-img>"]
STAMP = "openforge-tiny-vlm.json"


@dataclass(frozen=True)
class TinyVLMSpec:
    """Architecture of the tiny VLM: one ``image_size`` tile per image, ``patch_size`` patches,
    merged ``scale_factor`` x ``scale_factor`` by the connector."""

    image_size: int = 64
    patch_size: int = 16
    scale_factor: int = 2
    vision_hidden_size: int = 64
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 4096

    @property
    def image_seq_len(self) -> int:
        """``<image>`` tokens per image in a prompt."""
        return (self.image_size // self.patch_size) ** 2 // self.scale_factor**2


def build_tiny_vlm(
    out_dir: Path, text_dir: Path, seed: int = 0, spec: TinyVLMSpec | None = None
) -> Path:
    """Build (or reuse) the tiny VLM in ``out_dir`` over the tokenizer in ``text_dir`` (the tiny
    model's); returns ``out_dir``. A directory stamped with the same seed, spec and tokenizer is
    reused (:func:`infra.tiny_model.build_once`)."""
    spec = spec or TinyVLMSpec()
    tokenizer = json.loads((text_dir / "tokenizer.json").read_text())
    stamp = {"seed": seed, "spec": asdict(spec), "vocab": len(tokenizer["model"]["vocab"])}

    def build() -> None:
        shutil.rmtree(out_dir, ignore_errors=True)
        _build(out_dir, text_dir, spec, seed)

    return build_once(out_dir, STAMP, stamp, build)


def _build(out_dir: Path, text_dir: Path, spec: TinyVLMSpec, seed: int) -> None:
    try:
        import torch
        from transformers import AutoTokenizer, Idefics3Config, Idefics3ForConditionalGeneration
    except ImportError as exc:
        raise SetupError(
            "building the tiny VLM needs the trainer extra: pip install 'openforge[trainer]'"
        ) from exc
    tokenizer = AutoTokenizer.from_pretrained(str(text_dir))
    special = ["<|im_start|>", "<|im_end|>", *IMAGE_TOKENS]  # the tiny model's, then the images'
    tokenizer.add_special_tokens({"additional_special_tokens": special})

    def token(name: str) -> int:
        found = tokenizer.convert_tokens_to_ids(name)
        assert isinstance(found, int), (name, found)
        return found

    pad = token("<|endoftext|>")
    config = Idefics3Config(
        vision_config=_vision_config(spec),
        text_config=_text_config(spec, len(tokenizer), pad, token("<|im_end|>")),
        image_token_id=token("<image>"),
        scale_factor=spec.scale_factor,
        tie_word_embeddings=True,
        pad_token_id=pad,
    )
    torch.manual_seed(seed)
    Idefics3ForConditionalGeneration(config).save_pretrained(str(out_dir))  # float32
    tokenizer.save_pretrained(str(out_dir))
    shutil.copyfile(text_dir / "chat_template.jinja", out_dir / "chat_template.jinja")
    # The processor's config as transformers writes it (written here: this environment's
    # transformers will not build the PIL image processor without torchvision; vLLM's does).
    (out_dir / "processor_config.json").write_text(json.dumps(_processor_config(spec), indent=2))


def _text_config(spec: TinyVLMSpec, vocab: int, pad: int, eos: int) -> dict[str, object]:
    return {
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": True,
        "bos_token_id": pad,
        "eos_token_id": eos,
        "pad_token_id": pad,
    }


def _vision_config(spec: TinyVLMSpec) -> dict[str, object]:
    return {
        "hidden_size": spec.vision_hidden_size,
        "intermediate_size": 2 * spec.vision_hidden_size,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": spec.image_size,
        "patch_size": spec.patch_size,
    }


def _processor_config(spec: TinyVLMSpec) -> dict[str, object]:
    return {
        "processor_class": "Idefics3Processor",
        "image_seq_len": spec.image_seq_len,
        "image_processor": {
            "image_processor_type": "Idefics3ImageProcessor",
            "do_convert_rgb": True,
            "do_resize": True,
            "size": {"longest_edge": spec.image_size},
            "max_image_size": {"longest_edge": spec.image_size},
            "do_image_splitting": False,
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "do_pad": True,
            "resample": 1,
        },
    }
