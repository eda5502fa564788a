"""deploy/docker-compose.yml: schema validation, and its wiring run as local processes.

No container engine runs here. The wiring test takes each service of the `cpu` profile exactly as
the compose file gives it (command, environment, health check, depends_on order) and starts it as
a local process: compose host names become 127.0.0.1 (the compose ports are distinct, so they do
not clash on one host), the shared volume /data becomes a temporary directory. Long-running
services must pass their own health check; one-shot containers must exit 0. That is the demo of
`make run`, shortened through the file's own variables (DEMO_SFT_STEPS, DEMO_RL_STEPS).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "docker-compose.yml"
SCHEMA_FILE = ROOT / "deploy" / "schema" / "compose-spec.json"
VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def load_compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())  # resolves the file's anchors and merge keys


def interpolate(value, env: dict[str, str]):
    """Compose's ${VAR} / ${VAR:-default} substitution, applied to every string of a value."""
    if isinstance(value, str):
        return VARIABLE.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def test_compose_file_matches_the_compose_schema():
    import jsonschema

    validator = jsonschema.Draft201909Validator(json.loads(SCHEMA_FILE.read_text()))
    compose = load_compose()
    assert [e.message for e in validator.iter_errors(compose)] == []
    compose["services"]["trainer"]["helthcheck"] = {}  # a typo is caught
    assert any("helthcheck" in e.message for e in validator.iter_errors(compose))


def test_compose_file_wires_every_service_by_name():
    services = load_compose()["services"]
    cpu = {name for name, s in services.items() if "cpu" in s.get("profiles", ["cpu"])}
    assert cpu == {
        "coordinator", "demo-setup", "sft-dataloader", "sft-trainer", "sft",
        "dataloader", "trainer", "rollout", "grpo",
    }  # fmt: skip
    for name, service in services.items():
        command = " ".join(service.get("command", []))
        if "healthcheck" in service:  # a gRPC service: bound to all interfaces, checked on its own port
            port = command.split("--port ")[1].split()[0]
            assert "--host 0.0.0.0" in command, name
            assert service["healthcheck"]["test"][-1] == f"127.0.0.1:{port}", name
        for host, _port in re.findall(r"\b([a-z][\w-]*):(\d{4,5})\b", command):
            assert host in services, f"{name} dials unknown service {host}"
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown {dependency}"
    assert services["trainer"]["expose"] == ["50051", "29600"]
    assert "--update-weight-master-port 29600" in " ".join(services["grpo"]["command"])
    gpu = services["trainer-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"] and services["trainer-gpu"]["profiles"] == ["gpu"]


def test_cpu_profile_defaults_are_those_of_make_run():
    import inspect

    import rollway.demo

    source = inspect.getsource(rollway.demo.main)
    defaults = {
        f: re.search(rf'"--{f}", type=int, default=(\d+)', source).group(1) for f in ("sft-steps", "rl-steps")
    }
    setup = interpolate(load_compose()["services"]["demo-setup"]["command"], {})
    assert setup[setup.index("--sft-steps") + 1] == defaults["sft-steps"]
    assert setup[setup.index("--rl-steps") + 1] == defaults["rl-steps"]


def _docker_compose() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if (
        shutil.which("docker")
        and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    ):
        return ["docker", "compose"]
    return None


@pytest.mark.skipif(
    _docker_compose() is None,
    reason="docker-compose is not installed (apt-get install docker-compose); the schema test above "
    "validates the same file without it",
)
def test_docker_compose_config_accepts_the_file():
    for profile in ("cpu", "gpu", "tracing"):
        result = subprocess.run(
            [*_docker_compose(), "-f", str(COMPOSE_FILE), "--profile", profile, "config", "-q"],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert result.returncode == 0, result.stderr


# --- the wiring, as local processes -----------------------------------------------------------


def _order(services: dict) -> list[str]:
    """Services in an order that respects depends_on (compose's start order)."""
    done: list[str] = []

    def visit(name: str) -> None:
        if name not in done:
            for dependency in services[name].get("depends_on", {}):
                visit(dependency)
            done.append(name)

    for name in services:
        visit(name)
    return done


def _localize(value, service_names: set[str], data_dir: Path):
    """Compose host names and the all-interfaces bind -> 127.0.0.1; the /data volume -> data_dir."""
    if isinstance(value, list):
        return [_localize(v, service_names, data_dir) for v in value]
    hosts = "|".join(sorted(map(re.escape, service_names), key=len, reverse=True))
    value = re.sub(rf"\b(?:{hosts}):(\d+)\b", r"127.0.0.1:\1", value)
    value = re.sub(r"(?<![\w/])/data\b", str(data_dir), value)
    return "127.0.0.1" if value == "0.0.0.0" else value


class ComposeProcesses:
    """The cpu profile's containers as local processes, stopped by pid in reverse order."""

    def __init__(self, workdir: Path, env: dict[str, str]):
        compose = interpolate(load_compose(), env)
        self.services = {
            name: s for name, s in compose["services"].items() if "cpu" in s.get("profiles", ["cpu"])
        }
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.data_dir.mkdir(parents=True)
        venv_bin = str(Path(sys.executable).parent)
        self.env = {**os.environ, "PATH": f"{venv_bin}:{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}
        self.running: dict[str, subprocess.Popen] = {}
        self.healthy: set[str] = set()
        self.outputs: dict[str, str] = {}

    def command(self, name: str) -> tuple[list[str], dict[str, str]]:
        service = self.services[name]
        command = _localize(service["command"], set(self.services), self.data_dir)
        env = {**self.env, **{k: str(v) for k, v in service.get("environment", {}).items()}}
        return command, env

    def up(self) -> None:
        """Start in waves, as compose does: everything whose dependencies are met, together."""
        pending = _order(self.services)
        while pending:
            wave = [name for name in pending if self._dependencies_met(name)]
            assert wave, f"unmet dependencies: {pending}"
            services = [name for name in wave if "healthcheck" in self.services[name]]
            jobs = {name: self._spawn(name, capture=True) for name in wave if name not in services}
            for name in services:
                self.running[name] = self._spawn(name, capture=False)
            for name, job in jobs.items():
                self._finish(name, job)
            for name in services:
                self._wait_healthy(name)
                self.healthy.add(name)
            pending = [name for name in pending if name not in wave]

    def _dependencies_met(self, name: str) -> bool:
        rules = self.services[name].get("depends_on", {})
        return all(
            (d in self.healthy) if r["condition"] == "service_healthy" else (d in self.outputs)
            for d, r in rules.items()
        )

    def _spawn(self, name: str, capture: bool) -> subprocess.Popen:
        command, env = self.command(name)
        out = subprocess.PIPE if capture else open(self.workdir / f"{name}.log", "w")
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)

    def _finish(self, name: str, job: subprocess.Popen, timeout_s: float = 300.0) -> None:
        output, _ = job.communicate(timeout=timeout_s)
        assert job.returncode == 0, f"{name} exited with {job.returncode}:\n{output[-4000:]}"
        self.outputs[name] = output

    def _wait_healthy(self, name: str, timeout_s: float = 180.0) -> None:
        _, env = self.command(name)
        check = _localize(self.services[name]["healthcheck"]["test"][1:], set(self.services), self.data_dir)
        deadline = time.monotonic() + timeout_s
        while subprocess.run(check, env=env, capture_output=True).returncode != 0:
            log_text = (self.workdir / f"{name}.log").read_text()[-3000:]
            assert self.running[name].poll() is None, f"{name} exited:\n{log_text}"
            assert time.monotonic() < deadline, f"{name} never became healthy:\n{log_text}"
            time.sleep(0.5)

    def down(self) -> None:
        for proc in reversed(self.running.values()):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _ports_in_use(services: dict) -> list[int]:
    ports = {int(p) for s in services.values() for p in re.findall(r":(\d{5})\b", " ".join(s["command"]))}
    busy = []
    for port in sorted(ports):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                busy.append(port)
    return busy


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


@pytest.mark.slow
def test_cpu_profile_runs_the_demo_through_the_compose_wiring(tmp_path):
    stack = ComposeProcesses(tmp_path, {"DEMO_SFT_STEPS": "12", "DEMO_RL_STEPS": "2"})
    busy = _ports_in_use(stack.services)
    assert not busy, f"ports {busy} of the compose file are taken on this machine"
    try:
        stack.up()
    finally:
        stack.down()
    demo = stack.data_dir / "demo"
    runs = demo / "runs"

    # Attach mode: the jobs started no service of their own, and the coordinator dialled the
    # compose services (host names mapped to 127.0.0.1 here, ports from the file).
    for job in ("sft", "grpo"):
        assert "starting " not in stack.outputs[job], stack.outputs[job]
        assert f"run {job} SUCCEEDED" in stack.outputs[job]
    sft_run = json.loads((runs / "sft" / "config.json").read_text())
    assert (sft_run["trainer_addr"], sft_run["dataloader_addr"]) == ("127.0.0.1:50061", "127.0.0.1:50063")
    grpo_run = json.loads((runs / "grpo" / "config.json").read_text())
    assert grpo_run["rollout_addr"] == ["127.0.0.1:50052"] and grpo_run["update_weight_master_port"] == 29600

    sft = read_metrics(runs / "sft")
    assert [r["step"] for r in sft] == list(range(12))
    assert sft[-1]["sft/loss"] < 0.5 * sft[0]["sft/loss"]
    # GRPO started from the SFT export: the services read it through the link publish-sft made.
    assert (demo / "sft-model").resolve() == Path(
        json.loads((runs / "sft" / "result.json").read_text())["hf_export_dir"]
    )
    grpo = [r for r in read_metrics(runs / "grpo") if "train/loss" in r]
    assert [r["rollout/weight_version"] for r in grpo] == [2.0, 3.0]  # pushed before step 0, then after each
    assert all(r["perf/weight_sync_time"] > 0 for r in grpo)
    summary = json.loads((demo / "summary.json").read_text())
    assert summary["rl_steps"] == 2 and 0.0 <= summary["accuracy_before_rl"] <= 1.0
    evals = [r["eval/accuracy"] for r in read_metrics(runs / "grpo") if "eval/accuracy" in r]
    assert (summary["accuracy_before_rl"], summary["accuracy_after_rl"]) == (evals[0], evals[-1])
    assert "held-out accuracy before RL" in stack.outputs["grpo"]
