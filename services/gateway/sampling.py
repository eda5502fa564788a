"""A sampling session: one saved set of weights (the Hugging Face export of
save_weights_for_sampler, or a base model) served by its base model's rollout service, and the
SDK's sample calls translated to its Generate. Sampled tokens come back with the engine's
log-probs (temperature-scaled, as the rollout service computes them)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

from rollway.common.v1 import common_pb2
from rollway.gateway.base_rollouts import BaseRollout
from rollway.gateway.errors import bad_request
from rollway.gateway.wire import encode_sample_response
from rollway.rollout.v1 import rollout_pb2

MAX_SAMPLES = 64  # most sequences one sample call may ask for


def _prompt_tokens(prompt: dict) -> list[int]:
    tokens: list[int] = []
    for k, chunk in enumerate(prompt.get("chunks") or []):
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise bad_request(f"prompt.chunks[{k}]: {chunk.get('type')} chunks are not supported (text only)")
        tokens.extend(int(t) for t in chunk["tokens"])
    if not tokens:
        raise bad_request("prompt: must hold at least one token")
    return tokens


class Sampler:
    """A sampling session: the weights it samples (an export's directory, or the base model's)
    on its base model's shared rollout service (base_rollouts.py)."""

    def __init__(self, sampling_session_id: str, weights: Path, rollout: BaseRollout):
        self.sampling_session_id = sampling_session_id
        self.weights = weights
        self.rollout = rollout
        self.describe: dict[str, Any] = {}  # GetSamplerResponse (set by the gateway)
        self.owner = ""  # the tenant (API key) whose session created it (set by the gateway)
        self.exported: Path | None = None  # weights exported for this sampler only (removed with it)

    def generate_request(self, body: dict[str, Any]) -> rollout_pb2.GenerateRequest:
        """The SDK's SampleRequest -> Generate (bad_request names an unsupported field)."""
        num_samples = int(body.get("num_samples", 1))
        if not 1 <= num_samples <= MAX_SAMPLES:
            raise bad_request(f"num_samples: must be in [1, {MAX_SAMPLES}] (got {num_samples})")
        for name in (
            "topk_prompt_logprobs",
            "topk_sample_logprobs",
            "prompt_alt_tokens_k",
            "target_prompt_logprobs",
        ):
            if body.get(name):
                raise bad_request(
                    f"{name}: not supported by this gateway (sampled-token and prompt log-probs only)"
                )
        params = body.get("sampling_params") or {}
        max_tokens = params.get("max_tokens")
        if max_tokens is None or int(max_tokens) < 1:
            raise bad_request(f"sampling_params.max_tokens: must be >= 1 (got {max_tokens})")
        stop = params.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        sampling = common_pb2.SamplingParams(
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=max(int(params.get("top_k", -1)), 0),
            max_new_tokens=int(max_tokens),
            stop_token_ids=[s for s in stop if isinstance(s, int)],
            stop=[s for s in stop if isinstance(s, str)],
        )
        if params.get("seed") is not None:
            sampling.seed = int(params["seed"])
        prompt = rollout_pb2.Prompt(token_ids=_prompt_tokens(body.get("prompt") or {}))
        last_n = body.get("prompt_logprobs_last_n")
        if last_n is not None and not 1 <= int(last_n) <= len(prompt.token_ids) - 1:
            raise bad_request(
                f"prompt_logprobs_last_n: must be in [1, len(prompt) - 1 = {len(prompt.token_ids) - 1}] "
                f"(got {last_n})"
            )
        return rollout_pb2.GenerateRequest(
            prompts=[prompt], n_samples_per_prompt=num_samples, sampling_params=sampling, reward="none",
            environment="none", prompt_log_probs=bool(body.get("prompt_logprobs")),
        )  # fmt: skip

    def sample(
        self, request: rollout_pb2.GenerateRequest, prompt_logprobs_last_n: int | None = None
    ) -> bytes:
        """On the rollout's thread: generate on this sampler's weights (and score the prompt when
        the request asks: compute_logprobs, `prompt_logprobs_last_n` of them)."""
        replies = self.rollout.generate(self.weights, request)
        samples = [reply.sample for reply in replies]
        scores = None
        if request.prompt_log_probs:
            # The first token has no context: no log-prob (NaN, which the SDK reads as None).
            scores = [math.nan, *replies[0].prompt_log_probs]
            if prompt_logprobs_last_n:  # only the last n are asked for
                skipped = len(scores) - int(prompt_logprobs_last_n)
                scores[:skipped] = [math.nan] * skipped
        return encode_sample_response(
            [
                (
                    list(s.response_token_ids),
                    list(s.rollout_log_probs),
                    s.finish_reason == common_pb2.FINISH_REASON_STOP,
                )
                for s in samples
            ],
            scores,
        )

    def stop(self) -> None:
        """Remove what only this sampler used, on the rollout's thread after its queued calls (the
        gateway stops a rollout service left without samplers)."""
        exported = self.exported

        def remove() -> None:
            self.rollout.forget(self.weights)  # another sampler of these weights prepares them again
            if exported is not None:
                shutil.rmtree(exported, ignore_errors=True)

        try:
            self.rollout.submit(remove)
        except RuntimeError:  # the rollout is closed: nothing runs any more
            remove()
