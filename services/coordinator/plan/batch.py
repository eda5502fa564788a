"""The micro-batches of a run's trainer ranks, in tokens: what one holds, and what one optimizer
step's samples can fill (the memory plan's activations are of these)."""

from __future__ import annotations

from rollway.coordinator.plan.coefficients import ASSUMED_PROMPT_TOKENS


def micro_batch_tokens(configs: dict[str, object]) -> int:
    """The most tokens one micro-batch of a rank holds: the token budget (dynamic batching), or
    its fixed number of samples times the longest sample the data settings allow."""
    c, d, t = configs["coordinator"], configs["dataloader"], configs["trainer"]
    if t.dynamic_batching:
        return t.max_tokens_per_gpu
    prompt = d.rollout_max_prompt_len or ASSUMED_PROMPT_TOKENS
    longest = prompt if c.is_sft else prompt + c.rollout_max_response_len
    return t.samples_per_micro_batch * longest


def step_micro_batch(configs: dict[str, object]) -> tuple[int, int]:
    """The tokens of a rank's largest micro-batch and its target positions (the tokens whose
    logits are computed). SFT: the token budget, every token a target (an upper bound: the plan
    knows neither the rows' lengths nor the share of assistant tokens). RL: the budget, but never
    more than one optimizer step's samples can fill (step_share: micro-batches are cut from one
    step's samples), with the responses' share of targets."""
    budget = micro_batch_tokens(configs)
    if configs["coordinator"].is_sft:
        return budget, budget
    row_tokens, targets = step_share(configs)
    tokens = min(budget, row_tokens)
    return tokens, tokens * targets // max(row_tokens, 1)


def step_share(configs: dict[str, object]) -> tuple[int, int]:
    """RL: the most tokens one optimizer step's samples put in a rank's rows, and their target
    positions: in a row a group's shared prompt is once (trainer: shared prefixes, sdpa and eager),
    and only the responses are targets. SmolLM2's GRPO at 4,096 tokens: 64 samples fill 2,816, and
    counting the whole budget predicted 10.7 GiB where 6.7 was measured (#37)."""
    c, d, t = configs["coordinator"], configs["dataloader"], configs["trainer"]
    prompt = d.rollout_max_prompt_len or ASSUMED_PROMPT_TOKENS
    response = c.rollout_max_response_len
    samples = -(-c.global_batch_size // max(t.world_size, 1))
    if t.attn_implementation in ("sdpa", "eager"):  # the trainer's SHARED_PREFIX_KERNELS
        groups = -(-samples // max(c.n_samples_per_prompt, 1))
        return groups * prompt + samples * response, samples * response
    return samples * (prompt + response), samples * response
