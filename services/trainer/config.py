"""Settings of the trainer service (flags are generated from the fields).

Settings fall in three groups:
- start-up settings (model, precision, ranks): fixed for the life of the process;
- training hyper-parameters (`TRAINING_SETTINGS`): may be overridden by the Init RPC (among
  them `ADVANTAGE_SETTINGS`, the run's estimator: never per step);
- loss settings (`STEP_SETTINGS`): may also be overridden per TrainStep by its header.

This module does not import torch, so `--help` and configuration errors are instant.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Literal

from rollway.common import shared_settings
from rollway.common.advantages import ESTIMATORS, TRAINER_COMPLETED
from rollway.common.config import ConfigError, setting

# Loss types the trainer knows (the registry in loss/losses.py must hold exactly these; a unit test checks).
LOSS_TYPES = ("sft_loss", "policy_loss")
KL_TYPES = ("k1", "k2", "k3", "low_var_kl")
# Estimators whose token-level returns the trainer computes (KL reward shaping applies to them).
TOKEN_LEVEL_ESTIMATORS = TRAINER_COMPLETED
LR_DECAY_STYLES = ("constant", "linear", "cosine")
TIS_MODES = ("truncate", "icepop")
MIS_LEVELS = ("token", "sequence")


@dataclass
class TrainerConfig:
    """Trainer settings: model, ranks, precision, optimizer, schedule, batching."""

    # --- start-up: model, ranks, precision (Init cannot change these) ---
    hf_checkpoint: str = shared_settings.hf_checkpoint()
    world_size: int = setting(
        1, "number of trainer ranks (processes); rank 0 serves gRPC and spawns the rest", minimum=1
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = shared_settings.dtype()
    cpu_threads: int = shared_settings.cpu_threads()
    fsdp_cpu_offload: bool = setting(False, "keep FSDP2 parameter shards, gradients and optimizer on CPU")
    gradient_checkpointing: bool = setting(False, "recompute decoder-layer activations in backward")
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] = shared_settings.attn_implementation()
    spawn_workers: bool = setting(
        True,
        "rank 0 starts ranks 1..N-1 as child processes; false: they are started elsewhere (Ray actors "
        "running python -m rollway.trainer.worker) and join rank 0's store at master_addr:master_port",
    )
    master_addr: str = setting("127.0.0.1", "address of rank 0's rendezvous store")
    master_port: int = setting(0, "port of rank 0's rendezvous store; 0 picks a free one")
    distributed_timeout_seconds: float = setting(
        600.0,
        "timeout of a collective between ranks: a rank that stops answering is reported after it",
        exclusive_minimum=0,
    )
    exit_when_ranks_break: bool = setting(
        False,
        "when a rank dies (or the ranks fall out of step), exit with code 75 so that whatever "
        "supervises this trainer restarts it with every rank (the coordinator's local launcher sets "
        "it; also for systemd or Kubernetes); false: stay up NOT_SERVING until a run's Init rebuilds "
        "the ranks",
    )
    ref_load: str = setting(
        "", "Hugging Face directory of the reference model for KL (default: the starting checkpoint)"
    )
    lora_rank: int = setting(0, "LoRA rank (0: full fine-tuning); only the adapters train", minimum=0)
    lora_alpha: float = setting(16.0, "LoRA alpha: adapters are scaled by lora_alpha / lora_rank")
    lora_target_modules: list[str] = setting(
        ["all-linear"], "modules that get LoRA adapters (peft names; all-linear: every linear but lm_head)"
    )
    tiled_mlp: bool = setting(False, "compute each decoder MLP over sequence tiles (less activation memory)")
    keep_dropout: bool = setting(
        False,
        "keep the checkpoint's dropout in training (default: every dropout is set to 0 at load, so "
        "the trained policy is the one the rollout engine samples from; kept, the run warns once)",
    )
    tiled_mlp_shards: int = setting(
        0, "tiles per MLP call (0: ceil(tokens / max(hidden_size, 1024)), as ALST)", minimum=0
    )
    # --- training hyper-parameters (Init may override) ---
    seed: int = setting(1234, "random seed (rank r uses seed + r)")
    lr: float = setting(1e-5, "peak learning rate of AdamW", minimum=0)
    min_lr: float = setting(0.0, "learning rate at the end of the decay", minimum=0)
    weight_decay: float = setting(0.0, "AdamW decoupled weight decay (Miles' FSDP default)", minimum=0)
    adam_beta1: float = setting(0.9, "AdamW beta1", minimum=0, exclusive_maximum=1)
    adam_beta2: float = setting(0.95, "AdamW beta2 (Miles' FSDP default)", minimum=0, exclusive_maximum=1)
    adam_eps: float = setting(1e-8, "AdamW epsilon", minimum=0)
    clip_grad: float = setting(
        1.0, "clip the global gradient norm to this value; 0 disables clipping", minimum=0
    )
    lr_decay_style: str = setting("constant", "learning-rate schedule after warmup", choices=LR_DECAY_STYLES)
    lr_warmup_iters: int = setting(0, "optimizer steps of linear warmup from 0 to lr", minimum=0)
    lr_decay_iters: int = setting(
        0, "optimizer step at which the decay reaches min_lr (linear/cosine)", minimum=0
    )
    num_steps_per_rollout: int = setting(
        1, "optimizer steps per TrainStep; the batch is split evenly", exclusive_minimum=0
    )
    micro_batch_size: int = setting(
        0,
        "samples per micro-batch per rank; setting it turns fixed-size micro-batches on (0: unset)",
        minimum=0,
    )
    use_dynamic_batch_size: bool | None = setting(
        None,
        "form micro-batches by token budget (--max-tokens-per-gpu); unset: on unless micro_batch_size is set",
    )
    max_tokens_per_gpu: int = setting(
        8192, "token budget of one micro-batch on one rank (a hard limit)", exclusive_minimum=0
    )
    balance_data: bool = setting(True, "balance tokens across ranks (otherwise samples go round-robin)")
    packing: bool = setting(True, "pack a micro-batch's samples into one row (varlen); off pads each sample")
    pad_to_multiple: int = setting(
        16, "packed rows are padded to a multiple of this many tokens", exclusive_minimum=0
    )
    log_probs_chunk_size: int = setting(
        1024, "positions per chunk of the fp32 log-softmax", exclusive_minimum=0
    )
    # --- loss (TrainStep headers may override) ---
    loss_type: str = shared_settings.loss_type(choices=LOSS_TYPES)
    calculate_per_token_loss: bool = setting(
        False, "token-sum loss over the global number of loss tokens (default: per-sample mean)"
    )
    # --- RL (policy_loss; see loss/policy_loss.py) ---
    advantage_estimator: str = shared_settings.advantage_estimator(choices=ESTIMATORS)
    normalize_advantages: bool = setting(
        False, "whiten the token advantages over the whole global batch (all ranks), any estimator"
    )
    rollout_temperature: float = shared_settings.rollout_temperature()
    rollout_max_response_len: int = shared_settings.rollout_max_response_len()
    eps_clip: float = setting(
        0.2, "PPO clip: ratio is clipped to [1 - eps_clip, 1 + eps_clip_high]", minimum=0
    )
    eps_clip_high: float | None = setting(
        None, "upper PPO clip (DAPO clip-higher); default: eps_clip", minimum=0
    )
    eps_clip_c: float | None = setting(
        None, "dual-clip constant (> 1) bounding the loss of negative advantages", exclusive_minimum=1
    )
    use_rollout_logprobs: bool = setting(False, "use the rollout's log-probs as the old policy's")
    use_kl_loss: bool = setting(False, "add kl_loss_coef * KL(policy || reference) to the loss")
    kl_loss_coef: float = setting(0.0, "weight of the KL loss (with use_kl_loss)", minimum=0)
    kl_loss_type: str = setting("k1", "KL estimator: k1, k2, k3 or low_var_kl (k3 clamped)", choices=KL_TYPES)
    kl_coef: float = setting(
        0.0, "KL reward shaping of reinforce_plus_plus(_baseline): -kl_coef * kl per token"
    )
    gamma: float = setting(1.0, "discount of reinforce_plus_plus returns", minimum=0, maximum=1)
    entropy_coef: float = setting(0.0, "subtract entropy_coef * entropy from the loss", minimum=0)
    # Rollout corrections (docs/algorithms.md): train vs rollout policy, r = exp(old - rollout)
    use_tis: bool = setting(False, "importance-weight the pg loss by the token ratio r (tis_mode)")
    tis_mode: str = setting(
        "truncate",
        "truncate: weight clamp(r, tis_clip_low, tis_clip) (TIS); icepop: weight r inside "
        "[tis_clip_low, tis_clip], 0 outside (IcePop)",
        choices=TIS_MODES,
    )
    tis_clip: float = setting(2.0, "upper bound of the TIS weight")
    tis_clip_low: float = setting(0.0, "lower bound of the TIS weight", minimum=0)
    use_mis: bool = setting(
        False, "masked importance sampling: weight the pg loss by r where r is in [mis_low, mis_high], else 0"
    )
    mis_level: str = setting(
        "token",
        "token: per-token r; sequence: r of the whole sample (product over its tokens)",
        choices=MIS_LEVELS,
    )
    mis_low: float = setting(0.5, "lower bound of masked importance sampling", minimum=0)
    mis_high: float = setting(2.0, "upper bound of masked importance sampling")
    use_geo_mask: bool = setting(
        False, "mask samples whose geometric-mean ratio is outside [geo_mask_low, geo_mask_high] (SkyRL)"
    )
    geo_mask_low: float = setting(0.99, "lower bound of the geometric-mean sequence mask", minimum=0)
    geo_mask_high: float = setting(1.01, "upper bound of the geometric-mean sequence mask")

    @property
    def dynamic_batching(self) -> bool:
        """Micro-batches by token budget: the fast default, unless fixed sizes were asked for."""
        if self.use_dynamic_batch_size is None:
            return self.micro_batch_size == 0
        return self.use_dynamic_batch_size

    @property
    def samples_per_micro_batch(self) -> int:
        """The fixed micro-batch size (without dynamic batching); 1 when unset."""
        return self.micro_batch_size or 1

    def check_required(self) -> None:
        """What a run cannot go without (a trainer started bare gets it from its run)."""
        if not self.hf_checkpoint:
            raise ConfigError("hf_checkpoint", "is required")

    def validate(self) -> None:
        """Rules across settings (each value's own range is declared with it, above)."""
        if self.attn_implementation == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
            raise ConfigError(
                "attn_implementation", "flash_attention_2 needs the flash-attn package (not installed)"
            )
        if not self.spawn_workers and self.world_size > 1 and self.master_port == 0:
            raise ConfigError(
                "master_port", "must be set with spawn_workers false: ranks started elsewhere dial it"
            )
        if self.min_lr > self.lr:
            raise ConfigError("min_lr", f"must not exceed lr ({self.min_lr} > {self.lr})")
        if self.lr_decay_style != "constant" and self.lr_decay_iters <= self.lr_warmup_iters:
            raise ConfigError(
                "lr_decay_iters",
                f"must exceed lr_warmup_iters ({self.lr_warmup_iters}) for lr_decay_style={self.lr_decay_style}",
            )
        _validate_rl(self)
        if self.lora_rank and (self.lora_alpha <= 0 or not self.lora_target_modules):
            raise ConfigError("lora_alpha" if self.lora_alpha <= 0 else "lora_target_modules", "must be set")


def _validate_rl(config: TrainerConfig) -> None:
    """RL loss settings: ranges, and KL as a loss or as a reward penalty, never both."""
    if config.loss_type == "policy_loss" and config.rollout_temperature == 0:
        raise ConfigError("rollout_temperature", "must be positive for policy_loss (log-probs divide by it)")
    for low, high in (
        ("tis_clip_low", "tis_clip"),
        ("mis_low", "mis_high"),
        ("geo_mask_low", "geo_mask_high"),
    ):
        if getattr(config, high) < getattr(config, low):
            raise ConfigError(
                high, f"must not be below {low} ({getattr(config, high)} < {getattr(config, low)})"
            )
    _validate_corrections(config)
    if config.advantage_estimator == "dr_grpo" and config.calculate_per_token_loss:
        raise ConfigError(
            "calculate_per_token_loss",
            "dr_grpo sums each sample's loss over the constant rollout_max_response_len: not per-token loss",
        )
    if config.kl_coef and config.use_kl_loss:
        raise ConfigError(
            "kl_coef", "KL is a reward penalty (kl_coef) or a loss term (use_kl_loss), not both: set one"
        )
    if config.kl_coef and config.advantage_estimator not in TOKEN_LEVEL_ESTIMATORS:
        raise ConfigError(
            "kl_coef",
            f"shapes the rewards of {' and '.join(TOKEN_LEVEL_ESTIMATORS)} only "
            f"(advantage_estimator={config.advantage_estimator}); use use_kl_loss with kl_loss_coef",
        )


def _validate_corrections(config: TrainerConfig) -> None:
    """Rollout corrections compare the trainer's old policy with the rollout's: not with
    use_rollout_logprobs (the old policy would be the rollout's, every ratio 1; Miles refuses it),
    and one importance weight at a time."""
    if config.use_rollout_logprobs:
        for name in ("use_tis", "use_mis", "use_geo_mask"):
            if getattr(config, name):
                raise ConfigError(
                    name,
                    "cannot be combined with use_rollout_logprobs: the old log-probs would be the rollout's, "
                    "so the train/rollout ratio is always 1; drop one of them",
                )
    if config.use_tis and config.use_mis:
        raise ConfigError("use_mis", "use_tis and use_mis are both importance weights: set one")


# What defines the run's advantages: Init may set them (the run pushes them), a TrainStep header
# may not (the coordinator computed the step's group part for the run's estimator).
ADVANTAGE_SETTINGS = ("advantage_estimator", "normalize_advantages", "rollout_max_response_len")
# RL loss settings: hyper-parameters of policy_loss (Init and TrainStep headers may change them).
RL_SETTINGS = (
    "rollout_temperature",
    "eps_clip",
    "eps_clip_high",
    "eps_clip_c",
    "use_rollout_logprobs",
    "use_kl_loss",
    "kl_loss_coef",
    "kl_loss_type",
    "kl_coef",
    "gamma",
    "entropy_coef",
    "use_tis",
    "tis_mode",
    "tis_clip",
    "tis_clip_low",
    "use_mis",
    "mis_level",
    "mis_low",
    "mis_high",
    "use_geo_mask",
    "geo_mask_low",
    "geo_mask_high",
)

# Settings the Init RPC may change: hyper-parameters, not the model or the ranks.
TRAINING_SETTINGS = frozenset(
    {
        "seed",
        "lr",
        "min_lr",
        "weight_decay",
        "adam_beta1",
        "adam_beta2",
        "adam_eps",
        "clip_grad",
        "lr_decay_style",
        "lr_warmup_iters",
        "lr_decay_iters",
        "num_steps_per_rollout",
        "micro_batch_size",
        "use_dynamic_batch_size",
        "max_tokens_per_gpu",
        "balance_data",
        "packing",
        "pad_to_multiple",
        "log_probs_chunk_size",
        "loss_type",
        "calculate_per_token_loss",
        *ADVANTAGE_SETTINGS,
        *RL_SETTINGS,
    }
)

# Settings a TrainStep header may change for that step only.
STEP_SETTINGS = frozenset({"loss_type", "calculate_per_token_loss", *RL_SETTINGS})
