"""Plain /v1 requests (no episode): the current policy served as an OpenAI endpoint.

A request becomes one single-turn Generate call in process (the same validation, queue, pause gate
and engine as a gRPC call; no reward): its messages (with `tools`) rendered by the chat template,
its sampling settings (temperature, top_p, max_tokens, stop, seed, n) over the service's defaults.
Nothing is recorded for training; the response still carries the token ids, log-probs and weight
version under `rollway`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from rollway.common.v1 import common_pb2
from rollway.rollout.config import RolloutConfig
from rollway.rollout.openai_api.chat_format import (
    BadRequest,
    assistant_reply,
    normalise_messages,
    template_messages,
)
from rollway.rollout.prompt_encoding import PromptEncoder
from rollway.rollout.v1 import rollout_pb2

CHAT, COMPLETION = "chat.completion", "text_completion"


def _number(body: dict, key: str, kind: type, default):
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool) or (kind is int and value != int(value)):
        raise BadRequest(f"{key} must be {'an integer' if kind is int else 'a number'} (got {value!r})")
    return kind(value)


def generate_request(
    kind: str, body: dict, encoder: PromptEncoder, config: RolloutConfig
) -> rollout_pb2.GenerateRequest:
    """The Generate call of a plain request; BadRequest naming the field when it cannot be one."""
    if kind == CHAT:
        messages = normalise_messages(body.get("messages"))
        try:
            text = encoder.render_chat(template_messages(messages), body.get("tools") or None)
        except ValueError as exc:
            raise BadRequest(f"messages: {exc}") from None
    else:
        text = body.get("prompt")
        if isinstance(text, list) and len(text) == 1:
            text = text[0]
        if not isinstance(text, str) or not text:
            raise BadRequest("prompt must be one non-empty string")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise BadRequest("stop must be a string or a list of strings")
    params = common_pb2.SamplingParams(
        temperature=_number(body, "temperature", float, config.rollout_temperature),
        top_p=_number(body, "top_p", float, 0.0),
        max_new_tokens=_number(body, "max_completion_tokens", int, 0) or _number(body, "max_tokens", int, 0),
        stop=stop,
    )
    seed = _number(body, "seed", int, None)
    if seed is not None:
        params.seed = seed
    n = _number(body, "n", int, 1)
    if n < 1:
        raise BadRequest(f"n must be at least 1 (got {n})")
    if body.get("stream") and n != 1:
        raise BadRequest("stream needs n = 1")
    return rollout_pb2.GenerateRequest(
        prompts=[rollout_pb2.Prompt(text=text)],
        n_samples_per_prompt=n,
        sampling_params=params,
        environment="none",
        reward="none",
        request_id=f"openai-{uuid.uuid4().hex}",
    )


def response(
    kind: str,
    body: dict,
    samples: list[common_pb2.Sample],
    *,
    model: str,
    parser: str,
    decode_token,
) -> dict[str, Any]:
    """The OpenAI response of a plain request's samples (choice i is sample i)."""
    samples = sorted(samples, key=lambda s: s.index)
    choices, recorded = [], []
    for s in samples:
        finish = "length" if s.finish_reason == common_pb2.FINISH_REASON_LENGTH else "stop"
        if kind == CHAT:
            reply = assistant_reply(s.response_text, finish, parser, f"call-{s.index}")
            choice = {"index": s.index, "message": reply.message(), "finish_reason": reply.finish_reason}
            logprobs = None
            if body.get("logprobs"):
                logprobs = {
                    "content": [
                        {"token": decode_token(t), "logprob": lp, "bytes": list(decode_token(t).encode()),
                         "top_logprobs": []}
                        for t, lp in zip(s.response_token_ids, s.rollout_log_probs, strict=True)
                    ]
                }  # fmt: skip
            choice["logprobs"] = logprobs
        else:
            choice = {"index": s.index, "text": s.response_text, "finish_reason": finish, "logprobs": None}
        choices.append(choice)
        recorded.append(
            {
                "completion_token_ids": list(s.response_token_ids),
                "completion_log_probs": list(s.rollout_log_probs),
                "weight_version": s.weight_version,
            }
        )
    prompt_ids = list(samples[0].prompt_token_ids) if samples else []
    num_completion = sum(len(s.response_token_ids) for s in samples)
    return {
        "id": f"{'chatcmpl' if kind == CHAT else 'cmpl'}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": num_completion,
            "total_tokens": len(prompt_ids) + num_completion,
        },
        "rollway": {"prompt_token_ids": prompt_ids, "choices": recorded},
    }
