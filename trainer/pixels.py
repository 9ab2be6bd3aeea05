"""The pixels of a sample's images, for a vision-language policy's forward pass.

A sample with images holds only their placeholder tokens and their hashes (``Sample.image_ids``);
the trainer reads each image back from the proxy's image store (:mod:`infra.image_store`) and
runs the model's own image processor on it, as the engine did, so the trainer's logprobs are
the engine's up to numerics (tests/trainer/test_cpu_vlm.py compares them on the real engine's
tokens). The processor is built from the model directory's ``processor_config.json`` with its
PIL implementation (no torchvision); Idefics3's is the one supported (``infra/tiny_vlm.py``).
"""

from __future__ import annotations

import importlib
import io
import json
from pathlib import Path
from typing import Any

import torch

from infra.image_store import ImageStore
from schemas.errors import ConfigError, SchemaError

PROCESSORS = {  # image_processor_type -> (module, PIL class)
    "Idefics3ImageProcessor": (
        "transformers.models.idefics3.image_processing_pil_idefics3",
        "Idefics3ImageProcessorPil",
    ),
}


def is_vision_model(model_dir: Path) -> bool:
    """Whether ``model_dir`` holds a vision-language model (its config has a vision tower)."""
    config = json.loads((model_dir / "config.json").read_text())
    return "vision_config" in config


class Pixels:
    """Pixel values of images by hash: read from ``store``, processed as ``model_dir``'s
    processor config says."""

    def __init__(self, model_dir: Path, store: ImageStore | None) -> None:
        path = model_dir / "processor_config.json"
        if not path.exists():
            raise ConfigError(f"{model_dir} has no processor_config.json: not a VLM directory")
        config = dict(json.loads(path.read_text())["image_processor"])
        kind = config.pop("image_processor_type", "")
        if kind not in PROCESSORS:
            raise ConfigError(
                f"{model_dir}'s image processor {kind!r} is not supported by the CPU trainer "
                f"(supported: {sorted(PROCESSORS)})"
            )
        module, name = PROCESSORS[kind]
        self._processor: Any = getattr(importlib.import_module(module), name)(**config)
        self.store = store

    def of(self, image_ids: list[str]) -> dict[str, torch.Tensor]:
        """``pixel_values`` and ``pixel_attention_mask`` of these images, in order, as one
        sample's model inputs."""
        from PIL import Image

        if self.store is None:
            raise ConfigError(
                "a sample has images but the trainer has no image store: pass the proxy's "
                "--image-dir (openforge train: the run's log/images)"
            )
        images = [Image.open(io.BytesIO(self.store.get(sha)[0])) for sha in image_ids]
        out = self._processor(images=[images], return_tensors="pt")
        return {
            "pixel_values": out["pixel_values"].float(),
            "pixel_attention_mask": out["pixel_attention_mask"],
        }


def merged_embeddings(
    model: Any, ids: torch.Tensor, prompt: torch.Tensor, pixels: dict[str, torch.Tensor]
) -> torch.Tensor:
    """A row's input embeddings as the engine built them (``ids``: ``[1, T]``; ``prompt``: which
    positions are prompt tokens, not generated): each token's own embedding, and the images'
    features in place of the prompt's image placeholder tokens. A placeholder token the model
    generated keeps its own embedding, as in vLLM, which expands only the images it was sent
    (the model's own merge would take it for an image and fail)."""
    vlm = model.get_base_model() if hasattr(model, "get_base_model") else model
    embeds = vlm.get_input_embeddings()(ids)
    features = vlm.model.get_image_features(
        pixels["pixel_values"], pixels["pixel_attention_mask"]
    ).pooler_output
    flat = features.reshape(-1, features.shape[-1]).to(embeds.dtype)
    slots = (ids == vlm.config.image_token_id) & prompt
    if int(slots.sum()) != flat.shape[0]:
        raise SchemaError(
            f"a sample's prompt holds {int(slots.sum())} image placeholder tokens but its "
            f"{pixels['pixel_values'].shape[1]} images give {flat.shape[0]}: its image_ids do "
            "not match its tokens (rebuild its episode from the events)"
        )
    merged: torch.Tensor = embeds.masked_scatter(slots.unsqueeze(-1).expand_as(embeds), flat)
    return merged
