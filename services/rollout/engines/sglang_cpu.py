"""The settings that run the `sglang` engine's servers on a CPU, from a virtualenv made by
deploy/sglang-cpu/install.sh (the route, its flags and its limits: deploy/sglang-cpu/README.md).

Why each one:
- SGLANG_USE_CPU_ENGINE=1: SGLang's CPU engine; without it start-up fails on a missing vllm.
- OMP_NUM_THREADS=1: on a small shared machine, more threads made decoding 10-40x slower.
- PYTHONPATH=<venv>/shims: import-only stand-ins for sgl_kernel and torchvision (no CPU builds).
- torch_native attention and pytorch sampling: the backends that need no CUDA kernels.
- --max-total-tokens: otherwise the KV pool is sized from free RAM (half of it, here).
- --sleep-on-idle: an idle server's scheduler otherwise polls its sockets without pause and keeps a
  whole core busy (1.01 cores measured on 0.5.23, 0.02 with it), taken from the trainer beside it.
SGLang ignores `sampling_seed` on CPU (its deterministic mode refuses torch_native attention), so
two runs differ sample by sample; weights, versions and log-probs still agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CPU_LAUNCH_ARGS = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--sampling-backend", "pytorch",
    "--disable-overlap-schedule",
    "--max-running-requests", "128",
    "--sleep-on-idle",
)  # fmt: skip
DEFAULT_VENV = Path(".cache") / "sglang-0.5.23"


def installed_version(venv: Path) -> str | None:
    """The SGLang release install.sh finished installing into `venv`, or None."""
    marker = Path(venv) / ".installed"
    return marker.read_text().strip() if marker.is_file() else None


def cpu_settings(venv: Path, max_total_tokens: int = 8192) -> dict[str, Any]:
    """Rollout settings (rollout_engine: sglang) that launch servers from `venv` on the CPU."""
    venv = Path(venv).resolve()
    return {
        "rollout_engine": "sglang",
        "sglang_python": str(venv / "bin" / "python"),
        "sglang_env": ["SGLANG_USE_CPU_ENGINE=1", "OMP_NUM_THREADS=1", f"PYTHONPATH={venv / 'shims'}"],
        "sglang_extra_args": [*CPU_LAUNCH_ARGS, "--max-total-tokens", str(max_total_tokens)],
    }
