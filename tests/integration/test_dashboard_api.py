"""The dashboard's HTTP API over a run directory, served for real (uvicorn on a loopback port):
what each view is given equals what the run wrote (metrics.jsonl, the stored rollouts)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from rollway.common.v1 import common_pb2
from rollway.coordinator.dashboard import rollout_samples, run_files
from rollway.coordinator.dashboard.app import create_app
from rollway.coordinator.dashboard.runs_view import DashboardRuns
from rollway.coordinator.dashboard.server import DASHBOARD_PORT_OFFSET, DashboardServer
from rollway.coordinator.metrics import MetricsSink

NUM_STEPS = 4


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir):
    """A finished (stopped) run: config, 3 of 4 steps of metrics, rollouts of every step."""
    run_dir = tmp_path_factory.mktemp("runs") / "grpo-a"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(
        json.dumps(
            {
                "given": {"num_rollout": NUM_STEPS, "hf_checkpoint": str(tiny_model_dir)},
                "coordinator": {
                    "num_rollout": NUM_STEPS,
                    "advantage_estimator": "grpo",
                    "loss_type": "policy_loss",
                },
                "rollout": {"hf_checkpoint": str(tiny_model_dir)},
            }
        )
    )
    sink = MetricsSink(run_dir, tensorboard=False)
    for step in range(3):
        sink.log(
            step,
            {
                "rollout/raw_reward": 0.1 * step,
                "train/loss": 1.0 / (step + 1),
                "perf/step_time": 2.0,
                "perf/rollout_time": 0.5,
                "perf/train_time": 1.0,
                "perf/weight_sync_time": 0.25,
                "perf/weight_sync_wire_time": 0.125,
            },
        )
    sink.close()
    write_trace(run_dir, step=1, record_time=MetricsSink.read(sink.path)[1]["time"])
    store = rollout_samples.RolloutSampleStore(run_dir, max_groups=2, keep_steps=0)
    for step in range(3):
        samples = [
            common_pb2.Sample(
                group_index=g,
                index=2 * g + i,
                prompt_token_ids=[100, 101],
                response_token_ids=[200 + i, 300, 400],
                rollout_log_probs=[-0.5, -1.25, -3.0],
                advantages=[0.7] * 3,
                reward=float(i) if g == 0 else 1.0,  # group 1: every sample rewarded alike
                weight_version=step,
                finish_reason=common_pb2.FINISH_REASON_STOP,
            )
            for g in range(3)
            for i in range(2)
        ]
        kept = rollout_samples.first_groups(samples, store.max_groups)
        store.record(
            step, [rollout_samples.sample_record(s, [-0.5, -1.0, -3.5], [2.0, 1.0, 0.5]) for s in kept]
        )
    store.close()
    run_files.append_notice(run_dir, "recovered: trainer (pid 7) is hung: it answered nothing for 61s")
    run_files.write_status(run_dir, "STOPPED")
    return run_dir


def write_trace(run_dir, step: int, record_time: float) -> None:
    """Step `step`'s trace as the services write it: a NextBatch call (its client and server
    spans, 0.2 s) and the step's root span, which ends just after the metrics record."""
    end = int((record_time + 0.01) * 1e9)
    start = end - int(1e9)

    def span(name, service, kind, span_id, parent, begin, finish, **attributes):
        return {"name": name, "service": f"rollway-{service}", "trace_id": "ab" * 16, "span_id": span_id,
                "parent_span_id": parent, "kind": kind, "start_ns": begin, "end_ns": finish,
                "status": "UNSET", "attributes": attributes}  # fmt: skip

    spans = [
        span("/rollway.dataloader.v1.DataloaderService/NextBatch", "dataloader", "SERVER", "c" * 16, "b" * 16,
             start + 1000, start + int(0.2e9) - 1000),
        span("rollway.dataloader.v1.DataloaderService/NextBatch", "coordinator", "CLIENT", "b" * 16, "a" * 16,
             start, start + int(0.2e9)),
        span("rl_step", "coordinator", "INTERNAL", "a" * 16, None, start, end, step=step),
    ]  # fmt: skip
    (run_dir / "trace.jsonl").write_text("".join(json.dumps(s) + "\n" for s in spans))


@pytest.fixture(scope="module")
def dashboard(run_dir):
    server = DashboardServer(create_app(DashboardRuns(run_dirs=[run_dir.parent])), "127.0.0.1", 0).start()
    yield server.url
    server.stop()


def get(url: str, headers: dict | None = None, method: str = "GET"):
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def test_metrics_are_the_records_of_metrics_jsonl(dashboard, run_dir):
    expected = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert get(f"{dashboard}/api/runs/grpo-a/metrics")["records"] == expected
    assert len(expected) == 3


def test_runs_show_state_progress_and_both_configs(dashboard):
    (run,) = get(f"{dashboard}/api/runs")
    assert (run["run_id"], run["state"], run["step"], run["num_steps"], run["live"]) == (
        "grpo-a",
        "STOPPED",
        3,
        NUM_STEPS,
        False,
    )
    assert run["eta_seconds"] is None  # a stopped run has no ETA
    assert run["notices"] == ["recovered: trainer (pid 7) is hung: it answered nothing for 61s"]
    detail = get(f"{dashboard}/api/runs/grpo-a")
    assert detail["config_given"]["num_rollout"] == NUM_STEPS
    assert detail["config_resolved"]["coordinator"]["advantage_estimator"] == "grpo"
    assert detail["mode"] == "RL (grpo)"


def test_rollouts_are_the_stored_samples_with_token_text_and_values(dashboard, run_dir, tiny_model_dir):
    from tokenizers import Tokenizer

    assert get(f"{dashboard}/api/runs/grpo-a/rollouts")["steps"] == [0, 1, 2]
    reply = get(f"{dashboard}/api/runs/grpo-a/rollouts/1")
    stored = rollout_samples.read_step(run_dir, 1)
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    assert reply["tokenizer"] is True
    assert [g["group_index"] for g in reply["groups"]] == [0, 1]  # 2 of 3 groups kept
    assert [g["zero_variance"] for g in reply["groups"]] == [False, True]
    assert reply["groups"][0]["prompt"] == tokenizer.decode([100, 101], skip_special_tokens=False)
    shown = [s for g in reply["groups"] for s in g["samples"]]
    assert len(shown) == len(stored) == 4
    for sample, record in zip(shown, stored, strict=True):
        assert [t["id"] for t in sample["tokens"]] == record["response_token_ids"]
        assert [t["rollout_log_probs"] for t in sample["tokens"]] == record["rollout_log_probs"]
        assert [t["train_rollout_log_prob_diff"] for t in sample["tokens"]] == [0.0, 0.25, -0.5]
        assert [t["entropy"] for t in sample["tokens"]] == [2.0, 1.0, 0.5]
        assert (sample["reward"], sample["advantage"], sample["weight_version"], sample["finish_reason"]) == (
            record["reward"], pytest.approx(0.7), 1, "STOP",
        )  # fmt: skip
        assert sample["tokens"][1]["text"] == tokenizer.decode([300], skip_special_tokens=False)


def test_timeline_splits_each_step_and_lists_weight_syncs(dashboard):
    timeline = get(f"{dashboard}/api/runs/grpo-a/timeline")
    assert timeline["phases"][:2] == ["dataloading", "generation"]
    assert [s["step"] for s in timeline["steps"]] == [0, 1, 2]
    phases = timeline["steps"][0]["phases"]  # not in the trace: no dataloading share known
    assert (phases["dataloading"], phases["generation"], phases["training"]) == (0.0, 0.5, 1.0)
    assert (phases["weight sync"], phases["other"]) == (0.25, 0.25)
    assert sum(phases.values()) == pytest.approx(timeline["steps"][0]["total"])
    traced = timeline["steps"][1]["phases"]  # its NextBatch call took 0.2 s of its generation
    assert (traced["dataloading"], traced["generation"]) == pytest.approx((0.2, 0.3))
    syncs = get(f"{dashboard}/api/runs/grpo-a/services")["weight_syncs"]
    assert [(s["step"], s["weight_sync_wire_time"]) for s in syncs] == [(0, 0.125), (1, 0.125), (2, 0.125)]


def test_one_steps_trace_across_services(dashboard, run_dir):
    trace = get(f"{dashboard}/api/runs/grpo-a/trace/1")
    assert trace["trace_file"] == str(run_dir / "trace.jsonl")
    spans = [
        (s["service"], s["name"], round(s["start_ms"], 3), round(s["duration_ms"], 3)) for s in trace["spans"]
    ]
    assert spans == [
        ("coordinator", "rl_step", 0.0, 1000.0),
        ("coordinator", "DataloaderService/NextBatch", 0.0, 200.0),
        ("dataloader", "DataloaderService/NextBatch", 0.001, 199.998),
    ]
    assert get(f"{dashboard}/api/runs/grpo-a/trace/0")["spans"] == []  # step 0 was not traced


def test_unknown_runs_steps_and_stopping_a_finished_run_are_refused(dashboard):
    for path, code in (("runs/nope/metrics", 404), ("runs/grpo-a/rollouts/9", 404)):
        with pytest.raises(urllib.error.HTTPError) as error:
            get(f"{dashboard}/api/{path}")
        assert error.value.code == code, path
    with pytest.raises(urllib.error.HTTPError) as error:
        get(f"{dashboard}/api/runs/grpo-a/stop", method="POST")
    assert error.value.code == 409
    assert "not a live run" in error.value.read().decode()


def test_events_stream_sends_the_runs_then_every_record(dashboard, run_dir):
    with urllib.request.urlopen(f"{dashboard}/api/events?runs=grpo-a", timeout=10) as stream:
        events = {}
        event = None
        for raw in stream:
            line = raw.decode().strip()
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event:
                events[event] = json.loads(line.split(":", 1)[1])
            if {"runs", "metrics", "rollouts"} <= events.keys():
                break
    assert [r["run_id"] for r in events["runs"]] == ["grpo-a"]
    assert [r["step"] for r in events["metrics"]["records"]] == [0, 1, 2]
    assert events["rollouts"]["steps"] == [0, 1, 2]


def test_a_token_is_required_when_set(run_dir):
    app = create_app(DashboardRuns(run_dirs=[run_dir]), token="s3cret")
    server = DashboardServer(app, "127.0.0.1", 0).start()
    try:
        with pytest.raises(urllib.error.HTTPError) as error:
            get(f"{server.url}/api/runs")
        assert error.value.code == 401
        with pytest.raises(urllib.error.HTTPError):
            get(f"{server.url}/api/runs", {"Authorization": "Bearer wrong"})
        assert get(f"{server.url}/api/runs", {"Authorization": "Bearer s3cret"})[0]["run_id"] == "grpo-a"
        # The page is opened with ?token=; the cookie it sets carries the token to fetch and SSE.
        with urllib.request.urlopen(f"{server.url}/?token=s3cret", timeout=10) as page:
            cookie = page.headers["set-cookie"].split(";")[0]
            assert b"rollway" in page.read()
        assert get(f"{server.url}/api/runs", {"Cookie": cookie})[0]["state"] == "STOPPED"
    finally:
        server.stop()


def test_the_coordinators_dashboard_sits_beside_grpc_and_a_taken_port_never_stops_it(tmp_path):
    from rollway.coordinator.config import CoordinatorServiceConfig
    from rollway.coordinator.dashboard.server import start_for_coordinator
    from rollway.coordinator.runs import RunManager

    manager = RunManager(str(tmp_path))
    first = start_for_coordinator(
        manager, CoordinatorServiceConfig(runs_root=str(tmp_path), dashboard_port=0), 1, ""
    )
    assert first is None  # 0: no dashboard
    holder = DashboardServer(create_app(DashboardRuns(run_dirs=[tmp_path])), "127.0.0.1", 0).start()
    try:
        # -1: the gRPC port + DASHBOARD_PORT_OFFSET, here taken: a free one instead.
        address_file = tmp_path / "dashboard.address"
        config = CoordinatorServiceConfig(runs_root=str(tmp_path), dashboard_address_file=str(address_file))
        beside = start_for_coordinator(manager, config, holder.port - DASHBOARD_PORT_OFFSET, "")
        assert beside is not None and beside.port != holder.port
        assert address_file.read_text() == beside.url
        assert get(f"{beside.url}/api/runs") == []
        beside.stop()
        # The coordinator's token (gRPC's) guards its dashboard too.
        guarded = start_for_coordinator(manager, CoordinatorServiceConfig(runs_root=str(tmp_path)), 0, "tok")
        with pytest.raises(urllib.error.HTTPError) as error:
            get(f"{guarded.url}/api/runs")
        assert error.value.code == 401
        assert get(f"{guarded.url}/api/runs", {"Authorization": "Bearer tok"}) == []
        guarded.stop()
        # A port given explicitly and taken: no dashboard (logged), and the coordinator goes on.
        config = CoordinatorServiceConfig(runs_root=str(tmp_path), dashboard_port=holder.port)
        assert start_for_coordinator(manager, config, 5000, "") is None
    finally:
        holder.stop()
