"""The demo (`make run`) as deploy/docker-compose.yml runs it: one step per container.

    prepare WORKDIR        tiny model, data, configs/sft.yaml and configs/grpo.yaml (rollway demo's
                           settings; GRPO starts from WORKDIR/sft-model)
    (sft services + `rollway run configs/sft.yaml --coordinator-addr ... --trainer-addr ...`)
    publish-sft WORKDIR    point WORKDIR/sft-model at the SFT run's Hugging Face export
    (grpo services + `rollway run configs/grpo.yaml ...`)
    summarize WORKDIR      summary.json and charts: held-out accuracy before and after RL

`rollway demo` does the same in one process; here every service is its own container, so the SFT
and GRPO services (different model and data) are separate containers started one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import yaml


def prepare(workdir: Path, sft_steps: int, rl_steps: int, seed: int) -> dict[str, Path]:
    """Model, data and the two run configs under `workdir` (earlier demo runs there are removed)."""
    from rollway.common.demo_data import make_demo_data
    from rollway.common.tiny_model import make_tiny_model
    from rollway.demo import grpo_config, sft_config

    for stale in ("runs", "sft-export", "grpo-export", "summary.json"):
        path = workdir / stale
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    (workdir / "sft-model").unlink(missing_ok=True)
    model_dir = workdir / "tiny-model"
    if not (model_dir / "config.json").exists():
        make_tiny_model(model_dir, seed=seed)
    data_dir = workdir / "data"
    make_demo_data(data_dir, seed=seed)
    configs = {
        "sft": sft_config(workdir, model_dir, data_dir, sft_steps, seed),
        "grpo": grpo_config(workdir, workdir / "sft-model", data_dir, rl_steps, seed),
    }
    paths = {}
    for name, config in configs.items():
        paths[name] = workdir / "configs" / f"{name}.yaml"
        paths[name].parent.mkdir(parents=True, exist_ok=True)
        paths[name].write_text(yaml.safe_dump(config, sort_keys=False))
        print(f"{name} config: {paths[name]}", flush=True)
    return paths


def publish_sft(workdir: Path) -> Path:
    """WORKDIR/sft-model -> the SFT run's HF export (a relative link: valid wherever the volume is)."""
    result = json.loads((workdir / "runs" / "sft" / "result.json").read_text())
    export = Path(result["hf_export_dir"])
    if not (export / "config.json").is_file():
        raise FileNotFoundError(f"the SFT run's export {export} has no config.json")
    link = workdir / "sft-model"
    link.unlink(missing_ok=True)
    link.symlink_to(os.path.relpath(export, workdir))
    print(f"sft-model -> {export}", flush=True)
    return link


def summarize(workdir: Path) -> dict:
    """summary.json with the fields `rollway demo` writes (accuracy before and after RL, ...)."""
    from rollway.coordinator.plot import plot_run

    runs = workdir / "runs"
    metrics = [
        json.loads(line) for line in (runs / "grpo" / "metrics.jsonl").read_text().splitlines() if line
    ]
    evals = [r for r in metrics if "eval/accuracy" in r]
    sft_result = json.loads((runs / "sft" / "result.json").read_text())
    grpo_result = json.loads((runs / "grpo" / "result.json").read_text())
    plots = plot_run(runs / "grpo") + plot_run(runs / "sft")
    summary = {
        "accuracy_before_rl": evals[0]["eval/accuracy"],
        "accuracy_after_rl": evals[-1]["eval/accuracy"],
        "rl_steps": max(r["step"] for r in metrics if "train/loss" in r) + 1,
        "sft_final_loss": sft_result["final_metrics"].get("sft/loss"),
        "run_dir": str(workdir),
        "hf_export": grpo_result["hf_export_dir"],
        "plots": [str(p) for p in plots],
    }
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"held-out accuracy before RL: {summary['accuracy_before_rl']:.3f}")
    print(
        f"held-out accuracy after RL:  {summary['accuracy_after_rl']:.3f}  ({summary['rl_steps']} GRPO steps)"
    )
    print(f"summary: {workdir / 'summary.json'}", flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rollway.deploy.compose_demo", description=__doc__.splitlines()[0]
    )
    parser.add_argument("step", choices=("prepare", "publish-sft", "summarize"))
    parser.add_argument("workdir", help="the demo directory on the shared volume")
    parser.add_argument("--sft-steps", type=int, default=500, help="SFT optimizer steps (prepare)")
    parser.add_argument("--rl-steps", type=int, default=30, help="GRPO rollouts (prepare)")
    parser.add_argument("--seed", type=int, default=0, help="seed of model, data and sampling (prepare)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.step == "prepare":
        prepare(workdir, args.sft_steps, args.rl_steps, args.seed)
    elif args.step == "publish-sft":
        publish_sft(workdir)
    else:
        summarize(workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
