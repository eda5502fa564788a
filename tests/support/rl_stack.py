"""The services of a GRPO run as real processes, and the run config that uses them (e2e tests)."""

from __future__ import annotations

import os
from contextlib import ExitStack

from support.processes import ServiceProcess, start_together

# A reward with variance on a random tiny model: 1 if the first response token id is even.
REWARD_MODULE = """
def parity(sample):
    return 1.0 if sample.response_token_ids and sample.response_token_ids[0] % 2 == 0 else 0.0
"""


def start_rl_stack(
    stack: ExitStack,
    workdir,
    model_dir,
    data_dir,
    *,
    rollout: bool = True,
    rollout_args: tuple[str, ...] = (),
) -> dict[str, ServiceProcess]:
    (workdir / "rewards").mkdir(parents=True, exist_ok=True)
    (workdir / "rewards" / "parity_reward.py").write_text(REWARD_MODULE)
    args = {
        "dataloader": [
            "--hf-checkpoint",
            str(model_dir),
            "--prompt-data",
            str(data_dir / "rl.parquet"),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--apply-chat-template",
            "--num-epoch",
            "0",
        ],
        "trainer": [
            "--hf-checkpoint",
            str(model_dir),
            "--lr",
            "1e-3",
            "--use-dynamic-batch-size",
            "--max-tokens-per-gpu",
            "4096",
            "--seed",
            "3",
        ],
    }
    if rollout:
        args["rollout"] = [
            "--hf-checkpoint",
            str(model_dir),
            "--custom-rm-path",
            "parity_reward:parity",
            *rollout_args,
        ]
    env = {"PYTHONPATH": str(workdir / "rewards") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    services = {name: ServiceProcess(name, a, workdir, env=env) for name, a in args.items()}
    services["coordinator"] = ServiceProcess("coordinator", ["--runs-root", str(workdir / "runs")], workdir)
    return start_together(stack, services)


def rl_config(services, **extra) -> dict:
    config = {
        "loss_type": "policy_loss",
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 4,
        "global_batch_size": 16,
        "rollout_max_response_len": 4,
        "rollout_temperature": 1.0,
        "rm_type": "custom",
        "num_rollout": 3,
        "dataloader_addr": services["dataloader"].address,
        "trainer_addr": services["trainer"].address,
    }
    if "rollout" in services:
        config["rollout_addr"] = [services["rollout"].address]
    return {**config, **extra}
