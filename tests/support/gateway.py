"""`rollway gateway` as a real process for tests, and the tinker SDK pointed at it."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from pathlib import Path

from support.processes import ServiceProcess
from support.waiting import wait_until

TOKEN = "tml-rollway-test-token"


def post(base_url: str, route: str, body: dict, key: str) -> tuple[int, dict]:
    """A raw JSON call to the gateway (what the SDK would send); (HTTP status, JSON reply)."""
    request = urllib.request.Request(
        f"{base_url}{route}",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "X-API-Key": key},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/api/v1/healthz", timeout=2) as reply:
            return json.load(reply) == {"status": "ok"}
    except OSError:
        return False


@contextlib.contextmanager
def running_gateway(workdir: Path, *flags: str):
    """A gateway on a free loopback port; yields (base_url, process). Stopped by its pid (its
    process group: the trainers and rollout services it started go with it)."""
    args = ["--token", TOKEN, "--workdir", str(workdir / "gateway"), *flags]
    process = ServiceProcess("gateway", args, workdir, module="rollway.gateway", wait_serving=False)
    with process:
        base_url = f"http://127.0.0.1:{process.port}"
        wait_until(lambda: healthy(base_url), timeout=30, what="the gateway's healthz")
        yield base_url, process


def resident_bytes(pid: int) -> int:
    """VmRSS of `pid` in bytes (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0
