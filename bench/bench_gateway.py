"""Per-call overhead of `rollway gateway` (the Tinker API): the unmodified tinker SDK through the
gateway's HTTP + futures + gRPC against the same calls made straight to the tenant's trainer over
gRPC, and against the trainer's own compute (its ForwardBackward with nothing but the model).

    sdk_via_gateway   tinker SDK -> HTTP -> gateway -> gRPC -> trainer, .result() waited
    grpc_direct       trainer_pb2 request -> gRPC -> the same trainer

Same tenant, same batch (BATCH datums of SEQ_LEN tokens, cross_entropy) and the same trainer
process; calls alternate so the machine's load falls on both alike. overhead_ms is each call's
median minus grpc_direct's: what the gateway adds.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from bench.harness import BenchResult

TOKEN = "tml-rollway-bench"
BATCH, SEQ_LEN = 4, 64


def _median_ms(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def run(quick: bool) -> BenchResult:
    import tinker
    from tinker import types

    from rollway.common.client import open_channel
    from rollway.common.supervision.service_process import ServiceProcess
    from rollway.demo.tiny_model import make_tiny_model
    from rollway.trainer.v1 import trainer_pb2, trainer_pb2_grpc

    rounds = 5 if quick else 30
    tokens = [[1 + (7 * k + i) % 300 for i in range(SEQ_LEN)] for k in range(BATCH)]
    sdk_data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(t[:-1]),
            loss_fn_inputs={"target_tokens": t[1:], "weights": [1.0] * (SEQ_LEN - 1)},
        )
        for t in tokens
    ]
    grpc_data = [
        trainer_pb2.Datum(token_ids=t[:-1], target_token_ids=t[1:], weights=[1.0] * (SEQ_LEN - 1))
        for t in tokens
    ]
    adam = types.AdamParams(learning_rate=1e-5, eps=1e-8)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = make_tiny_model(work / "model", seed=0)
        args = ["--token", TOKEN, "--workdir", str(work / "gateway")]
        with ServiceProcess("gateway", args, work, module="rollway.gateway", wait_serving=False) as gw:
            base_url = f"http://127.0.0.1:{gw.port}"
            service = tinker.ServiceClient(base_url=base_url, api_key=TOKEN)
            training = service.create_lora_training_client(base_model=str(model), rank=0).result()
            port_file = next((work / "gateway" / training.model_id / "services").glob("trainer-*.port"))
            trainer = trainer_pb2_grpc.TrainerServiceStub(open_channel(f"127.0.0.1:{port_file.read_text()}"))
            rest = tinker.RestClient(base_url=base_url, api_key=TOKEN)
            calls = {
                "forward": (
                    lambda: training.forward(sdk_data, "cross_entropy").result(),
                    lambda: trainer.ForwardBackward(
                        trainer_pb2.ForwardBackwardRequest(
                            loss_fn="cross_entropy", forward_only=True, data=grpc_data
                        )
                    ),
                ),
                "forward_backward": (
                    lambda: training.forward_backward(sdk_data, "cross_entropy").result(),
                    lambda: trainer.ForwardBackward(
                        trainer_pb2.ForwardBackwardRequest(loss_fn="cross_entropy", data=grpc_data)
                    ),
                ),
                "optim_step": (
                    lambda: training.optim_step(adam).result(),
                    lambda: trainer.OptimStep(
                        trainer_pb2.OptimStepRequest(learning_rate=1e-5, beta1=0.9, beta2=0.95, eps=1e-8)
                    ),
                ),
                "get_training_run": (lambda: rest.get_training_run(training.model_id).result(), None),
            }
            rows = []
            for name, (via_sdk, direct) in calls.items():
                via_sdk(), direct and direct()  # warm-up
                sdk_ms = _median_ms(via_sdk, rounds)
                grpc_ms = _median_ms(direct, rounds) if direct else 0.0
                rows.append(
                    {
                        "call": name,
                        "sdk_via_gateway_ms": round(sdk_ms, 2),
                        "grpc_direct_ms": round(grpc_ms, 2),
                        "overhead_ms": round(sdk_ms - grpc_ms, 2),
                    }
                )
            # The first sampling client starts its base model's rollout service (base_rollouts.py);
            # every later export is loaded into that service: the cost an RL loop pays once per step.
            prompt, params = sdk_data[0].model_input, types.SamplingParams(max_tokens=4)
            started = time.perf_counter()
            path = training.save_weights_for_sampler("bench").result().path
            sampler = service.create_sampling_client(model_path=path).result()
            sampler.sample(prompt, 1, params).result()
            first_sample_ms = (time.perf_counter() - started) * 1000
            started = time.perf_counter()
            sampler.sample(prompt, 1, params).result()
            next_sample_ms = (time.perf_counter() - started) * 1000
            new_export_ms, save_ms = [], []
            for k in range(3 if quick else 10):
                training.forward_backward(sdk_data, "cross_entropy")
                training.optim_step(adam).result()  # new weights for each export
                started = time.perf_counter()
                path = training.save_weights_for_sampler(f"bench-{k}").result().path
                saved = time.perf_counter()
                service.create_sampling_client(model_path=path).result().sample(prompt, 1, params).result()
                save_ms.append((saved - started) * 1000)
                new_export_ms.append((time.perf_counter() - saved) * 1000)
            service.close("success").result()
    return BenchResult(
        name="gateway",
        rows=rows,
        units={"sdk_via_gateway_ms": "ms (median)", "grpc_direct_ms": "ms (median)", "overhead_ms": "ms"},
        config={"batch": BATCH, "seq_len": SEQ_LEN, "rounds": rounds, "model": "tiny Qwen3 (CPU, float32)"},
        notes="get_training_run is answered by the gateway alone (no trainer call): the SDK + HTTP cost.",
        summary={
            "save_for_sampler_and_first_sample_ms": round(first_sample_ms, 1),
            "next_sample_ms": round(next_sample_ms, 1),
            # create_sampling_client + first sample of a further export, and its save (median)
            "new_export_first_sample_ms": round(statistics.median(new_export_ms), 1),
            "new_export_save_ms": round(statistics.median(save_ms), 1),
        },
    )
