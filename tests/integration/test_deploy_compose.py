"""deploy/docker-compose.yml: schema validation, docker-compose 1.29's own parsing, and the wiring
run as local processes.

No container engine runs here. The wiring test takes each service of the `cpu` profile exactly as
the compose file gives it (command, environment, health check, depends_on order) and starts it as
a local process: compose host names become 127.0.0.1 (the compose ports are distinct, so they do
not clash on one host), the shared volume /data becomes a temporary directory. Long-running
services must pass their own health check; one-shot containers must exit 0. That is the demo of
`make run`, shortened through the file's own variables (DEMO_SFT_STEPS, DEMO_RL_STEPS).
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml
from support.jsonl import read_metrics

from rollway.demo import addition as demo_module

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


def strict_schema() -> dict:
    """The compose schema as docker-compose 1.29 applies it to an interpolated file.

    The schema lets number and boolean fields also be strings because compose v2 casts interpolated
    values back to the field's type; 1.29 does not (only a few fields, such as healthcheck.retries,
    are converted), so the string reaches its code: every 1.29 command but `config` crashes on a
    string `count` of a device request (a TypeError while raising "Invalid value "1" for devices
    count"). Here `string` is
    dropped from every such field (free-form maps such as environment and build args excepted),
    and `count` is an integer or "all", as 1.29 requires.
    """
    schema = copy.deepcopy(json.loads(SCHEMA_FILE.read_text()))

    def narrow(node, in_free_map: bool) -> None:
        if isinstance(node, dict):
            types = node.get("type")
            if isinstance(types, list) and "string" in types and not in_free_map:
                if {"integer", "number", "boolean"} & set(types):
                    node["type"] = [t for t in types if t != "string"]
            for key, value in node.items():
                narrow(value, in_free_map or key == "list_or_dict")
        elif isinstance(node, list):
            for value in node:
                narrow(value, in_free_map)

    narrow(schema, False)
    schema["definitions"]["devices"]["items"]["properties"]["count"] = {
        "anyOf": [{"type": "integer"}, {"const": "all"}]
    }
    return schema


def v1_type_errors(compose: dict, env: dict[str, str]) -> list[str]:
    """Fields that hold an interpolated string where 1.29 needs a number (and any bad `count`)."""
    import jsonschema

    validator = jsonschema.Draft201909Validator(strict_schema())

    def leaves(errors):
        for error in errors:
            yield error
            yield from leaves(error.context or [])

    found = []
    for error in leaves(validator.iter_errors(interpolate(compose, env))):
        raw = compose
        for key in error.absolute_path:
            raw = raw[key]
        if error.absolute_path and (
            error.absolute_path[-1] == "count" or (isinstance(raw, str) and "${" in raw)
        ):
            found.append(f"{'.'.join(map(str, error.absolute_path))}: {raw!r}")
    return sorted(set(found))


def test_typed_fields_are_not_interpolated_strings_that_compose_1_29_refuses():
    compose = json.loads(json.dumps(load_compose()))  # no YAML aliases: services edited one by one
    for env in ({}, {"TRAINER_GPUS": "0,1", "ROLLOUT_GPUS": "2,3", "DEMO_SFT_STEPS": "12"}):
        assert v1_type_errors(compose, env) == []
    # What the shipped file had (every 1.29 command but `config` failed on it), and its cousins.
    device = compose["services"]["trainer-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]
    for count in ("${TRAINER_NUM_GPUS:-1}", "2"):
        device["count"] = count
        assert v1_type_errors(compose, {}) == [
            f"services.trainer-gpu.deploy.resources.reservations.devices.0.count: {count!r}"
        ]
    device["count"] = 2
    compose["services"]["trainer"]["shm_size"] = "${SHM_SIZE:-1073741824}"
    assert v1_type_errors(compose, {}) == ["services.trainer.shm_size: '${SHM_SIZE:-1073741824}'"]


def test_gpu_services_get_disjoint_gpus_for_the_default_run_config():
    """count: N would hand GPUs 0..N-1 to each container: the GPUs are picked by CUDA_VISIBLE_DEVICES."""
    run_config = yaml.safe_load((ROOT / "deploy" / "configs" / "grpo-gpu.yaml").read_text())
    for env, trainer_gpus, rollout_gpus in (
        ({}, ["0", "1", "2", "3"], ["4", "5", "6", "7"]),
        ({"TRAINER_GPUS": "0", "ROLLOUT_GPUS": "1"}, ["0"], ["1"]),
    ):
        services = interpolate(load_compose(), env)["services"]
        trainer, rollout = services["trainer-gpu"], services["rollout-gpu"]
        assert trainer["environment"]["CUDA_VISIBLE_DEVICES"].split(",") == trainer_gpus
        assert rollout["environment"]["CUDA_VISIBLE_DEVICES"].split(",") == rollout_gpus
        for service in (trainer, rollout):
            (device,) = service["deploy"]["resources"]["reservations"]["devices"]
            assert (device["count"], device["driver"], device["capabilities"]) == ("all", "nvidia", ["gpu"])
            assert service["environment"]["NCCL_SOCKET_IFNAME"] == "eth0"  # the shared GPU settings stay
    defaults = interpolate(load_compose(), {})["services"]
    assert (
        len(defaults["trainer-gpu"]["environment"]["CUDA_VISIBLE_DEVICES"].split(","))
        == run_config["world_size"]
    )
    assert (
        len(defaults["rollout-gpu"]["environment"]["CUDA_VISIBLE_DEVICES"].split(","))
        == run_config["rollout_num_gpus"]
    )


def test_images_take_the_torch_index_as_a_build_argument():
    for env, cpu_index, gpu_index in (
        ({}, "cpu", "cu128"),
        ({"TORCH_INDEX_CPU": "https://mirror.example/torch/cpu", "TORCH_INDEX_GPU": "cu126"},
         "https://mirror.example/torch/cpu", "cu126"),
    ):  # fmt: skip
        services = interpolate(load_compose(), env)["services"]
        assert services["trainer"]["build"]["args"] == {"VARIANT": "cpu", "TORCH_INDEX": cpu_index}
        assert services["trainer-gpu"]["build"]["args"]["TORCH_INDEX"] == gpu_index
        assert "TORCH_INDEX" not in services["coordinator"]["build"]["args"]  # base: no torch


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
    assert gpu["capabilities"] == ["gpu"] and services["trainer-gpu"]["profiles"] == ["gpu", "gpu-sft"]


def test_gpu_stack_reads_models_and_data_from_the_host_and_writes_its_outputs_there():
    """Bind mounts for what a GPU box has on disk, and for what a run leaves (never only on the
    named volume that `down -v` deletes); every path of the GPU run configs lies under them."""
    from rollway.coordinator.run_config import parse_run_config

    services = interpolate(load_compose(), {"ROLLWAY_OUTPUT_DIR": "/srv/out"})["services"]
    for name in ("dataloader-gpu", "trainer-gpu", "rollout-gpu", "run-gpu", "run-sft-gpu"):
        volumes = services[name]["volumes"]
        assert {"./models:/models:ro", "./datasets:/datasets:ro", "/srv/out:/output"} <= set(volumes), name
    # The coordinator writes the run's directory, and counts the data of a num_epoch run up front.
    assert {"/srv/out:/output", "./datasets:/datasets:ro"} <= set(services["coordinator"]["volumes"])
    mounts = ("/models/", "/datasets/", "/output/")
    for config_name in ("grpo-gpu.yaml", "sft-gpu.yaml"):
        config = yaml.safe_load((ROOT / "deploy" / "configs" / config_name).read_text())
        paths = [
            config["hf_checkpoint"],
            *config["prompt_data"],
            config["run_dir"],
            config["save"],
            config["save_hf"],
        ]
        paths += config.get("eval_prompt_data", [])[1::2]
        assert all(path.startswith(mounts) for path in paths), (config_name, paths)
        attached = {"trainer_addr": "trainer-gpu:50051", "dataloader_addr": "dataloader-gpu:50053"}
        if config["loss_type"] != "sft_loss":
            attached["rollout_addr"] = ["rollout-gpu:50052"]
        parse_run_config({**config, **attached})  # valid, as the job container sends it (files: on the box)
    assert "down -v` deletes the rollway-data volume" in COMPOSE_FILE.read_text()


def test_dashboard_published_restart_policies_and_sglang_pinned_with_torch():
    services = interpolate(load_compose(), {})["services"]
    coordinator = services["coordinator"]
    command = coordinator["command"]
    assert command[command.index("--dashboard-host") + 1] == "0.0.0.0"
    port = command[command.index("--dashboard-port") + 1]
    assert f"127.0.0.1:{port}:{port}" in coordinator["ports"]
    jobs = {"demo-setup", "sft", "grpo", "run-gpu", "run-sft-gpu"}
    for name, service in services.items():
        if name in ("otel-collector", "jaeger"):
            continue
        # Jobs run once (a finished run's id is refused anyway); long-lived services come back.
        assert service["restart"] == ("no" if name in jobs else "unless-stopped"), name
    args = services["trainer-gpu"]["build"]["args"]
    assert (args["SGLANG_VERSION"], args["TORCH_VERSION"]) == ("0.5.20", "2.13.0")
    assert "${" not in json.dumps(
        load_compose()["services"]["trainer-gpu"]["build"]["args"]["SGLANG_VERSION"]
    )


def test_cpu_profile_defaults_are_those_of_make_run():
    """The compose demo trains as `make run` does: the same GRPO rollouts, and a fixed SFT length (a
    static stack has no dev-accuracy stopping rule) within the rule's cap."""
    from rollway.demo import addition as demo
    from rollway.demo import compose as compose_demo

    setup = interpolate(load_compose()["services"]["demo-setup"]["command"], {})
    assert int(setup[setup.index("--rl-steps") + 1]) == demo.RL_STEPS
    assert 0 < int(setup[setup.index("--sft-steps") + 1]) <= demo.SFT_MAX_STEPS
    parser_defaults = compose_demo.build_parser().parse_args(["prepare", "/d"])
    assert parser_defaults.rl_steps == demo.RL_STEPS


def test_every_demo_prepared_on_the_volume_gets_its_own_runs(tmp_path, tiny_model_dir, demo_data_dir):
    """The services of a live stack keep state per run id: a second demo must not reuse the first's."""
    from rollway.demo import compose as compose_demo

    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "tiny-model-seed0").symlink_to(tiny_model_dir)  # made once per seed: not rebuilt here
    (demo / "data-seed0").symlink_to(demo_data_dir)
    compose_demo.main(["prepare", str(demo), "--sft-steps", "3", "--rl-steps", "2", "--demo-id", "one"])
    assert compose_demo.run_dir(demo, "sft") == demo / "runs" / "sft-one"
    first = {n: yaml.safe_load((demo / "configs" / f"{n}.yaml").read_text()) for n in ("sft", "grpo")}
    assert (first["sft"]["run_id"], first["grpo"]["run_id"]) == ("sft-one", "grpo-one")
    assert first["sft"]["hf_checkpoint"] == str(demo / "tiny-model-seed0")
    assert first["sft"]["prompt_data"] == [str(demo / "data-seed0" / "sft.parquet")]
    assert (first["sft"]["save_hf"], first["grpo"]["save_hf"]) == (
        str(demo / "exports" / "sft-one"),
        str(demo / "exports" / "grpo-one"),
    )
    assert first["grpo"]["save"] == str(demo / "runs" / "grpo-one" / "checkpoints")
    assert first["sft"]["save"] == str(
        demo / "runs" / "sft-one" / "checkpoints"
    )  # a second demo must not resume it
    assert first["grpo"]["hf_checkpoint"] == str(demo / "sft-model")

    # The first SFT run finished: publish-sft links its export (found through the config's run id).
    export = demo / "exports" / "sft-one"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    (demo / "runs" / "sft-one").mkdir(parents=True)
    (demo / "runs" / "sft-one" / "result.json").write_text(json.dumps({"hf_export_dir": str(export)}))
    compose_demo.main(["publish-sft", str(demo)])
    assert (demo / "sft-model").resolve() == export.resolve()

    compose_demo.main(["prepare", str(demo), "--sft-steps", "3", "--rl-steps", "2"])  # a new time stamp
    second = {n: yaml.safe_load((demo / "configs" / f"{n}.yaml").read_text()) for n in ("sft", "grpo")}
    stamp = second["sft"]["run_id"].removeprefix("sft-")
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", stamp) and second["grpo"]["run_id"] == f"grpo-{stamp}"
    assert (demo / "runs" / "sft-one" / "result.json").is_file()  # the first demo's runs are kept
    assert second["sft"]["hf_checkpoint"] == first["sft"]["hf_checkpoint"]  # model and data shared
    with pytest.raises(FileNotFoundError):  # the new SFT run has not finished: nothing to publish
        compose_demo.publish_sft(demo)


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


def _docker_compose_v1() -> str | None:
    path = shutil.which("docker-compose")
    if path is None:
        return None
    version = subprocess.run([path, "version", "--short"], capture_output=True, text=True)
    return path if version.stdout.startswith("1.") else None


class _EngineStub(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A Docker engine socket that knows no object: every GET is 404, anything else 405.

    docker-compose 1.29 builds its project (where it reads the device requests) only after it has a
    client; building it looks up the project network (a 404 is "not created yet"). `ps --services`
    then prints the services without asking the engine anything else.
    """

    daemon_threads = True

    def __init__(self, path: str):
        self.requests: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                stub.requests.append(f"GET {self.path}")
                self._reply(404, b'{"message": "not found"}')

            def do_POST(self):
                stub.requests.append(f"POST {self.path}")
                self._reply(405, b'{"message": "read-only stub"}')

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # the client address of a unix socket is ""
                pass

        super().__init__(path, Handler)


@pytest.fixture
def engine_stub():
    directory = tempfile.mkdtemp(prefix="engine-", dir="/tmp")  # unix socket paths are short
    stub = _EngineStub(os.path.join(directory, "docker.sock"))
    thread = threading.Thread(target=stub.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        stub.shutdown()
        stub.server_close()
        thread.join(10)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.skipif(
    _docker_compose_v1() is None,
    reason="docker-compose 1.x is not installed (apt-get install docker-compose, or pip install "
    "docker-compose==1.29.2 into a venv of its own); test_typed_fields_... checks the same rule without it",
)
def test_docker_compose_1_29_builds_the_project_of_every_profile(engine_stub):
    """Every 1.29 command but `config` builds the project first; the shipped file failed there."""
    compose = load_compose()["services"]
    env = {
        **os.environ,
        "DOCKER_HOST": f"unix://{engine_stub.server_address}",
        "COMPOSE_API_VERSION": "1.41",  # no /version round trip
    }
    for profile, extra_env in (("cpu", {}), ("gpu", {}), ("gpu", {"TRAINER_GPUS": "0", "ROLLOUT_GPUS": "1"}),
                               ("tracing", {})):  # fmt: skip
        result = subprocess.run(
            [_docker_compose_v1(), "-f", str(COMPOSE_FILE), "--profile", profile, "ps", "--services"],
            capture_output=True, text=True, cwd=ROOT, env={**env, **extra_env}, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, f"--profile {profile}: {result.stderr}"
        # 1.29 builds every service of the file whatever the profile (the gpu ones' device requests
        # included), so a bad `count` breaks the cpu demo too.
        assert set(result.stdout.split()) == set(compose), profile
        config = subprocess.run(
            [_docker_compose_v1(), "-f", str(COMPOSE_FILE), "--profile", profile, "config"],
            capture_output=True, text=True, cwd=ROOT, env={**env, **extra_env}, timeout=60,
        )  # fmt: skip
        assert config.returncode == 0, config.stderr
        if profile == "gpu":
            resolved = yaml.safe_load(config.stdout)["services"]
            (device,) = resolved["trainer-gpu"]["deploy"]["resources"]["reservations"]["devices"]
            assert device["count"] == "all"
            assert resolved["trainer-gpu"]["environment"]["CUDA_VISIBLE_DEVICES"] == extra_env.get(
                "TRAINER_GPUS", "0,1,2,3"
            )
    assert engine_stub.requests and all(r.startswith("GET ") for r in engine_stub.requests), (
        engine_stub.requests
    )


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


# The compose file's service ports (50050-50063, the dashboard's 51050) lie in Linux's ephemeral
# range: on the host, an outgoing connection of any process may hold one as its source port, and
# the service could not bind it (seen once: a test's leftover client socket on 50050). Containers
# have a network each; these local processes get the same ports moved below that range, all
# together, so what is tested is still the file's wiring.
EPHEMERAL = range(32768, 61000)


def moved_ports(services: dict) -> dict[int, int]:
    """Each port in the ephemeral range the services name -> a port below it (free now)."""
    text = json.dumps(services)
    ports = sorted({int(p) for p in re.findall(r"\b(\d{5})\b", text) if int(p) in EPHEMERAL})
    while True:
        base = random.randrange(20000, 28000, 100)
        moved = {port: base + i for i, port in enumerate(ports)}
        if not _busy(moved.values()):
            return moved


def _busy(ports) -> list[int]:
    busy = []
    for port in sorted(ports):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                busy.append(port)
    return busy


class ComposeProcesses:
    """The cpu profile's containers as local processes, stopped by pid in reverse order."""

    def __init__(self, workdir: Path, env: dict[str, str]):
        compose = interpolate(load_compose(), env)
        services = {name: s for name, s in compose["services"].items() if "cpu" in s.get("profiles", ["cpu"])}
        self.ports = moved_ports(services)  # file port -> the port used here
        text = json.dumps(services)
        for port, moved in self.ports.items():
            text = re.sub(rf"\b{port}\b", str(moved), text)
        self.services = json.loads(text)
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

    def run_jobs_again(self) -> tuple[dict[str, str], str | None]:
        """The one-shot containers again, in order, on the running services (`up` a second time).

        Returns their outputs and the first one that failed (None when all exited 0).
        """
        outputs = {}
        for name in _order(self.services):
            if "healthcheck" not in self.services[name]:
                job = self._spawn(name, capture=True)
                outputs[name], _ = job.communicate(timeout=300)
                if job.returncode != 0:
                    return outputs, name
        return outputs, None

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
    return _busy(ports)


def demo_run_dirs(demo: Path) -> dict[str, Path]:
    """This demo's run directories, by the run ids that demo-setup wrote into the configs."""
    configs = {
        name: yaml.safe_load((demo / "configs" / f"{name}.yaml").read_text()) for name in ("sft", "grpo")
    }
    return {name: Path(c["run_dir"]) / c["run_id"] for name, c in configs.items()}


def check_demo(demo: Path, outputs: dict[str, str], ports: dict[int, int]) -> dict[str, Path]:
    """One demo (SFT 12 steps, GRPO 2) ran on the compose services in attach mode."""
    runs = demo_run_dirs(demo)
    # Attach mode: the jobs started no service of their own, and the coordinator dialled the
    # compose services (host names mapped to 127.0.0.1 here, ports from the file).
    for job in ("sft", "grpo"):
        assert "starting " not in outputs[job], outputs[job]
        assert f"run {runs[job].name} SUCCEEDED" in outputs[job]
    sft_run = json.loads((runs["sft"] / "config.json").read_text())["coordinator"]  # as the run resolved it
    addresses = (sft_run["trainer_addr"], sft_run["dataloader_addr"])
    assert addresses == (f"127.0.0.1:{ports[50061]}", f"127.0.0.1:{ports[50063]}")
    grpo_run = json.loads((runs["grpo"] / "config.json").read_text())["coordinator"]
    assert grpo_run["rollout_addr"] == [f"127.0.0.1:{ports[50052]}"]
    assert grpo_run["update_weight_master_port"] == 29600

    sft = read_metrics(runs["sft"])
    assert [r["step"] for r in sft] == list(range(12))
    # The demo's SFT settings: 12 steps into its linear warmup, and the loss already falls.
    warmup = demo_module.SFT_WARMUP_STEPS
    assert [r["sft/lr"] for r in sft] == pytest.approx(
        [demo_module.SFT_LR * (s + 1) / warmup for s in range(12)]
    )
    assert sft[-1]["sft/loss"] < 0.9 * sft[0]["sft/loss"]
    # GRPO started from the SFT export: the services read it through the link publish-sft made.
    assert (demo / "sft-model").resolve() == Path(
        json.loads((runs["sft"] / "result.json").read_text())["hf_export_dir"]
    )
    grpo = [r for r in read_metrics(runs["grpo"]) if "train/loss" in r]
    assert [r["rollout/weight_version"] for r in grpo] == [2.0, 3.0]  # pushed before step 0, then after each
    assert all(r["perf/weight_sync_time"] > 0 for r in grpo)
    summary = json.loads((demo / "summary.json").read_text())
    assert (summary["sft_run_id"], summary["grpo_run_id"]) == (runs["sft"].name, runs["grpo"].name)
    assert summary["rl_steps"] == 2 and 0.0 <= summary["accuracy_before_rl"] <= 1.0
    evals = [r["eval/accuracy"] for r in read_metrics(runs["grpo"]) if "eval/accuracy" in r]
    assert (summary["accuracy_before_rl"], summary["accuracy_after_rl"]) == (evals[0], evals[-1])
    assert "held-out accuracy before RL" in outputs["grpo"]
    return runs


@pytest.mark.slow
def test_cpu_profile_runs_the_demo_through_the_compose_wiring(tmp_path):
    stack = ComposeProcesses(tmp_path, {"DEMO_SFT_STEPS": "12", "DEMO_RL_STEPS": "2"})
    busy = _ports_in_use(stack.services)
    assert not busy, f"ports {busy} of the compose file are taken on this machine"
    try:
        stack.up()
        first = check_demo(stack.data_dir / "demo", dict(stack.outputs), stack.ports)
        # The demo again on the same (live) services: its own runs, the first ones left as they were.
        outputs, failed = stack.run_jobs_again()
        assert failed is None, f"{failed} failed on the second demo:\n{outputs[failed][-4000:]}"
        second = check_demo(stack.data_dir / "demo", outputs, stack.ports)
    finally:
        stack.down()
    assert first["sft"].name.startswith("sft-") and first["grpo"].name.startswith("grpo-")
    assert {p.name for p in first.values()}.isdisjoint(p.name for p in second.values())
    assert [r["step"] for r in read_metrics(first["sft"])] == list(range(12))
