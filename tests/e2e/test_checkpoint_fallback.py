"""A corrupt latest run checkpoint: resume falls back to the newest usable one, loudly, and consistently."""

from __future__ import annotations

import json
import re
from contextlib import ExitStack
from pathlib import Path

import pytest
from support.stack import coordinator_stub, sft_service_args, start_run, start_services, wait_run
from support.waiting import wait_until

from rollway.coordinator.prompt_ledger import PromptLedger
from rollway.coordinator.v1 import coordinator_pb2


def sft_config(services, save, **extra) -> dict:
    return {
        "loss_type": "sft_loss",
        "rollout_batch_size": 16,
        "global_batch_size": 16,
        "dataloader_addr": services["dataloader"].address,
        "trainer_addr": services["trainer"].address,
        "save": str(save),
        "save_interval": 2,
        "num_rollout": 6,
        **extra,
    }


@pytest.fixture(scope="module")
def services(tmp_path_factory, tiny_model_dir, demo_data_dir):
    """One set of SFT services for every run of this file, as a user's runs share them: each run
    has its own run id (and run directory under the coordinator's runs root)."""
    workdir = tmp_path_factory.mktemp("fallback")
    with ExitStack() as stack:
        yield start_services(stack, workdir, sft_service_args(tiny_model_dir, demo_data_dir))


def runs_root(services) -> Path:
    return services["coordinator"].workdir / "runs"


def run(services, name: str, save, **extra) -> tuple[coordinator_pb2.RunInfo, dict, dict]:
    """One SFT run to its end; (final info, losses by step, what each service logged during it)."""
    before = {service: process.log_text() for service, process in services.items()}
    stub = coordinator_stub(services["coordinator"])
    start_run(stub, name, sft_config(services, save, **extra))
    final = wait_run(stub, name)
    metrics = runs_root(services) / name / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    # This run's lines only: the services logged the other runs of this file too.
    logs = {service: process.log_text()[len(before[service]) :] for service, process in services.items()}
    return final, {r["step"]: r["sft/loss"] for r in records}, {**logs, "records": records}


def test_resume_skips_corrupt_checkpoints_and_fails_clearly_when_none_is_usable(services, tmp_path):
    save = tmp_path / "save"
    # Written in the background (async_save): what the resume below reads must be as complete.
    final, straight, first = run(services, "corrupt-first", save, async_save=True)
    assert final.state == coordinator_pb2.RUN_STATE_SUCCEEDED, final.error
    assert sorted(straight) == list(range(6))
    saves = {r["step"]: r for r in first["records"] if "perf/save_time" in r}
    assert sorted(saves) == [1, 3, 5]
    assert "perf/save_write_time" not in saves[1]  # still being written when step 1 ended
    assert all(saves[s]["perf/save_write_time"] > 0 and saves[s]["checkpoint/bytes"] > 0 for s in (3, 5))
    assert sorted(p.name for p in save.glob("rollout_*")) == [
        "rollout_0000002",
        "rollout_0000004",
        "rollout_0000006",
    ]

    # The latest: a truncated trainer shard; the one before: an edited coordinator.json.
    shard = sorted((save / "rollout_0000006" / "trainer").glob("iter_*/model/*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:-100])
    state_file = save / "rollout_0000004" / "coordinator.json"
    state_file.write_text(state_file.read_text().replace('"next_batch_id": 4', '"next_batch_id": "4"'))

    final, resumed, logs = run(services, "corrupt-resumed", save)
    assert final.state == coordinator_pb2.RUN_STATE_SUCCEEDED, final.error
    # Resumed at rollout 2 with the trainer and data of rollout 2: steps 2..5 redo the same losses.
    assert sorted(resumed) == [2, 3, 4, 5]
    assert [resumed[s] for s in range(2, 6)] == pytest.approx([straight[s] for s in range(2, 6)], rel=1e-5)
    assert "run checkpoint unusable, trying the previous one" in logs["coordinator"]
    assert f"{shard.name}: size" in logs["coordinator"] and "checkpoint refused" in logs["coordinator"]
    assert f"{state_file}: next_batch_id must be a non-negative int" in logs["coordinator"]
    assert "resumed from an older run checkpoint" in logs["coordinator"]
    assert "newer checkpoint skipped" not in logs["trainer"]  # the trainer never fell back on its own

    for directory in save.glob("rollout_*"):
        (directory / "dataloader.json").write_text('{"version": 1, "cursor"')
    final, _, _ = run(services, "corrupt-hopeless", save)
    assert final.state == coordinator_pb2.RUN_STATE_FAILED
    assert f"{save}: no usable run checkpoint ({save}/rollout_0000006/dataloader.json: not valid JSON" in (
        final.error
    )


def test_a_bit_flip_in_the_data_cursor_falls_back_and_trains_no_prompt_twice(services, tmp_path):
    """Issue #24: one bit flipped in dataloader.json (a smaller cursor offset) is still valid JSON; the
    run checkpoint's manifest catches it and the resume uses the previous checkpoint."""
    save = tmp_path / "save"
    final, straight, _ = run(services, "flip-first", save)
    assert final.state == coordinator_pb2.RUN_STATE_SUCCEEDED, final.error
    cursor_file = save / "rollout_0000006" / "dataloader.json"
    text = cursor_file.read_text()
    match = re.search(r'"offset": (\d+)', text)
    assert match, text
    digit = match.end(1) - 1  # the offset's last digit loses its lowest set bit: a smaller offset
    lowest_bit = int(text[digit]) & -int(text[digit])
    assert lowest_bit, f"offset {match.group(1)} ends in 0"
    data = bytearray(cursor_file.read_bytes())
    data[digit] ^= lowest_bit
    cursor_file.write_bytes(bytes(data))
    flipped = json.loads(cursor_file.read_text())  # still valid JSON, two or more prompts back
    assert re.search(r'"offset": (\d+)', cursor_file.read_text()).group(1) != match.group(1)
    assert isinstance(flipped, dict)

    final, resumed, logs = run(services, "flip-resumed", save)
    assert final.state == coordinator_pb2.RUN_STATE_SUCCEEDED, final.error
    assert f"{cursor_file}: sha256 does not match the manifest (corrupt)" in logs["coordinator"]
    assert sorted(resumed) == [4, 5]  # from rollout 4, not from the corrupt cursor of rollout 6
    assert [resumed[s] for s in (4, 5)] == pytest.approx([straight[s] for s in (4, 5)], rel=1e-5)
    first_prompts = PromptLedger.by_step(runs_root(services) / "flip-first")
    resumed_prompts = PromptLedger.by_step(runs_root(services) / "flip-resumed")
    assert {s: resumed_prompts[s] for s in (4, 5)} == {s: first_prompts[s] for s in (4, 5)}


def test_save_total_limit_keeps_the_newest_checkpoints_and_a_resume_reads_them(services, tmp_path):
    save = tmp_path / "save"
    final, losses, first = run(services, "kept", save, save_total_limit=2)
    assert final.state == coordinator_pb2.RUN_STATE_SUCCEEDED, final.error
    # Saves after steps 1, 3 and 5 (for rollouts 2, 4, 6); rotation left the newest two.
    assert sorted(p.name for p in save.glob("rollout_*")) == ["rollout_0000004", "rollout_0000006"]
    saves = [r for r in first["records"] if "perf/save_time" in r]
    assert [r["step"] for r in saves] == [1, 3, 5] and all(r["checkpoint/bytes"] > 0 for r in saves)

    final, resumed, _ = run(services, "after-kept", save, num_rollout=8, save_total_limit=2)
    assert final.state == coordinator_pb2.RUN_STATE_SUCCEEDED, final.error
    assert sorted(resumed) == [6, 7]
    assert sorted(p.name for p in save.glob("rollout_*")) == ["rollout_0000006", "rollout_0000008"]


def test_a_run_stopped_during_background_writes_resumes_from_a_complete_checkpoint(services, tmp_path):
    """StopRun (immediate) of an async_save run that saves every step, so a write is in flight or
    just done: every run checkpoint left is complete or is never picked, and the next run on the
    same services resumes from the newest complete one."""
    save = tmp_path / "save"
    stub = coordinator_stub(services["coordinator"])
    config = sft_config(services, save, async_save=True, save_interval=1, num_rollout=10_000)
    start_run(stub, "stopped", config)
    wait_until(
        lambda: stub.GetRun(coordinator_pb2.GetRunRequest(run_id="stopped")).run.step >= 3,
        timeout=120,
        what="three steps of the run to stop",
    )
    stub.StopRun(coordinator_pb2.StopRunRequest(run_id="stopped", immediate=True))
    stopped = wait_run(stub, "stopped", timeout=60)
    assert stopped.state == coordinator_pb2.RUN_STATE_STOPPED, stopped.error

    written = sorted(save.glob("rollout_*"))
    complete = [d for d in written if (d / "coordinator.json").exists()]
    assert complete and all(d in complete for d in written[:-1])  # only the newest may be unfinished
    newest = int(complete[-1].name.removeprefix("rollout_"))
    print("run checkpoints after the stop:", [(d.name, d in complete) for d in written])
    assert newest >= 2  # the write started after step 2 may have been abandoned by the stop

    again = wait_run(stub, start_run(stub, "again", {**config, "num_rollout": newest + 2}).run_id)
    assert again.state == coordinator_pb2.RUN_STATE_SUCCEEDED, again.error
    records = (runs_root(services) / "again" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in records] == [newest, newest + 1]
    assert (save / f"rollout_{newest + 2:07d}" / "coordinator.json").exists()
