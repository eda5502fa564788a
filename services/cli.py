"""The `rollway` command line.

    rollway serve SERVICE [flags]      run one service (same as python -m rollway.SERVICE)
    rollway make-tiny-model DIR        write the tiny Qwen3 model, tokenizer and demo datasets
    rollway import-gguf FILE DIR       a GGUF file (llama.cpp's format) to a Hugging Face directory
    rollway up [--workdir DIR]         start the four services locally and check they are healthy
    rollway run CONFIG [flags]         run a job (starts the services it needs, or attaches)
    rollway plan CONFIG [flags]        print the batch arithmetic of a run config
    rollway plot RUN_DIR               write PNG charts of a run's metrics
    rollway dashboard RUN_DIR...       serve the web dashboard of finished runs (or folders of runs)
    rollway gateway [flags]            serve the Tinker training API (the tinker SDK) on loopback
    rollway demo                       SFT then GRPO on the tiny model (what `make run` runs)
    rollway demo --model smollm2       GRPO with a real pretrained model (`make run-smollm2`)

Subcommands import their heavy dependencies only when they run, so `rollway --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SERVICES = ("dataloader", "rollout", "trainer", "coordinator")


def _gateway(argv: list[str]) -> int:
    from rollway.gateway.__main__ import main

    return main(argv)


def _serve(argv: list[str]) -> int:
    if not argv or argv[0] not in SERVICES:
        asked = bool(argv) and argv[0] in ("-h", "--help")
        print(
            f"usage: rollway serve {{{','.join(SERVICES)}}} [flags]\n"
            "`rollway serve SERVICE --help` lists that service's flags.",
            file=sys.stdout if asked else sys.stderr,
        )
        return 0 if asked else 2
    importlib.import_module(f"rollway.{argv[0]}.__main__").main(argv[1:])
    return 0


def _import_gguf(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="rollway import-gguf",
        description="Convert a GGUF file (llama.cpp's format) into a Hugging Face model directory "
        "(fp32 safetensors, tokenizer, chat template) that rollway's services load.",
    )
    parser.add_argument("file", help="the .gguf file")
    parser.add_argument("dir", help="the new model directory (must not hold files yet)")
    args = parser.parse_args(argv)
    import json

    from rollway.common.gguf_import import GgufImportError, import_gguf

    try:
        written = import_gguf(args.file, args.dir)
    except GgufImportError as exc:
        print(f"rollway import-gguf: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(written, indent=1))
    return 0


def _make_tiny_model(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="rollway make-tiny-model",
        description="Write the tiny model, its tokenizer and the demo datasets.",
    )
    parser.add_argument("dir", help="output directory (model files; datasets go to DIR/data)")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and data")
    parser.add_argument("--preset", default="tiny", help="model size preset (tiny ~1M params, small ~50M)")
    parser.add_argument("--no-data", action="store_true", help="write only the model and tokenizer")
    args = parser.parse_args(argv)
    from pathlib import Path

    from rollway.demo.data import make_demo_data
    from rollway.demo.tiny_model import make_tiny_model

    model_dir = make_tiny_model(Path(args.dir), seed=args.seed, preset=args.preset)
    print(f"model: {model_dir}")
    if not args.no_data:
        for name, path in make_demo_data(Path(args.dir) / "data", seed=args.seed).items():
            print(f"{name}: {path}")
    return 0


def _up(argv: list[str]) -> int:
    from rollway.demo.data import ensure_demo_assets
    from rollway.deploy.local_processes import main as up_main

    return up_main(argv, prepare_assets=ensure_demo_assets)


def _run(argv: list[str]) -> int:
    from rollway.deploy.launcher import run

    return run(argv)


def _plan(argv: list[str]) -> int:
    from rollway.deploy.launcher import plan_main

    return plan_main(argv)


def _plot(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rollway plot", description="Write PNG charts of a run's metrics.")
    parser.add_argument("run_dir", help="run directory holding metrics.jsonl")
    parser.add_argument("--out", help="output directory (default: RUN_DIR/plots)")
    args = parser.parse_args(argv)
    from rollway.coordinator.plot import plot_run

    for path in plot_run(args.run_dir, args.out):
        print(path)
    return 0


def _dashboard(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="rollway dashboard",
        description="Serve the web dashboard of runs from their directories (a live coordinator serves "
        "its own: see its --dashboard-port).",
    )
    parser.add_argument("run_dirs", nargs="+", help="run directories, or folders holding run directories")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument("--port", type=int, default=8765, help="port to bind (0: a free one)")
    parser.add_argument("--auth-token", default="", help="require this token (also ROLLWAY_AUTH_TOKEN)")
    args = parser.parse_args(argv)
    import os
    import threading
    from pathlib import Path

    missing = [d for d in args.run_dirs if not Path(d).is_dir()]
    if missing:
        print(f"rollway dashboard: not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    from rollway.coordinator.dashboard.app import create_app
    from rollway.coordinator.dashboard.runs_view import DashboardRuns
    from rollway.coordinator.dashboard.server import DashboardServer

    token = args.auth_token or os.environ.get("ROLLWAY_AUTH_TOKEN", "")
    app = create_app(DashboardRuns(run_dirs=[Path(d) for d in args.run_dirs]), token=token)
    try:
        server = DashboardServer(app, args.host, args.port).start()
    except OSError as exc:
        print(f"rollway dashboard: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    print(f"dashboard: {server.url}" + ("/?token=..." if token else ""), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()
    return 0


def _demo(argv: list[str]) -> int:
    task = argparse.ArgumentParser(add_help=False)
    task.add_argument("--task", choices=("addition", "tools"), default="addition")
    task.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    known, rest = task.parse_known_args(argv)
    if known.model == "smollm2":  # GRPO with a real pretrained model (demo/smollm2.py)
        from rollway.demo.smollm2 import main as smollm2_main

        return smollm2_main(rest)
    if known.task == "tools":  # tool use with the calculator environment (demo/tools.py)
        from rollway.demo.tools import main as tools_main

        return tools_main(rest)
    from rollway.demo.addition import main as demo_main

    return demo_main(rest)


COMMANDS = {
    "serve": (_serve, "run one service"),
    "make-tiny-model": (_make_tiny_model, "write the tiny model, tokenizer and demo datasets"),
    "import-gguf": (_import_gguf, "convert a GGUF file into a Hugging Face model directory"),
    "up": (_up, "start the four services locally, check health, stop them"),
    "run": (_run, "run a job from a config file"),
    "plan": (_plan, "print the batch arithmetic and the memory plan of a run config"),
    "plot": (_plot, "write PNG charts of a run's metrics"),
    "gateway": (_gateway, "serve the Tinker training API (tinker SDK) on rollway's services"),
    "dashboard": (_dashboard, "serve the web dashboard of run directories"),
    "demo": (_demo, "SFT then GRPO on the tiny model, on CPU (--task tools: with the calculator)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__.strip())
        print("\ncommands:")
        for name, (_, summary) in COMMANDS.items():
            print(f"  {name:<18}{summary}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    handler, _ = COMMANDS[argv[0]]
    return handler(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
