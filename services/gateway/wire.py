"""The tinker SDK's protobuf bodies (tinker.proto.tinker_public_pb2, the API being served) to and
from the trainer's messages. The SDK sends forward_backward as protobuf (zstd-compressed when the
server's client config asks) and reads ForwardBackwardOutput and SampleResponse only as protobuf.

A datum's loss inputs by the SDK's names: target_tokens, weights (cross_entropy), logprobs and
advantages (importance_sampling, ppo, cispo).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import zstandard
from tinker.proto import tinker_public_pb2 as public_pb

from rollway.gateway.errors import bad_request
from rollway.trainer.v1 import trainer_pb2

NUMPY_DTYPES = {
    public_pb.DTYPE_FLOAT32: np.float32,
    public_pb.DTYPE_INT64: np.int64,
    public_pb.DTYPE_INT32: np.int32,
}
# SDK loss input -> trainer Datum field.
LOSS_INPUTS = {"weights": "weights", "logprobs": "sampling_log_probs", "advantages": "advantages"}
SERVED_LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo")  # the trainer's datum_losses
REFUSED_LOSSES = {
    "dro": "its formula is not documented in the SDK",
    # A sequence-level ratio needs to know which tokens are the sequence: a Tinker datum also holds
    # its prompt's targets, with advantage 0 and sampling log-prob 0, and the SDK does not say.
    "gspo": "its sequence-level ratio is not defined by the SDK (which of a datum's tokens form the "
    "sequence); use ppo or cispo, or forward_backward_custom",
    "stable_reinforce": "its formula is not documented in the SDK",
    "custom": "custom losses run client-side (forward_backward_custom) with this gateway",
}


@dataclass
class ForwardBackwardCall:
    """A decoded forward_backward request."""

    model_id: str
    seq_id: int
    request: trainer_pb2.ForwardBackwardRequest


def _tensor(name: str, tensor: public_pb.Tensor) -> np.ndarray:
    if tensor.HasField("sparse_csr"):
        raise bad_request(f"{name}: sparse tensors are not supported; send it dense")
    dtype = NUMPY_DTYPES.get(tensor.dtype)
    if dtype is None:
        raise bad_request(f"{name}: dtype {public_pb.DType.Name(tensor.dtype)} is not supported")
    return np.frombuffer(tensor.dense, dtype=dtype).reshape(-1)


def _tokens(position: int, datum: public_pb.Datum) -> list[int]:
    tokens: list[int] = []
    for k, chunk in enumerate(datum.model_input):
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise bad_request(
                f"data[{position}].model_input.chunks[{k}]: {kind} chunks are not supported (text only)"
            )
        tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
    return tokens


def decode_forward_backward(body: bytes, content_encoding: str) -> ForwardBackwardCall:
    """The SDK's forward_backward body -> the trainer's request (bad_request names the problem)."""
    if content_encoding == "zstd":
        try:
            body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
        except zstandard.ZstdError as exc:
            raise bad_request(f"body: not valid zstd ({exc})") from None
    message = public_pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError or others on garbage
        raise bad_request(f"body: not a ForwardBackwardRequest protobuf ({exc})") from None
    if message.loss_fn in REFUSED_LOSSES:
        raise bad_request(f"loss_fn: {message.loss_fn} is refused: {REFUSED_LOSSES[message.loss_fn]}")
    if message.loss_fn not in SERVED_LOSSES:
        raise bad_request(
            f"loss_fn: {message.loss_fn!r} is not a loss of the tinker API (served: {', '.join(SERVED_LOSSES)})"
        )
    data = []
    for position, datum in enumerate(message.data):
        inputs = dict(datum.loss_fn_inputs)
        if "target_tokens" not in inputs:
            raise bad_request(f"data[{position}].loss_fn_inputs: target_tokens is required")
        fields = {"token_ids": _tokens(position, datum)}
        fields["target_token_ids"] = _tensor(
            f"data[{position}].target_tokens", inputs.pop("target_tokens")
        ).tolist()
        for name, tensor in inputs.items():
            if name not in LOSS_INPUTS:
                raise bad_request(
                    f"data[{position}].loss_fn_inputs.{name}: unknown input; known: target_tokens, {', '.join(LOSS_INPUTS)}"
                )
            fields[LOSS_INPUTS[name]] = (
                _tensor(f"data[{position}].{name}", tensor).astype(np.float32).tolist()
            )
        if message.loss_fn == "cross_entropy" and "weights" not in fields:
            fields["weights"] = [1.0] * len(fields["target_token_ids"])
        data.append(trainer_pb2.Datum(**fields))
    config = {k: v.number for k, v in message.loss_fn_config_v2.items() if v.WhichOneof("value") == "number"}
    config = config or dict(message.loss_fn_config)
    request = trainer_pb2.ForwardBackwardRequest(
        loss_fn=message.loss_fn, forward_only=message.forward_only, data=data, loss_fn_config=config
    )
    return ForwardBackwardCall(message.model_id, message.seq_id, request)


def _batched(arrays: list[np.ndarray]) -> public_pb.BatchedTensor:
    sizes = [a.nbytes for a in arrays]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    data = b"".join(a.astype(np.float32).tobytes() for a in arrays)
    return public_pb.BatchedTensor(data=data, offsets=offsets.tobytes(), dtype=public_pb.DTYPE_FLOAT32)


def encode_forward_backward_output(response: trainer_pb2.ForwardBackwardResponse) -> bytes:
    """The trainer's answer -> the SDK's ForwardBackwardOutput: per datum `logprobs` and
    `elementwise_loss`; metrics with the SDK's names (loss:sum)."""
    log_probs = [np.asarray(o.log_probs, dtype=np.float32) for o in response.outputs]
    losses = [np.asarray(o.elementwise_loss, dtype=np.float32) for o in response.outputs]
    record = public_pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(log_probs))
    record.fields["logprobs"].CopyFrom(_batched(log_probs))
    record.fields["elementwise_loss"].CopyFrom(_batched(losses))
    # The SDK adds up chunked calls by the reduction each name ends with (all of these are sums).
    metrics = {name if ":" in name else f"{name}:sum": value for name, value in response.metrics.items()}
    out = public_pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    out.loss_fn_outputs.append(record)
    return out.SerializeToString()


def encode_sample_response(
    sequences: list[tuple[list[int], list[float], bool]], prompt_logprobs: list[float] | None = None
) -> bytes:
    """(tokens, log-probs, stopped by a stop condition) per sequence -> the SDK's SampleResponse;
    `prompt_logprobs`: one per prompt token, NaN where none was computed (the SDK reads None)."""
    out = public_pb.SampleResponse()
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    for tokens, log_probs, stopped in sequences:
        out.sequences.add(
            stop_reason=public_pb.STOP_REASON_STOP if stopped else public_pb.STOP_REASON_LENGTH,
            tokens=np.asarray(tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(log_probs, dtype=np.float32).tobytes(),
        )
    return out.SerializeToString()
