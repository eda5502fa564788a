"""The SDK's own protobuf encoding of forward_backward, decoded by the gateway (wire.py), and the
gateway's ForwardBackwardOutput decoded by the SDK's own reader."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output

from rollway.gateway.errors import GatewayError
from rollway.gateway.wire import decode_forward_backward, encode_forward_backward_output
from rollway.trainer.v1 import trainer_pb2


def sdk_body(loss_fn: str, inputs: dict, config: dict | None = None) -> bytes:
    datum = types.Datum(model_input=types.ModelInput.from_ints([1, 5, 9]), loss_fn_inputs=inputs)
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=[datum], loss_fn=loss_fn, loss_fn_config=config
        ),
        model_id="m",
        seq_id=3,
    )
    return forward_backward_request_to_proto(request).SerializeToString()


def test_an_rl_datum_arrives_with_its_per_token_inputs_and_config():
    inputs = {"target_tokens": [5, 9, 2], "logprobs": [-1.0, -2.0, -3.0], "advantages": [0.5, 0.5, 0.5]}
    body = sdk_body("ppo", inputs, {"clip_low_threshold": 0.9})
    for encoded, encoding in ((body, ""), (zstandard.ZstdCompressor().compress(body), "zstd")):
        call = decode_forward_backward(encoded, encoding)
        assert (call.model_id, call.seq_id, call.request.loss_fn) == ("m", 3, "ppo")
        datum = call.request.data[0]
        assert list(datum.token_ids) == [1, 5, 9] and list(datum.target_token_ids) == [5, 9, 2]
        assert list(datum.sampling_log_probs) == [-1.0, -2.0, -3.0] and list(datum.advantages) == [0.5] * 3
        assert dict(call.request.loss_fn_config) == pytest.approx({"clip_low_threshold": 0.9})


def test_cross_entropy_without_weights_weighs_every_token_and_unknown_inputs_are_named():
    call = decode_forward_backward(sdk_body("cross_entropy", {"target_tokens": [5, 9, 2]}), "")
    assert list(call.request.data[0].weights) == [1.0, 1.0, 1.0]
    extra = {"target_tokens": [5, 9, 2], "sequence_ratio_mask": [1.0] * 3}
    with pytest.raises(GatewayError, match=r"data\[0\].loss_fn_inputs.sequence_ratio_mask: unknown input"):
        decode_forward_backward(sdk_body("cross_entropy", extra), "")
    with pytest.raises(GatewayError, match="body: not a ForwardBackwardRequest protobuf"):
        decode_forward_backward(b"\xff\xff\xff", "")


def test_the_sdk_reads_the_gateways_output():
    reply = trainer_pb2.ForwardBackwardResponse(
        outputs=[
            trainer_pb2.DatumOutput(log_probs=[-1.0, -2.0], elementwise_loss=[1.0, 2.0]),
            trainer_pb2.DatumOutput(log_probs=[-0.5], elementwise_loss=[0.5]),
        ],
        metrics={"loss:sum": 3.5, "num_tokens": 3.0},
    )
    out = deserialize_forward_backward_output(encode_forward_backward_output(reply))
    assert out.metrics == {"loss:sum": 3.5, "num_tokens:sum": 3.0}
    assert [o["logprobs"].to_numpy().tolist() for o in out.loss_fn_outputs] == [[-1.0, -2.0], [-0.5]]
    np.testing.assert_array_equal(out.loss_fn_outputs[1]["elementwise_loss"].to_numpy(), [0.5])
