"""GRPO on a cluster of network namespaces (rollway.deploy.netns_cluster): seconds per step with the
trainer, rollout and dataloader on three nodes against all three on one node, and the weight-sync
rate under a tbf rate limit against the limit. Needs root and iproute2.

What runs: the tiny model's GRPO run (`rollway run --launcher ray` in the head's namespace) on
    3 nodes          a head (0 CPUs) and three 1-CPU workers: one actor per node (PACK)
    1 node           a head (0 CPUs) and one 3-CPU worker: every actor on it
    3 nodes, tbf     as "3 nodes", every worker's egress limited to LIMIT (the weight group's
                     broadcast leaves trainer rank 0's node)
Figures per row (means over the steps after the first, which includes the first weight push):
    s_per_step               perf/step_time
    weight_sync_s            perf/weight_sync_time
    weight_sync_gb_per_s     perf/weight_sync_bytes / perf/weight_sync_time
    ratio_vs_limit           (tbf row) weight_sync_gb_per_s / the limit
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from bench.harness import BenchResult
from rollway.deploy.netns_cluster import NetnsCluster, unavailable_reason

LIMIT = "200mbit"
LIMIT_GB_PER_S = 200e6 / 8 / 1e9
RUN_TIMEOUT_S = 600


def grpo_config(root: Path, model: Path, data: Path, run_id: str, num_steps: int, reward: str) -> Path:
    config = root / f"{run_id}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run_id": run_id,
                "run_dir": str(root / "runs"),
                "hf_checkpoint": str(model),
                "prompt_data": [str(data / "rl.parquet")],
                "input_key": "prompt",
                "label_key": "label",
                "apply_chat_template": True,
                "rollout_batch_size": 4,
                "n_samples_per_prompt": 4,
                "global_batch_size": 16,
                "rollout_max_response_len": 6,
                "loss_type": "policy_loss",
                "advantage_estimator": "grpo",
                "rm_type": "custom",
                "custom_rm_path": reward,
                "lr": 1e-3,
                "num_rollout": num_steps,
            }
        )
    )
    return config


def run_on(cluster: NetnsCluster, config: Path, run_dir: Path) -> dict:
    """Run to its end in the head's namespace; the row of figures from its metrics."""
    log = config.with_suffix(".log")
    argv = [sys.executable, "-m", "rollway.cli", "run", str(config), "--launcher", "ray",
            "--ray-address", cluster.ray_address]  # fmt: skip
    with log.open("w") as out:
        process = cluster.run_in(0, argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        code = process.wait(RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)
        raise RuntimeError(f"{config.stem} did not end within {RUN_TIMEOUT_S}s: {log}") from None
    if code != 0:
        raise RuntimeError(f"{config.stem} exited with {code}:\n{log.read_text()[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][1:]
    nodes = json.loads((run_dir / "services" / "ray.json").read_text())["actors"]
    rates = [r["perf/weight_sync_bytes"] / r["perf/weight_sync_time"] / 1e9 for r in records]
    return {
        "num_nodes_used": len({a["node"] for a in nodes.values()}),
        "s_per_step": round(statistics.mean(r["perf/step_time"] for r in records), 3),
        "weight_sync_s": round(statistics.mean(r["perf/weight_sync_time"] for r in records), 4),
        "weight_sync_mb": round(records[-1]["perf/weight_sync_bytes"] / 1e6, 2),
        "weight_sync_gb_per_s": round(statistics.mean(rates), 4),
    }


def run(quick: bool) -> BenchResult:
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"bench_cluster needs network namespaces: {reason}")
    from rollway.demo.data import make_demo_data, write_digit_share_reward
    from rollway.demo.tiny_model import make_tiny_model

    num_steps = 6 if quick else 20
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        root = Path(tmp)
        model = make_tiny_model(root / "model", seed=0)
        make_demo_data(root / "data", seed=0)
        reward = write_digit_share_reward(root / "reward", "cluster_bench_reward")
        pythonpath = os.pathsep.join(filter(None, [str(root / "reward"), os.environ.get("PYTHONPATH", "")]))
        env = {"PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}  # every actor inherits its raylet's
        layouts = [("3 nodes", dict(num_workers=3)), ("1 node", dict(num_workers=1, worker_cpus=3))]
        for layout, shape in layouts:
            with NetnsCluster(**shape, env=env) as cluster:
                name = layout.replace(" ", "-")
                config = grpo_config(root, model, root / "data", name, num_steps, reward)
                rows.append({"layout": layout, **run_on(cluster, config, root / "runs" / name)})
                if layout == "3 nodes":
                    for node in cluster.nodes[1:]:
                        cluster.rate_limit(node.index, LIMIT)
                    config = grpo_config(root, model, root / "data", "tbf", num_steps, reward)
                    row = {
                        "layout": f"3 nodes, egress tbf {LIMIT}",
                        **run_on(cluster, config, root / "runs" / "tbf"),
                    }
                    row["ratio_vs_limit"] = round(row["weight_sync_gb_per_s"] / LIMIT_GB_PER_S, 3)
                    rows.append(row)
    three, one = rows[0], rows[2]
    return BenchResult(
        name="cluster",
        rows=rows,
        units={
            "s_per_step": "s",
            "weight_sync_s": "s",
            "weight_sync_mb": "MB",
            "weight_sync_gb_per_s": "GB/s",
        },
        config={"model": "tiny", "num_steps": num_steps, "limit": LIMIT, "limit_gb_per_s": LIMIT_GB_PER_S},
        summary={
            "s_per_step_3_nodes_vs_1": round(three["s_per_step"] / one["s_per_step"], 3),
            "tbf_ratio_vs_limit": rows[1]["ratio_vs_limit"],
        },
        notes="all nodes share this machine's cores: the 3-node layout measures the network path, not more compute",
    )
