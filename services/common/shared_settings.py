"""Settings that several components read, declared once: one default, one doc.

A run config is one flat namespace (Miles' flags): `hf_checkpoint` matters to the trainer, the
rollout engine and the dataloader, `rollout_temperature` to the coordinator (sampling), the
rollout service (its default) and the trainer (logits are divided by it). Each component's
settings dataclass takes such a field from here, with its own type annotation (the accepted
values may differ: the trainer knows flash_attention_2, the CPU engine does not):

    hf_checkpoint: str = shared_settings.hf_checkpoint()

`options` are a component's own accepted values (choices=...). tests/unit/common/test_config.py checks that every setting declared by two components comes
from here.
"""

from __future__ import annotations

from rollway.common.config import setting

# Reward functions by name, rm_type's values: the rollout service builds them (rollout/rewards/),
# built in or registered by settings (remote: rm_url; custom: custom_rm_path); the coordinator's
# settings check a run's rm_type against them without importing the rollout service.
BUILTIN_REWARD_NAMES = ("exact_match", "math", "f1")
REWARD_NAMES = (*BUILTIN_REWARD_NAMES, "remote", "custom", "none")


def hf_checkpoint(**options):
    return setting(
        "",
        "Hugging Face model directory (weights, config, tokenizer): trained by the trainer, served by "
        "the rollout service, its tokenizer used by the dataloader",
        shared=True,
        **options,
    )


def dtype(**options):
    return setting(
        "auto",
        "dtype of the weights (auto: bfloat16 on CUDA, float32 on CPU); the trainer keeps fp32 master "
        "weights and gradient reduction",
        shared=True,
        **options,
    )


def attn_implementation(**options):
    return setting(
        "sdpa", "attention kernel (flash_attention_2: trainer only, needs flash-attn and a GPU)", shared=True
    )


def chat_template_path(**options):
    return setting(
        "", "file with a Jinja chat template that replaces the tokenizer's", shared=True, **options
    )


def loss_type(**options):
    return setting(
        "policy_loss",
        "sft_loss: the SFT loop and loss; policy_loss: the RL loop and loss",
        shared=True,
        **options,
    )


def num_epoch(**options):
    return setting(
        1,
        "epochs over the prompt data (0: no end; epochs wrap until stopped)",
        shared=True,
        minimum=0,
        **options,
    )


def rollout_seed(**options):
    return setting(
        42,
        "seed of sampling (per-sample seed = rollout_seed + index) and data order",
        shared=True,
        minimum=0,
        **options,
    )


def eval_prompt_data(**options):
    return setting([], "eval sources as name path pairs (served by the dataloader)", shared=True, **options)


def n_samples_per_prompt(**options):
    return setting(
        1,
        "samples per prompt (the group size of group advantages)",
        shared=True,
        exclusive_minimum=0,
        **options,
    )


def rollout_temperature(**options):
    return setting(
        1.0,
        "sampling temperature (0: greedy); the trainer divides logits by it for log-probs",
        shared=True,
        minimum=0,
    )


def rollout_top_p(**options):
    return setting(
        1.0, "nucleus sampling threshold in (0, 1]", shared=True, exclusive_minimum=0, maximum=1, **options
    )


def rollout_top_k(**options):
    return setting(-1, "top-k cutoff (0 or -1: off)", shared=True, **options)


def rollout_max_response_len(**options):
    return setting(1024, "max response tokens", shared=True, exclusive_minimum=0, **options)


def rollout_stop(**options):
    return setting([], "strings that end a response", shared=True, **options)


def advantage_estimator(**options):
    return setting(
        "grpo",
        "grpo, gspo, dr_grpo, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline (docs/algorithms.md); "
        "the coordinator computes the group part, the trainer the token part",
        shared=True,
        **options,
    )


def cpu_threads(**options):
    return setting(
        0,
        "torch threads of each trainer rank and of the CPU rollout engine (0: the usable cores, shared "
        "among a machine's trainer ranks; common/cpu_threads.py)",
        shared=True,
        minimum=0,
        **options,
    )
