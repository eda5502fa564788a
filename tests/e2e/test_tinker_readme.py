"""docs/tinker.md's loop, run as written against `rollway gateway` (the console command, as the
page starts it) on the tiny model: its loss falls, it saves, it samples."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.gateway import TOKEN, healthy
from support.processes import wait_all_gone
from support.waiting import wait_until

pytestmark = pytest.mark.slow
README = Path(__file__).resolve().parents[2] / "docs" / "tinker.md"


def readme_block(first_line: str) -> str:
    for block in re.findall(r"```\w*\n(.*?)```", README.read_text(), re.DOTALL):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"docs/tinker.md has no code block starting with {first_line!r}")


def test_readme_tinker_loop_trains_saves_and_samples_through_rollway_gateway(tmp_path, tiny_model_dir):
    port_file = tmp_path / "gateway.port"
    rollway = Path(sys.executable).with_name("rollway")
    gateway = subprocess.Popen(
        [
            str(rollway),
            "gateway",
            "--token",
            TOKEN,
            "--workdir",
            str(tmp_path / "gw"),
            "--port-file",
            str(port_file),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        process_group=0,
    )
    try:
        wait_until(port_file.exists, timeout=30, what="the gateway's port file")
        base_url = f"http://127.0.0.1:{port_file.read_text()}"
        wait_until(lambda: healthy(base_url), timeout=30, what="the gateway's healthz")
        (tmp_path / "tinker_loop.py").write_text(readme_block("# tinker_loop.py"))
        env = {**os.environ, "ROLLWAY_GATEWAY_URL": base_url, "TINKER_API_KEY": TOKEN}
        run = subprocess.run(
            [sys.executable, "tinker_loop.py", str(tiny_model_dir)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        losses = [float(x) for x in re.findall(r"^step \d+: loss ([\d.]+)$", run.stdout, re.MULTILINE)]
        assert len(losses) == 5 and losses[-1] < losses[0], run.stdout
        assert re.search(r"^saved tinker://\S+/weights/final$", run.stdout, re.MULTILINE), run.stdout
        assert re.search(r"^sampled \[.*\]$", run.stdout, re.MULTILINE), run.stdout
    finally:
        os.killpg(gateway.pid, 15)
        gateway.wait(timeout=30)
        assert wait_all_gone([gateway.pid], timeout=10) == []
