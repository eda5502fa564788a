"""Checks a GenerateRequest and turns it into engine SampleRequests.

Every field is checked before anything is queued; a bad field is INVALID_ARGUMENT naming it, a
request over --max-samples-per-request is RESOURCE_EXHAUSTED. Sampling parameters: with
`sampling_params` absent every service default applies; when present, `temperature` is taken
as given (0 = greedy) and a 0 in top_p, top_k or max_new_tokens means "the service default"
(proto3 cannot tell 0 from unset). A max_new_tokens the request sets must fit the context with
the prompt (else INVALID_ARGUMENT); the default (--rollout-max-response-len) is cut to what
fits, as Miles does with --rollout-max-context-len. Sample i of the batch (prompt p, sample j: i = p * n + j)
uses seed + i when a seed is given (Miles: sampling_seed = seed + sample index). A prompt with a
response prefix (partial rollout) continues after it: the engine's prompt is prompt + prefix and
max_new_tokens counts the prefix. A prompt is token ids, text or chat messages (exactly one);
text and messages are tokenised by the served model's tokenizer (prompt_encoding.py), and errors
about a prompt name the form it was given in (prompts[3].text).

With an environment (GenerateRequest.environment, else --environment) each sample is an episode
(episodes.py): max_new_tokens is per model turn, a response prefix is the aborted episode's
(loss mask and turns included) and the reward is the environment's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from rollway.common.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from rollway.common.structs import from_struct
from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.base import ModelInfo, SampleRequest
from rollway.rollout.episode_spec import EpisodeSpec, TurnRecord
from rollway.rollout.prompt_encoding import PromptEncoder, prompt_form
from rollway.rollout.rewards import NO_REWARD
from rollway.rollout.sampling import SamplingParams
from rollway.rollout.v1 import rollout_pb2

MAX_SEED = 2**63 - 2**32  # seed + sample index must stay a valid 64-bit generator seed
MAX_STOP_STRINGS = 64


@dataclass(frozen=True)
class GenerationPlan:
    """A validated request: the samples to generate and the reward to score them with."""

    samples: list[SampleRequest]
    group_indices: list[int]  # per prompt
    prompt_token_ids: list[tuple[int, ...]]  # per prompt (text and messages tokenised)
    n_samples_per_prompt: int
    reward: str
    environment: str = "none"


def _check_token_ids(field: str, token_ids, vocab_size: int) -> None:
    for pos, token in enumerate(token_ids):
        if not 0 <= token < vocab_size:
            raise InvalidArgument(
                f"{field}[{pos}]", f"token id {token} is outside the vocabulary [0, {vocab_size})"
            )


def resolve_sampling(
    request: rollout_pb2.GenerateRequest, config: RolloutConfig, info: ModelInfo
) -> SamplingParams:
    """The request's sampling parameters over the service defaults, checked (max_new_tokens 0: default)."""
    stop, stop_ids = list(config.rollout_stop), set(config.rollout_stop_token_ids)
    if not request.HasField("sampling_params"):
        return SamplingParams(
            temperature=config.rollout_temperature,
            top_p=config.rollout_top_p,
            top_k=config.rollout_top_k,
            max_new_tokens=0,
            stop_token_ids=frozenset(stop_ids),
            stop=tuple(stop),
            seed=config.sampling_seed,
        )
    sp = request.sampling_params
    if not math.isfinite(sp.temperature) or sp.temperature < 0:
        raise InvalidArgument("sampling_params.temperature", f"must be >= 0 (got {sp.temperature})")
    if not math.isfinite(sp.top_p) or not 0 <= sp.top_p <= 1:
        raise InvalidArgument("sampling_params.top_p", f"must be in (0, 1] (got {sp.top_p})")
    if sp.top_k < -1:
        raise InvalidArgument("sampling_params.top_k", f"must be >= -1 (got {sp.top_k}; 0 or -1 disable it)")
    if sp.max_new_tokens < 0:
        raise InvalidArgument("sampling_params.max_new_tokens", f"must be positive (got {sp.max_new_tokens})")
    _check_token_ids("sampling_params.stop_token_ids", sp.stop_token_ids, info.vocab_size)
    if len(sp.stop) > MAX_STOP_STRINGS:
        raise InvalidArgument("sampling_params.stop", f"at most {MAX_STOP_STRINGS} stop strings")
    for pos, text in enumerate(sp.stop):
        if not text:
            raise InvalidArgument(f"sampling_params.stop[{pos}]", "must not be empty")
    if sp.HasField("seed") and not 0 <= sp.seed <= MAX_SEED:
        raise InvalidArgument("sampling_params.seed", f"must be in [0, {MAX_SEED}] (got {sp.seed})")
    return SamplingParams(
        temperature=sp.temperature,
        top_p=sp.top_p or config.rollout_top_p,
        top_k=sp.top_k or config.rollout_top_k,
        max_new_tokens=sp.max_new_tokens,
        stop_token_ids=frozenset(stop_ids | set(sp.stop_token_ids)),
        stop=tuple(dict.fromkeys([*stop, *sp.stop])),
        seed=sp.seed if sp.HasField("seed") else config.sampling_seed,
    )


def check_reward(name: str, config: RolloutConfig, registered) -> str:
    reward = name or config.reward
    if reward != NO_REWARD and reward not in registered:
        known = ", ".join([*sorted(registered), NO_REWARD])
        raise InvalidArgument("reward", f"unknown reward function {reward!r}; registered: {known}")
    return reward


def _max_new_tokens(
    field: str, prompt_len: int, requested: int, config: RolloutConfig, info: ModelInfo
) -> int:
    room = info.max_context_len - prompt_len
    if requested and requested > room:
        raise InvalidArgument(
            field,
            f"prompt of {prompt_len} tokens + max_new_tokens {requested} exceeds the model context "
            f"of {info.max_context_len} tokens",
        )
    if room <= 0:
        raise InvalidArgument(
            field, f"prompt of {prompt_len} tokens fills the model context of {info.max_context_len}"
        )
    return requested or min(config.rollout_max_response_len, room)


def _check_prefix(
    field: str, prompt: rollout_pb2.Prompt, max_new_tokens: int, group_reward: bool, info: ModelInfo
) -> tuple[int, ...]:
    """The response prefix a continuation resumes after (empty for a fresh prompt), checked."""
    if not prompt.HasField("response_prefix"):
        return ()
    prefix = prompt.response_prefix
    if group_reward:
        raise InvalidArgument(
            field, "a group reward function needs whole groups: it cannot score continuations"
        )
    if len(prefix.log_probs) != len(prefix.token_ids):
        raise InvalidArgument(
            f"{field}.log_probs", f"has {len(prefix.log_probs)} entries for {len(prefix.token_ids)} tokens"
        )
    if len(prefix.token_ids) >= max_new_tokens:
        raise InvalidArgument(
            f"{field}.token_ids",
            f"{len(prefix.token_ids)} tokens leave nothing of max_new_tokens {max_new_tokens} to generate",
        )
    _check_token_ids(f"{field}.token_ids", prefix.token_ids, info.vocab_size)
    return tuple(prefix.token_ids)


def _episode_spec(field: str, prompt: rollout_pb2.Prompt, new_environment, info: ModelInfo) -> EpisodeSpec:
    """The episode of one prompt's samples, its continuation prefix checked."""
    prefix = prompt.response_prefix
    n = len(prefix.token_ids)
    if len(prefix.log_probs) != n:
        raise InvalidArgument(f"{field}.log_probs", f"has {len(prefix.log_probs)} entries for {n} tokens")
    if prefix.loss_mask and len(prefix.loss_mask) != n:
        raise InvalidArgument(f"{field}.loss_mask", f"has {len(prefix.loss_mask)} entries for {n} tokens")
    if any(v not in (0, 1) for v in prefix.loss_mask):
        raise InvalidArgument(f"{field}.loss_mask", "entries must be 0 or 1")
    if prefix.turns and sum(t.num_tokens for t in prefix.turns) != n:
        raise InvalidArgument(f"{field}.turns", f"their num_tokens do not add up to the {n} tokens")
    for i, turn in enumerate(prefix.turns):
        if turn.role not in ("model", "environment") or turn.num_tokens < 0:
            raise InvalidArgument(f"{field}.turns[{i}]", "role must be model or environment, num_tokens >= 0")
    _check_token_ids(f"{field}.token_ids", prefix.token_ids, info.vocab_size)
    metadata = from_struct(prompt.metadata)
    return EpisodeSpec(
        new_environment=new_environment,
        label=prompt.label,
        metadata=metadata,
        prefix_token_ids=tuple(prefix.token_ids),
        prefix_log_probs=tuple(prefix.log_probs),
        prefix_loss_mask=tuple(prefix.loss_mask),
        prefix_turns=tuple(
            TurnRecord(t.role, t.num_tokens, t.weight_version, t.reward) for t in prefix.turns
        ),
    )


def prompt_token_ids(
    p: int, prompt: rollout_pb2.Prompt, encoder: PromptEncoder | None, info: ModelInfo
) -> tuple[str, tuple[int, ...]]:
    """The field the prompt was given in (for errors) and its token ids, checked."""
    form = prompt_form(f"prompts[{p}]", prompt)
    field = f"prompts[{p}].{form}"
    if form == "token_ids":
        _check_token_ids(field, prompt.token_ids, info.vocab_size)
        return field, tuple(prompt.token_ids)
    if encoder is None:
        raise FailedPrecondition(f"{field}: this service has no tokenizer; send token_ids")
    if form == "text":
        ids = encoder.encode_text(field, prompt.text)
    else:
        ids = encoder.encode_messages(field, prompt.messages)
    _check_token_ids(field, ids, info.vocab_size)  # a tokenizer larger than the model's vocabulary
    return field, ids


def plan_generation(
    request: rollout_pb2.GenerateRequest,
    config: RolloutConfig,
    info: ModelInfo,
    registered_rewards,
    encoder: PromptEncoder | None = None,
    environments: Callable[[str], Callable | None] | None = None,
) -> GenerationPlan:
    """Validate `request` and lay out its samples (see the module doc)."""
    if not request.prompts:
        raise InvalidArgument("prompts", "must not be empty")
    if request.n_samples_per_prompt < 0:
        raise InvalidArgument(
            "n_samples_per_prompt", f"must be positive (got {request.n_samples_per_prompt})"
        )
    n = request.n_samples_per_prompt or config.n_samples_per_prompt
    total = n * len(request.prompts)
    if total > config.max_samples_per_request:
        raise ResourceExhausted(
            f"n_samples_per_prompt: {len(request.prompts)} prompts x {n} samples = {total} samples exceeds "
            f"--max-samples-per-request {config.max_samples_per_request}"
        )
    environment = request.environment or config.environment
    new_environment = environments(environment) if environments is not None else None
    # An episode's reward is its environment's: the reward functions are not called.
    reward = NO_REWARD if new_environment else check_reward(request.reward, config, registered_rewards)
    params = resolve_sampling(request, config, info)
    group_reward = reward != NO_REWARD and registered_rewards[reward].group
    samples: list[SampleRequest] = []
    group_indices: list[int] = []
    prompts: list[tuple[int, ...]] = []
    for p, prompt in enumerate(request.prompts):
        field, prompt_ids = prompt_token_ids(p, prompt, encoder, info)
        prompts.append(prompt_ids)
        max_new_tokens = _max_new_tokens(field, len(prompt_ids), params.max_new_tokens, config, info)
        group_indices.append(prompt.group_index if prompt.HasField("group_index") else p)
        episode = None
        if new_environment is not None:  # max_new_tokens is per turn; the prefix is the episode's
            episode = _episode_spec(f"prompts[{p}].response_prefix", prompt, new_environment, info)
        prefix = (
            ()
            if episode
            else _check_prefix(f"prompts[{p}].response_prefix", prompt, max_new_tokens, group_reward, info)
        )
        token_ids = prompt_ids + prefix  # a continuation's engine prompt ends with its prefix
        max_new_tokens -= len(prefix)
        for j in range(n):
            index = p * n + j
            seed = None if params.seed is None else params.seed + index
            sample_params = SamplingParams(
                **{**params.__dict__, "seed": seed, "max_new_tokens": max_new_tokens}
            )
            samples.append(
                SampleRequest(
                    index=index,
                    prompt_token_ids=token_ids,
                    params=sample_params,
                    prompt_key=p,
                    episode=episode,
                )
            )
    return GenerationPlan(
        samples=samples,
        group_indices=group_indices,
        prompt_token_ids=prompts,
        n_samples_per_prompt=n,
        reward=reward,
        environment=environment if new_environment else "none",
    )
