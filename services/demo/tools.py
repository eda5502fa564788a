"""`rollway demo --task tools`: the tiny model learns to call the calculator for sums it cannot do alone.

    3-4 digit additions ──> SFT "direct" (answer alone)        ──> eval, no tools  : accuracy_without_tools
                       └──> SFT "tools" (call the calculator,  ──> eval with tools : accuracy_after_sft
                            then answer with its result)       ──> GRPO, episodes with the calculator
                                                                   ──> eval with tools : accuracy_after_rl

The tool conversations are Qwen3's: the assistant writes <tool_call>{"name": "calculator",
"arguments": {"expression": "1234 + 567"}}</tool_call>, the tool turn holds the result, the
assistant answers with it. GRPO runs each rollout as an episode against the built-in calculator
environment (--environment calculator): the reward is 1 when the final turn equals the sum.
With --agent openai the GRPO episodes are run instead by an agent written against the `openai`
client (demo_openai_agent.py) through the rollout service's OpenAI-compatible endpoint
(--environment agent): same task, same reward, the agent's own tool loop. --sft-from DEMO_DIR reuses
an earlier demo's data, SFT models and their accuracies: only GRPO and its evaluation run.
Evaluations are greedy, on held-out pairs, through a rollout service started for each model.
Runs go through `rollway run` with configs in DEMO_DIR/configs/; summary.json holds the three
accuracies.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from rollway.deploy.launcher import run as launch_run

MIN_OPERAND, MAX_OPERAND = 100, 9999
EVAL_BATCH = 256


def question(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


def make_tool_data(
    out_dir: Path, seed: int, num_sft: int = 3000, num_rl: int = 2000, num_eval: int = 200
) -> None:
    """sft_tools / sft_direct (messages), rl / eval (prompt, label) as jsonl; disjoint pairs."""
    from rollway.rollout.environments.tool_calls import format_tool_call

    rng = random.Random(seed)
    pairs: set[tuple[int, int]] = set()
    while len(pairs) < num_sft + num_rl + num_eval:
        pairs.add((rng.randint(MIN_OPERAND, MAX_OPERAND), rng.randint(MIN_OPERAND, MAX_OPERAND)))
    ordered = sorted(pairs)
    rng.shuffle(ordered)
    sft, rl, held_out = ordered[:num_sft], ordered[num_sft : num_sft + num_rl], ordered[num_sft + num_rl :]
    out_dir.mkdir(parents=True, exist_ok=True)

    def write(name: str, rows: list[dict]) -> None:
        (out_dir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    call = lambda a, b: format_tool_call("calculator", {"expression": f"{a} + {b}"})  # noqa: E731
    write(
        "sft_tools",
        [
            {
                "messages": [
                    {"role": "user", "content": question(a, b)},
                    {"role": "assistant", "content": call(a, b)},
                    {"role": "tool", "content": str(a + b)},
                    {"role": "assistant", "content": str(a + b)},
                ]
            }
            for a, b in sft
        ],
    )
    write(
        "sft_direct",
        [
            {
                "messages": [
                    {"role": "user", "content": question(a, b)},
                    {"role": "assistant", "content": str(a + b)},
                ]
            }
            for a, b in sft
        ],
    )
    write("rl", [{"prompt": question(a, b), "label": str(a + b)} for a, b in rl])
    write("eval", [{"prompt": question(a, b), "label": str(a + b)} for a, b in held_out])


def sft_config(workdir: Path, model_dir: Path, data: Path, name: str, steps: int, seed: int) -> dict:
    return {
        "run_id": f"sft-{name}",
        "run_dir": str(workdir / "runs"),
        "hf_checkpoint": str(model_dir),
        "loss_type": "sft_loss",
        "prompt_data": [str(data)],
        "input_key": "messages",
        "apply_chat_template": True,
        "rollout_shuffle": True,
        "num_epoch": 0,
        "rollout_seed": seed,
        "num_rollout": steps,
        "rollout_batch_size": 32,
        "global_batch_size": 32,
        "lr": 3e-3,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 8192,
        "seed": seed,
        "save_hf": str(workdir / f"sft-{name}-export"),
    }


# The GRPO run's episodes: the built-in calculator environment, or the openai-client agent.
AGENTS = ("builtin", "openai")
OPENAI_AGENT = "rollway.demo.openai_agent:calculator_agent"


def grpo_config(
    workdir: Path, sft_model: Path, data_dir: Path, steps: int, seed: int, agent: str = "builtin"
) -> dict:
    config = {
        "run_id": "grpo-tools",
        "run_dir": str(workdir / "runs"),
        "hf_checkpoint": str(sft_model),
        "loss_type": "policy_loss",
        "advantage_estimator": "grpo",
        "prompt_data": [str(data_dir / "rl.jsonl")],
        "input_key": "prompt",
        "label_key": "label",
        "apply_chat_template": True,
        "rollout_shuffle": True,
        "num_epoch": 0,
        "rollout_seed": seed,
        "num_rollout": steps,
        "rollout_batch_size": 8,
        "n_samples_per_prompt": 8,
        "global_batch_size": 64,
        "rollout_temperature": 1.0,
        "rollout_max_response_len": 112,  # per model turn: a tool call is ~80 byte-level tokens
        "environment": "calculator",
        "generate_max_turns": 3,
        "lr": 3e-4,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 16384,
        "seed": seed,
        "save_hf": str(workdir / "grpo-tools-export"),
    }
    if agent == "openai":
        # The agent writes the chat messages itself (its first request is the sample's prompt), and
        # each live episode holds an environment worker: one per sample of a rollout.
        config.update(
            environment="agent",
            agent_function_path=OPENAI_AGENT,
            apply_chat_template=False,
            num_environment_workers=config["rollout_batch_size"] * config["n_samples_per_prompt"],
        )
    return config


def evaluate(model_dir: Path, eval_path: Path, environment: str, workdir: Path) -> float:
    """Greedy accuracy on the held-out sums, through a rollout service serving `model_dir`."""
    from rollway.common.client import open_channel
    from rollway.common.supervision.service_process import ServiceProcess
    from rollway.common.v1 import common_pb2
    from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc

    rows = [json.loads(line) for line in eval_path.read_text().splitlines() if line.strip()]
    args = [
        "--hf-checkpoint", str(model_dir),
        "--environment", environment,
        "--reward", "exact_match",
        "--generate-max-turns", "3",
    ]  # fmt: skip
    correct = 0.0
    with ServiceProcess("rollout", args, workdir / "eval-services") as svc:
        stub = rollout_pb2_grpc.RolloutServiceStub(open_channel(svc.address))
        for start in range(0, len(rows), EVAL_BATCH):
            batch = rows[start : start + EVAL_BATCH]
            request = rollout_pb2.GenerateRequest(
                prompts=[
                    rollout_pb2.Prompt(
                        messages=[rollout_pb2.ChatMessage(role="user", content=r["prompt"])], label=r["label"]
                    )
                    for r in batch
                ],
                n_samples_per_prompt=1,
                sampling_params=common_pb2.SamplingParams(temperature=0.0, max_new_tokens=112),
                request_id=f"eval-{environment}-{start}",
            )
            correct += sum(reply.sample.reward for reply in stub.Generate(request, timeout=600))
    return correct / len(rows)


def _write(path: Path, config: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _export_of(demo_dir: Path, run_id: str) -> Path:
    """The HF export of a finished run of the demo (its result.json names it)."""
    return Path(json.loads((demo_dir / "runs" / run_id / "result.json").read_text())["hf_export_dir"])


def _sft(workdir: Path, model_dir: Path, data: Path, name: str, steps: int, seed: int) -> Path | None:
    print(f"== SFT ({name}): {steps} steps", flush=True)
    config = _write(
        workdir / "configs" / f"sft-{name}.yaml", sft_config(workdir, model_dir, data, name, steps, seed)
    )
    if launch_run([str(config)]) != 0:
        return None
    return _export_of(workdir, f"sft-{name}")


def _reuse_sft(earlier: Path, args: argparse.Namespace) -> tuple[Path, Path, Path, dict[str, float]] | None:
    """An earlier demo's data, SFT exports and SFT accuracies; `args` take its SFT settings."""
    summary_path = earlier / "summary.json"
    if not summary_path.exists():
        print(f"--sft-from {earlier}: no summary.json (not a finished tools demo)", flush=True)
        return None
    summary = json.loads(summary_path.read_text())
    # The summary describes the models it reports on: the SFT steps, seed and held-out sums reused.
    args.sft_steps, args.num_eval, args.seed = summary["sft_steps"], summary["num_eval"], summary["seed"]
    direct, tools = (_export_of(earlier, f"sft-{name}") for name in ("direct", "tools"))
    reused = {key: summary[key] for key in ("accuracy_without_tools", "accuracy_after_sft")}
    return earlier / "data", direct, tools, reused


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollway demo --task tools", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/demo-tools", help="parent of the demo directory")
    parser.add_argument("--seed", type=int, default=0, help="seed of model, data and sampling")
    parser.add_argument(
        "--sft-steps", type=int, default=500, help="SFT optimizer steps (each of the two SFT runs)"
    )
    parser.add_argument("--rl-steps", type=int, default=24, help="GRPO rollouts with the calculator")
    parser.add_argument("--num-eval", type=int, default=200, help="held-out sums evaluated")
    parser.add_argument(
        "--agent",
        choices=AGENTS,
        default="builtin",
        help="who runs the GRPO episodes: the built-in calculator environment, or an agent written "
        "against the openai client through the OpenAI-compatible endpoint",
    )
    parser.add_argument(
        "--sft-from",
        default=None,
        metavar="DEMO_DIR",
        help="an earlier tools demo's directory: reuse its data, its two SFT models and their "
        "accuracies, and run only GRPO (e.g. with another --agent) and its evaluation",
    )
    return parser


def _held_out_accuracies(models: dict, data_dir: Path, workdir: Path) -> dict[str, float]:
    """Greedy held-out accuracy of each (model, environment), each through its own rollout
    service, at once."""
    with ThreadPoolExecutor(len(models)) as pool:
        futures = {
            key: pool.submit(evaluate, model, data_dir / "eval.jsonl", env, workdir)
            for key, (model, env) in models.items()
        }
    return {key: future.result() for key, future in futures.items()}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    start = time.monotonic()
    workdir = (Path(args.workdir) / time.strftime("%Y%m%d-%H%M%S")).resolve()
    if args.sft_from:
        earlier = _reuse_sft(Path(args.sft_from).resolve(), args)
        if earlier is None:
            return 1
        data_dir, direct, tools, reused = earlier
        print(f"demo directory: {workdir} (SFT from {args.sft_from})", flush=True)
    else:
        from rollway.demo.tiny_model import make_tiny_model

        model_dir = make_tiny_model(workdir / "tiny-model", seed=args.seed)
        data_dir = workdir / "data"
        make_tool_data(data_dir, args.seed, num_eval=args.num_eval)
        print(f"demo directory: {workdir}", flush=True)
        direct = _sft(workdir, model_dir, data_dir / "sft_direct.jsonl", "direct", args.sft_steps, args.seed)
        tools = _sft(workdir, model_dir, data_dir / "sft_tools.jsonl", "tools", args.sft_steps, args.seed)
        if direct is None or tools is None:
            return 1
        reused = {}
    print(f"== GRPO with the calculator ({args.agent} agent): {args.rl_steps} rollouts", flush=True)
    grpo = _write(
        workdir / "configs" / "grpo-tools.yaml",
        grpo_config(workdir, tools, data_dir, args.rl_steps, args.seed, args.agent),
    )
    if launch_run([str(grpo)]) != 0:
        return 1
    rl_model = _export_of(workdir, "grpo-tools")
    print("== evaluating on held-out sums", flush=True)
    evaluations = {
        "accuracy_without_tools": (direct, "none"),
        "accuracy_after_sft": (tools, "calculator"),
        "accuracy_after_rl": (rl_model, "calculator"),
    }
    for key in reused:  # the same models on the same held-out sums: their greedy answers are known
        del evaluations[key]
    summary = {
        **reused,
        **_held_out_accuracies(evaluations, data_dir, workdir),
        "sft_steps": args.sft_steps,
        "rl_steps": args.rl_steps,
        "num_eval": args.num_eval,
        "agent": args.agent,
        "wall_seconds": round(time.monotonic() - start, 1),
        "run_dir": str(workdir),
        "seed": args.seed,
    }
    summary_path = workdir / "summary.json"
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"held-out accuracy without tools (SFT to answer directly): {summary['accuracy_without_tools']:.3f}"
    )
    print(f"held-out accuracy with the calculator after SFT:          {summary['accuracy_after_sft']:.3f}")
    print(f"held-out accuracy with the calculator after RL:           {summary['accuracy_after_rl']:.3f}")
    print(f"summary: {summary_path}")
    return 0
