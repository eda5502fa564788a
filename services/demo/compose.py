"""The demo (`make run`) as deploy/docker-compose.yml runs it: one step per container.

    prepare WORKDIR        tiny model and data (made once per seed), configs/sft.yaml and
                           configs/grpo.yaml (rollway demo's settings, this demo's run ids; GRPO
                           starts from WORKDIR/sft-model)
    (sft services + `rollway run configs/sft.yaml --coordinator-addr ... --trainer-addr ...`)
    publish-sft WORKDIR    point WORKDIR/sft-model at the SFT run's Hugging Face export
    (grpo services + `rollway run configs/grpo.yaml ...`)
    summarize WORKDIR      summary.json and charts: held-out accuracy before and after RL

`rollway demo` does the same in one process; here every service is its own container, so the SFT
and GRPO services (different model and data) are separate containers started one after the other.

Every `prepare` names a new demo (DEMO_ID, a UTC time stamp by default): its runs are sft-DEMO_ID
and grpo-DEMO_ID, with their own run directories and exports. The services of a live stack keep
their state by run id, so a second demo on the same containers (`up` again, or the jobs with
`run`) is a new run for them, not a continuation of the last one; earlier runs stay on the volume.
publish-sft and summarize read the run ids back from the configs that prepare wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from pathlib import Path

import yaml


def new_demo_id() -> str:
    """A UTC time stamp and a random suffix: unique however often prepare runs, and sortable."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def prepare(
    workdir: Path, sft_steps: int, rl_steps: int, seed: int, demo_id: str | None = None
) -> dict[str, Path]:
    """Model, data and the two run configs of a new demo under `workdir` (earlier demos are kept)."""
    from rollway.demo.addition import grpo_config, sft_config
    from rollway.demo.data import make_demo_data
    from rollway.demo.tiny_model import make_tiny_model

    demo_id = demo_id or new_demo_id()
    # Made once per seed and never rewritten: services of a live stack may be reading them.
    model_dir = workdir / f"tiny-model-seed{seed}"
    if not (model_dir / "config.json").exists():
        make_tiny_model(model_dir, seed=seed)
    data_dir = workdir / f"data-seed{seed}"
    if not (data_dir / "eval.parquet").exists():
        make_demo_data(data_dir, seed=seed)
    sft = {**sft_config(workdir, model_dir, data_dir, sft_steps, seed), "run_id": f"sft-{demo_id}"}
    grpo = {
        **grpo_config(workdir, workdir / "sft-model", data_dir, rl_steps, seed),
        "run_id": f"grpo-{demo_id}",
    }
    for config in (sft, grpo):  # every demo on the volume its own checkpoints and exports (never resumed)
        config["save_hf"] = str(workdir / "exports" / config["run_id"])
        config["save"] = str(workdir / "runs" / config["run_id"] / "checkpoints")
    paths = {}
    for name, config in (("sft", sft), ("grpo", grpo)):
        paths[name] = workdir / "configs" / f"{name}.yaml"
        paths[name].parent.mkdir(parents=True, exist_ok=True)
        paths[name].write_text(yaml.safe_dump(config, sort_keys=False))
        print(f"{name} config: {paths[name]} (run {config['run_id']})", flush=True)
    return paths


def run_dir(workdir: Path, name: str) -> Path:
    """The run directory of this demo's `name` run (sft or grpo), from the config prepare wrote."""
    config = yaml.safe_load((workdir / "configs" / f"{name}.yaml").read_text())
    return Path(config["run_dir"]) / config["run_id"]


def publish_sft(workdir: Path) -> Path:
    """WORKDIR/sft-model -> the SFT run's HF export (a relative link: valid wherever the volume is)."""
    result = json.loads((run_dir(workdir, "sft") / "result.json").read_text())
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

    sft_dir, grpo_dir = run_dir(workdir, "sft"), run_dir(workdir, "grpo")
    metrics = [json.loads(line) for line in (grpo_dir / "metrics.jsonl").read_text().splitlines() if line]
    evals = [r for r in metrics if "eval/accuracy" in r]
    sft_result = json.loads((sft_dir / "result.json").read_text())
    grpo_result = json.loads((grpo_dir / "result.json").read_text())
    plots = plot_run(grpo_dir) + plot_run(sft_dir)
    summary = {
        "sft_run_id": sft_dir.name,
        "grpo_run_id": grpo_dir.name,
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rollway.demo.compose", description=__doc__.splitlines()[0]
    )
    parser.add_argument("step", choices=("prepare", "publish-sft", "summarize"))
    parser.add_argument("workdir", help="the demo directory on the shared volume")
    parser.add_argument("--sft-steps", type=int, default=250, help="SFT optimizer steps (prepare)")
    parser.add_argument("--rl-steps", type=int, default=160, help="GRPO rollouts (prepare)")
    parser.add_argument("--seed", type=int, default=0, help="seed of model, data and sampling (prepare)")
    parser.add_argument(
        "--demo-id", default="", help="names the runs sft-ID and grpo-ID (prepare; default: a new time stamp)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.step == "prepare":
        prepare(workdir, args.sft_steps, args.rl_steps, args.seed, args.demo_id or None)
    elif args.step == "publish-sft":
        publish_sft(workdir)
    else:
        summarize(workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
