"""The veRL backend: veRL's own FSDP training engine (``TrainingWorker`` in SPMD mode).

Our episode batches become ``verl.DataProto`` (prompt/response split, response-aligned tensors),
then veRL's no-padding ``TensorDict``; the engine computes logprobs and runs the update with
veRL's ``ppo_loss`` (the policy loss we configure, our truncated-IS weights and rejection mask).

Configs are composed from veRL's own Hydra configs (``sft_trainer_engine``: ``model``, ``engine``,
``optim``, ``checkpoint``), so any veRL key can be overridden (``VerlConfig.overrides``).

On GPUs, launch one process per GPU with ``torchrun`` (see ``trainer/gpu_smoke.py``); without one,
a single process starts a one-rank group itself. Without a GPU the same engine runs on CPU through
:mod:`trainer.backends.verl_cpu_platform` (fp32, gloo), which is how it is tested here.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from infra.local.process import free_port
from schemas.errors import ConfigError
from trainer.algorithms import (
    AlgorithmConfig,
    actor_config,
    compute_advantages,
    rollout_correction,
)
from trainer.backends.base import TrainerBackend
from trainer.batch import ResponseLayout, TrainBatch, to_data_proto

_HF_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


@dataclass(frozen=True)
class VerlConfig:
    """The veRL engine's knobs (None: the device's default).

    Attributes:
        strategy: ``fsdp2`` (default) or ``fsdp``.
        lr: AdamW learning rate.
        lora_rank: 0 trains full weights; > 0 a LoRA adapter (veRL's peft integration).
        max_token_len_per_gpu: dynamic micro-batching budget (tokens per micro-batch).
        param_dtype: ``bf16`` on GPU, ``fp32`` on CPU.
        gradient_checkpointing: on for GPU, off for CPU.
        overrides: further veRL config overrides in Hydra syntax (``engine.fsdp_size=8``).
    """

    strategy: str = "fsdp2"
    lr: float = 1e-6
    lora_rank: int = 0
    max_token_len_per_gpu: int = 16384
    param_dtype: str | None = None
    gradient_checkpointing: bool | None = None
    overrides: tuple[str, ...] = field(default_factory=tuple)


def _ensure_process_group() -> None:
    """One process group per process: torchrun's, or a one-rank group of our own."""
    if dist.is_initialized():
        return
    if "RANK" not in os.environ:
        os.environ.update(
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
        )
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def _attention(gpu: bool) -> str:
    """flash-attention 2 where it is installed on a GPU machine, else PyTorch's SDPA."""
    import importlib.util

    return "flash_attention_2" if gpu and importlib.util.find_spec("flash_attn") else "sdpa"


def compose(model_dir: Path, cfg: VerlConfig) -> Any:
    """veRL's engine config for ``model_dir``, composed from its own Hydra configs."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    gpu = torch.cuda.is_available()
    dtype = cfg.param_dtype or ("bf16" if gpu else "fp32")
    checkpointing = gpu if cfg.gradient_checkpointing is None else cfg.gradient_checkpointing
    overrides = [
        f"model.path={model_dir}",
        "model.use_remove_padding=true",
        f"model.enable_gradient_checkpointing={str(checkpointing).lower()}",
        f"model.lora_rank={cfg.lora_rank}",
        f"+model.override_config.attn_implementation={_attention(gpu)}",
        f"engine.strategy={cfg.strategy}",
        f"engine.use_torch_compile={str(gpu).lower()}",
        f"+engine.mixed_precision={{param_dtype:{dtype},reduce_dtype:fp32,buffer_dtype:fp32}}",
        "+engine.use_dynamic_bsz=true",
        f"+engine.max_token_len_per_gpu={cfg.max_token_len_per_gpu}",
        f"+engine.infer_max_token_len_per_gpu={cfg.max_token_len_per_gpu}",
        f"optim.lr={cfg.lr}",
        "optim.lr_warmup_steps_ratio=0",
        "optim.total_training_steps=1000000",
        "checkpoint.save_contents=[model,optimizer,extra]",
        *cfg.overrides,
    ]
    GlobalHydra.instance().clear()
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="sft_trainer_engine", overrides=overrides)


class VerlBackend(TrainerBackend):
    """veRL's FSDP engine behind our backend interface."""

    def __init__(self, model_dir: Path, config: VerlConfig | None = None, seed: int = 0) -> None:
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import TrainingWorkerConfig
        from verl.workers.engine_workers import TrainingWorker

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if not torch.cuda.is_available():
            from trainer.backends.verl_cpu_platform import use_cpu_platform

            use_cpu_platform()
        _ensure_process_group()
        torch.manual_seed(seed)
        self.model_dir = Path(model_dir)
        self.config = config or VerlConfig()
        composed = compose(self.model_dir, self.config)
        self.worker = TrainingWorker(
            config=TrainingWorkerConfig(
                model_type="language_model",
                model_config=omega_conf_to_dataclass(composed.model),
                engine_config=omega_conf_to_dataclass(composed.engine),
                optimizer_config=omega_conf_to_dataclass(composed.optim),
                checkpoint_config=omega_conf_to_dataclass(composed.checkpoint),
            )
        )
        self.worker.reset()
        self.seed = seed

    @property
    def rank(self) -> int:
        return dist.get_rank()

    def _shard(self, size: int) -> tuple[list[int], list[int]]:
        """This rank's rows of a ``size``-row batch, and the row it repeats as zero-weight
        padding so that every rank holds the same number (veRL's data-parallel contract)."""
        world = dist.get_world_size()
        mine = list(range(self.rank, size, world))
        per_rank = -(-size // world)
        return mine, [mine[0] if mine else 0] * (per_rank - len(mine))

    def _tensordict(self, batch: TrainBatch, extra: dict[str, torch.Tensor] | None = None) -> Any:
        from verl.workers.utils.padding import left_right_2_no_padding

        return left_right_2_no_padding(to_data_proto(batch, extra).to_tensordict())

    def _local_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        td = self._tensordict(batch)
        tu.assign_non_tensor(td, compute_loss=False, calculate_entropy=False, temperature=1.0)
        out = self.worker.infer_batch(td)
        response = no_padding_2_padding(tu.get(out, "log_probs"), td).float()
        layout = ResponseLayout.of(batch)
        return layout.from_response(response, batch.response_mask.shape[1])

    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Each rank scores its rows; every rank gets the whole ``[B, T-1]`` result."""
        if batch.image_ids:
            raise ConfigError(
                "this batch has samples with images, which the veRL backend does not train "
                "on yet (its forward pass gets no pixels): use trainer.backend = 'cpu' with a "
                "vision-language model, or rollouts without screenshots"
            )
        mine, pad = self._shard(batch.size)
        local = self._local_logprobs(batch.rows(mine + pad))[: len(mine)]
        if dist.get_world_size() == 1:
            return local
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, (mine, local))
        out = torch.zeros_like(batch.behavior_logprobs)
        for rows, values in parts:
            if rows:
                out[rows] = values
        return out

    def train_step(self, batch: TrainBatch, algo: AlgorithmConfig) -> dict[str, Any]:
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.losses import ppo_loss

        old = self.logprobs(batch)
        mask = batch.response_mask
        # Advantages and corrections over the whole batch (groups span ranks), then sharded.
        advantages = compute_advantages(algo, batch.token_level_rewards, mask, batch.index)
        is_weights, corr_mask, metrics = rollout_correction(
            algo, old, batch.behavior_logprobs, mask
        )
        mine, pad = self._shard(batch.size)
        rows = mine + pad
        weight = torch.tensor([1.0] * len(mine) + [0.0] * len(pad)).unsqueeze(-1)
        extra = {
            "old_log_probs": old[rows],
            "advantages": advantages[rows],
            "response_mask": corr_mask[rows] * weight,  # padding rows carry no loss
        }
        if is_weights is not None:
            extra["rollout_is_weights"] = is_weights[rows]
        td = self._tensordict(batch.rows(rows), extra)
        tu.assign_non_tensor(
            td,
            calculate_entropy=False,
            compute_loss=True,
            temperature=1.0,
            global_batch_size=len(rows) * dist.get_world_size(),
            # one optimizer step per batch, micro-batched by tokens
            mini_batch_size=len(rows) * dist.get_world_size(),
            epochs=1,
            seed=self.seed,
            dataloader_kwargs={"shuffle": False},
        )
        self.worker.set_loss_fn(partial(ppo_loss, config=actor_config(algo)))
        out = self.worker.train_mini_batch(td)
        for key, value in ((tu.get(out, "metrics") if out is not None else None) or {}).items():
            values = [float(v) for v in (value if isinstance(value, list) else [value])]
            name = key if "/" in key else f"actor/{key}"
            metrics[name] = float(np.mean(values)) if values else 0.0
        metrics.update(batch.metrics(old))
        return metrics

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.worker.save_checkpoint(str(directory / "verl"))

    def load(self, directory: Path) -> None:
        self.worker.load_checkpoint(str(directory / "verl"), del_local_after_load=False)

    def export_for_inference(self, directory: Path) -> Path:
        """Full weights (or, with LoRA, the adapter) in Hugging Face format, for vLLM."""
        from safetensors.torch import save_file

        # With LoRA, base_sync_done asks for the adapter only (the base is already served).
        engine: Any = self.worker.engine  # the FSDP engine's signature extends BaseEngine's
        params, peft_config = engine.get_per_tensor_param(base_sync_done=self.config.lora_rank > 0)
        state = {name: t.detach().to("cpu").contiguous() for name, t in params}
        if self.rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            if peft_config is not None:
                # peft's adapter format: the LoRA matrices under peft's key prefix, and the
                # target modules by their short names (what vLLM matches on).
                prefix = "base_model.model."
                adapter = {
                    k if k.startswith(prefix) else prefix + k: v
                    for k, v in state.items()
                    if ".lora_" in k
                }
                save_file(adapter, str(directory / "adapter_model.safetensors"))
                config = dict(peft_config)
                targets = config.get("target_modules") or []
                config["target_modules"] = sorted({str(t).rsplit(".", 1)[-1] for t in targets})
                (directory / "adapter_config.json").write_text(json.dumps(config, default=str))
            else:
                save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
                for name in _HF_FILES:
                    if (self.model_dir / name).exists():
                        shutil.copy(self.model_dir / name, directory / name)
        dist.barrier()
        return directory
