"""Memory of `rollway gateway` serving N LoRA models of one base model: shared (the default: one
trainer holds the base once, each model is a named adapter of it) against one trainer per model
(`--no-share-lora-base`, the behaviour before LoRA tenants shared a base).

    total_rss_mib   resident memory of the gateway and every process below it (its trainers),
                    summed, once each of the N models has run forward_backward + optim_step
                    (so its gradients came and went and its AdamW state exists)
    trainers        trainer processes below the gateway
    concurrent_step_seconds   all N models' forward_backward + optim_step in flight at once

One gateway per (model, mode); models are added one at a time and measured at each N.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.harness import BenchResult

TOKEN = "tml-rollway-bench"
RANK = 8
MIB = 2**20


def resident_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0


def _measure(model: Path, work: Path, share: bool, counts: list[int]) -> list[dict]:
    import tinker
    from tinker import types

    from rollway.common.supervision.service_process import ServiceProcess
    from rollway.deploy.chaos import descendants

    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 40, 41, 50, 51]),
        loss_fn_inputs={"target_tokens": [40, 41, 50, 51, 2], "weights": [1.0] * 5},
    )
    adam = types.AdamParams(learning_rate=1e-3, eps=1e-8)
    flags = ["--share-lora-base" if share else "--no-share-lora-base", "--max-models", str(max(counts))]
    args = ["--token", TOKEN, "--workdir", str(work / "gateway"), *flags]
    rows = []
    with ServiceProcess("gateway", args, work, module="rollway.gateway", wait_serving=False) as gw:
        service = tinker.ServiceClient(base_url=f"http://127.0.0.1:{gw.port}", api_key=TOKEN)
        clients = []
        for count in counts:
            started = time.perf_counter()
            while len(clients) < count:
                training = service.create_lora_training_client(base_model=str(model), rank=RANK).result()
                training.forward_backward([datum], "cross_entropy").result()
                training.optim_step(adam).result()
                clients.append(training)
            added = time.perf_counter() - started
            # Then every model steps at once (the SDK's futures): N tenants' calls in flight together.
            started = time.perf_counter()
            futures = [
                f for t in clients for f in (t.forward_backward([datum], "cross_entropy"), t.optim_step(adam))
            ]
            for future in futures:
                future.result()
            concurrent_step = time.perf_counter() - started
            tree = descendants(gw.pid)
            total = resident_bytes(gw.pid) + sum(resident_bytes(pid) for pid in tree)
            rows.append(
                {
                    "model": model.name,
                    "mode": "shared" if share else "trainer_each",
                    "lora_tenants": count,
                    "trainers": sum("rollway.trainer" in cmd for cmd in tree.values()),
                    "total_rss_mib": round(total / MIB, 1),
                    "add_seconds": round(added, 1),
                    "concurrent_step_seconds": round(concurrent_step, 2),
                }
            )
        service.close("success").result()
    return rows


def run(quick: bool) -> BenchResult:
    from rollway.demo.tiny_model import make_tiny_model

    presets = ["tiny"] if quick else ["tiny", "small"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for preset in presets:
            model = make_tiny_model(work / preset, seed=0, preset=preset)
            rows += _measure(model, work / f"{preset}-shared", True, [1, 4, 8])
            rows += _measure(model, work / f"{preset}-each", False, [1, 4, 8])
    return BenchResult(
        name="lora_tenants",
        rows=rows,
        units={
            "total_rss_mib": "MiB (gateway + its processes)",
            "add_seconds": "s (adding the models of this row)",
        },
        config={"lora_rank": RANK, "dtype": "float32", "device": "CPU", "presets": presets},
        notes="shared: one trainer per (base model, LoRA rank); trainer_each: --no-share-lora-base",
    )
