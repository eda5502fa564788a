"""The sglang engine against SGLang's HTTP protocol (a recording peer on loopback); its process
supervision and the real server are in tests/integration/rollout/test_sglang_supervisor.py."""

import os
import queue
import time

import pytest
from support.sglang_engine import start_sglang_engine as _engine

from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.base import EngineError, SampleRequest
from rollway.rollout.engines.sglang_http import (
    SGLangClient,
    SGLangHTTPError,
    parse_generate_reply,
    sampling_params_body,
)
from rollway.rollout.engines.sglang_server import GUARD, launch_command
from rollway.rollout.sampling import SamplingParams


def _request(index, prompt=(5, 6, 7), **params):
    return SampleRequest(index=index, prompt_token_ids=prompt, params=SamplingParams(**params), prompt_key=0)


def test_generate_sends_token_ids_and_sampling_params_and_parses_logprobs(tiny_model_dir, sglang_peer):
    peer = sglang_peer()
    engine = _engine(tiny_model_dir, peer)
    try:
        results = queue.Queue()
        params = dict(
            temperature=0.7,
            top_p=0.9,
            top_k=0,
            max_new_tokens=3,
            stop=("###",),
            seed=11,
            stop_token_ids=frozenset({2, 0}),
        )
        engine.submit([_request(0, **params), _request(1, prompt=(9,), **params)], results.put)
        out = sorted([results.get(timeout=10), results.get(timeout=10)], key=lambda r: r.request.index)
    finally:
        engine.stop()
    bodies = sorted(peer.calls("/generate"), key=lambda b: b["input_ids"])
    assert [b["input_ids"] for b in bodies] == [[5, 6, 7], [9]]
    for body in bodies:
        assert body["return_logprob"] is True and body["rid"].startswith("rollway-")
        assert body["sampling_params"] == {
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": -1,
            "max_new_tokens": 3,
            "stop_token_ids": [0, 2],
            "stop": ["###"],
            "skip_special_tokens": True,
            "sampling_seed": 11,
        }
    assert out[0].token_ids == [5, 6, 7] and out[1].token_ids == [9, 10, 11]
    assert out[0].log_probs == pytest.approx([-0.1, -0.2, -0.3])
    assert out[0].finish_reason == "length" and out[0].weight_version == 0 and out[0].error == ""
    assert out[0].text.startswith("text-")


def test_reply_parsing_maps_finish_reasons_and_weight_versions():
    request = _request(0)
    reply = {
        "text": "hi",
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": 2},
            "output_token_logprobs": [[-1.5, 2, None]],
            "weight_version": "7",
        },
    }
    result = parse_generate_reply(request, reply, default_version=3)
    assert (result.token_ids, result.log_probs, result.finish_reason, result.weight_version) == (
        [2],
        [-1.5],
        "stop",
        7,
    )
    reply["meta_info"]["finish_reason"] = None
    assert "finish_reason" in parse_generate_reply(request, reply, 3).error
    assert sampling_params_body(SamplingParams(top_k=20))["top_k"] == 20
    assert "sampling_seed" not in sampling_params_body(SamplingParams())


def test_sglang_error_replies_become_sample_errors(tiny_model_dir, sglang_peer):
    peer = sglang_peer()
    engine = _engine(tiny_model_dir, peer)
    try:
        results = queue.Queue()
        peer.routes["/generate"] = lambda body: (
            400,
            {"error": {"message": "Input length (9000 tokens) exceeds the maximum"}},
        )
        engine.submit([_request(0)], results.put)
        bad = results.get(timeout=10)
        peer.routes["/generate"] = lambda body: (
            400,
            {"object": "error", "message": "1 validation error", "type": "Bad Request", "code": 400},
        )
        engine.submit([_request(1)], results.put)
        invalid = results.get(timeout=10)
        peer.close()  # the server is gone: connection refused is retryable
        engine.submit([_request(2)], results.put)
        gone = results.get(timeout=10)
    finally:
        engine.stop()
    assert "HTTP 400: Input length (9000 tokens) exceeds the maximum" in bad.error and not bad.retryable
    assert "HTTP 400: 1 validation error" in invalid.error
    assert "no answer" in gone.error and gone.retryable


def test_pause_aborts_in_flight_requests_then_continues(tiny_model_dir, sglang_peer):
    peer = sglang_peer()
    peer.hold_generate = True
    engine = _engine(tiny_model_dir, peer)
    try:
        results = queue.Queue()
        engine.submit([_request(i, max_new_tokens=50) for i in range(3)], results.put)
        deadline = time.monotonic() + 10
        while len(peer.calls("/generate")) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.abort_all() == 3
        engine.pause()
        out = [results.get(timeout=10) for _ in range(3)]
        engine.resume()
    finally:
        engine.stop()
    assert all(r.finish_reason == "abort" and len(r.token_ids) == 2 for r in out)
    rids = sorted(b["rid"] for b in peer.calls("/generate"))
    assert sorted(b["rid"] for b in peer.calls("/abort_request")) == rids
    assert all(b["abort_all"] is False for b in peer.calls("/abort_request"))
    assert peer.calls("/pause_generation") == [{"mode": "abort"}]
    assert peer.calls("/continue_generation") == [{}]


def test_memory_and_weight_endpoints_send_sglang_bodies(tiny_model_dir, sglang_peer):
    peers = [sglang_peer(), sglang_peer()]
    engine = _engine(tiny_model_dir, *peers, rollout_num_gpus_per_engine=2)
    try:
        engine.release_memory(["weights", "kv_cache"])
        assert engine.weights_released
        engine.resume_memory(["weights", "kv_cache"])
        engine.flush_cache()
        engine.init_weights_update_group("10.0.0.1", 29500, 1, 5, "rollway", "nccl")
        engine.update_weights_from_distributed(["w"], ["bfloat16"], [[2, 3]], "rollway", weight_version=4)
        engine.update_weights_from_disk("/ckpt/step4", weight_version=4)
        peers[1].routes["/update_weights_from_distributed"] = lambda body: (
            400,
            {"success": False, "message": "Failed to update weights: shape mismatch for w"},
        )
        with pytest.raises(EngineError, match="shape mismatch for w"):
            engine.update_weights_from_distributed(["w"], ["bfloat16"], [[2, 3]], "rollway", weight_version=5)
        peers[0].routes["/flush_cache"] = lambda body: (400, "Cache not flushed: requests are running.\n")
        with pytest.raises(EngineError, match="HTTP 400: Cache not flushed"):
            engine.flush_cache()
    finally:
        engine.stop()
    assert engine.num_workers == 4
    for peer in peers:
        assert peer.calls("/release_memory_occupation") == [{"tags": ["weights", "kv_cache"]}]
        assert peer.calls("/resume_memory_occupation") == [{"tags": ["weights", "kv_cache"]}]
    offsets = [p.calls("/init_weights_update_group")[0]["rank_offset"] for p in peers]
    assert offsets == [1, 3]  # two tp=2 servers after the trainer's rank 0
    assert peers[0].calls("/init_weights_update_group")[0] == {
        "master_address": "10.0.0.1",
        "master_port": 29500,
        "rank_offset": 1,
        "world_size": 5,
        "group_name": "rollway",
        "backend": "nccl",
    }
    assert peers[0].calls("/update_weights_from_distributed")[0] == {
        "names": ["w"],
        "dtypes": ["bfloat16"],
        "shapes": [[2, 3]],
        "group_name": "rollway",
        "flush_cache": True,
        "weight_version": "4",
    }
    assert peers[0].calls("/update_weights_from_disk") == [
        {"model_path": "/ckpt/step4", "weight_version": "4", "flush_cache": False}
    ]
    # The cache is flushed after the load, once the server is idle (SGLang waits up to the timeout).
    paths = [path for _, path, _ in peers[0].requests]
    after_load = paths.index("/update_weights_from_disk") + 1
    assert paths[after_load] == "/flush_cache" and peers[0].queries[after_load] == "timeout=60"


def test_client_reports_unsuccessful_weight_updates_with_200(sglang_peer):
    peer = sglang_peer()
    peer.routes["/init_weights_update_group"] = lambda body: (
        200,
        {"success": False, "message": "group exists"},
    )
    with pytest.raises(SGLangHTTPError, match="group exists"):
        SGLangClient(peer.url).init_weights_update_group("h", 1, 1, 2, "g", "nccl")


def test_launch_command_follows_the_config():
    config = RolloutConfig(
        hf_checkpoint="/m",
        rollout_engine="sglang",
        rollout_num_gpus=4,
        rollout_num_gpus_per_engine=2,
        sglang_enable_memory_saver=True,
        sglang_extra_args=["--attention-backend", "fa3"],
        sglang_python="/venvs/sglang/bin/python",
        dtype="bfloat16",
    )
    command = launch_command(config, index=1, port=30001)
    # Under the guard (its launcher's pid, then the server's command), both on SGLang's interpreter.
    assert command[:4] == ["/venvs/sglang/bin/python", str(GUARD), str(os.getpid()), "--"]
    command = command[4:]
    assert command[:3] == ["/venvs/sglang/bin/python", "-m", "sglang.launch_server"]
    args = dict(zip(command[3::2], command[4::2], strict=False))
    assert args["--model-path"] == "/m" and args["--tp-size"] == "2" and args["--base-gpu-id"] == "2"
    assert (
        args["--port"] == "30001" and args["--dtype"] == "bfloat16" and args["--mem-fraction-static"] == "0.8"
    )
    assert command[-3:] == ["--enable-memory-saver", "--attention-backend", "fa3"]
