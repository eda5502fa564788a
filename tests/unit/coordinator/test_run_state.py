"""Run checkpoints: atomic, latest-complete lookup, RNG round trip, fallback past corrupt ones; debug dumps."""

import functools
import json
import random
from pathlib import Path
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
from structlog.testing import capture_logs

from rollway.common.errors import NotFound
from rollway.common.v1 import common_pb2
from rollway.coordinator import debug_data, run_state
from rollway.coordinator.run_state import RunCheckpointError, RunState
from rollway.trainer.v1 import trainer_pb2


def test_checkpoint_round_trip_and_latest(tmp_path):
    state = RunState(next_rollout_id=3, next_batch_id=5, weight_version=4, tokens_seen=99)
    run_state.write_checkpoint(run_state.checkpoint_dir(tmp_path, 3), state, '{"cursor": 1}')
    random.seed(7)
    np.random.seed(7)
    expected = (random.random(), np.random.rand())
    random.seed(7)
    np.random.seed(7)
    run_state.write_checkpoint(run_state.checkpoint_dir(tmp_path, 6), RunState(next_rollout_id=6), None)
    # a save killed half-way: trainer files but no coordinator.json
    (run_state.checkpoint_dir(tmp_path, 9) / "trainer").mkdir(parents=True)
    found = run_state.find_checkpoint(tmp_path)
    assert found.name == "rollout_0000006"
    restored, cursor = run_state.read_checkpoint(found)
    assert restored.next_rollout_id == 6 and cursor is None
    random.seed(1)
    np.random.seed(1)
    restored.restore_rng()
    assert (random.random(), np.random.rand()) == expected
    first, cursor = run_state.read_checkpoint(run_state.checkpoint_dir(tmp_path, 3))
    assert (first.next_batch_id, first.weight_version, cursor) == (5, 4, '{"cursor": 1}')
    assert run_state.find_checkpoint(tmp_path / "missing") is None


def write(save, rollout_id: int, cursor: str | None = '{"cursor": 1}'):
    directory = run_state.checkpoint_dir(save, rollout_id)
    run_state.write_checkpoint(
        directory, RunState(next_rollout_id=rollout_id, next_batch_id=2 * rollout_id), cursor
    )
    return directory


@pytest.mark.parametrize(
    ("file", "content", "problem"),
    [
        ("coordinator.json", '{"next_rollout_id": 3, "next_batch', "not valid JSON (Unterminated string"),
        ("coordinator.json", "[1, 2]", "not a JSON object"),
        ("coordinator.json", '{"next_rollout_id": 3, "cursor": 1}', "unknown field(s) cursor"),
        (
            "coordinator.json",
            '{"next_rollout_id": "3"}',
            'next_rollout_id must be a non-negative int (got "3")',
        ),
        ("coordinator.json", '{"partial_groups": {}}', "partial_groups must be a list (got {})"),
        ("coordinator.json", b"\xff\xfe", "unreadable ('utf-8' codec can't decode"),
        ("dataloader.json", '{"cursor": {"epoch": 0', "not valid JSON (Expecting"),
        ("dataloader.json", '"cursor"', "not a JSON object"),
    ],
)
def test_a_corrupt_checkpoint_file_is_an_error_naming_the_file(tmp_path, file, content, problem):
    directory = write(tmp_path, 3)
    path = directory / file
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    with pytest.raises(RunCheckpointError) as info:
        run_state.read_checkpoint(directory)
    assert str(info.value).startswith(f"{path}: {problem}")


def test_resume_falls_back_past_corrupt_checkpoints_and_says_so(tmp_path):
    for rollout_id in (2, 4, 6, 8):
        write(tmp_path, rollout_id, cursor=json.dumps({"at": rollout_id}))
    (tmp_path / "rollout_0000010" / "trainer").mkdir(parents=True)  # a save killed half-way: not a candidate
    (tmp_path / "rollout_0000008" / "coordinator.json").write_text("{")  # the latest: truncated
    (tmp_path / "rollout_0000006" / "dataloader.json").write_text('{"at": 6')  # edited
    restored = []

    def restore(directory, state, cursor):
        restored.append((directory.name, state.next_rollout_id, cursor))
        if directory.name == "rollout_0000004":  # e.g. its trainer checkpoint does not verify
            raise RunCheckpointError(f"{directory}/trainer: checkpoint refused: corrupt")

    with capture_logs() as logs:
        resumed = run_state.resume(tmp_path, restore)
    assert (resumed.directory.name, resumed.state.next_rollout_id, resumed.state.next_batch_id) == (
        "rollout_0000002",
        2,
        4,
    )
    assert restored == [("rollout_0000004", 4, '{"at": 4}'), ("rollout_0000002", 2, '{"at": 2}')]
    assert [reason.split(": ")[0] for reason in resumed.skipped] == [
        str(tmp_path / "rollout_0000008" / "coordinator.json"),
        str(tmp_path / "rollout_0000006" / "dataloader.json"),
        str(tmp_path / "rollout_0000004" / "trainer"),
    ]
    warnings = [(e["event"], Path(e["checkpoint"]).name) for e in logs if e["log_level"] == "warning"]
    assert warnings == [
        ("run checkpoint unusable, trying the previous one", "rollout_0000008"),
        ("run checkpoint unusable, trying the previous one", "rollout_0000006"),
        ("run checkpoint unusable, trying the previous one", "rollout_0000004"),
        ("resumed from an older run checkpoint", "rollout_0000002"),
    ]
    assert logs[0]["reason"] == resumed.skipped[0]


def test_resume_when_every_checkpoint_is_corrupt_names_the_directory(tmp_path):
    for rollout_id in (1, 2):
        write(tmp_path, rollout_id)
        (run_state.checkpoint_dir(tmp_path, rollout_id) / "coordinator.json").write_text("")
    with pytest.raises(RunCheckpointError) as info:
        run_state.resume(tmp_path, lambda *args: None)
    message = str(info.value)
    assert message.startswith(
        f"{tmp_path}: no usable run checkpoint ({tmp_path}/rollout_0000002/coordinator.json"
    )
    assert f"{tmp_path}/rollout_0000001/coordinator.json: not valid JSON" in message
    assert run_state.resume(tmp_path / "empty", lambda *args: None) is None  # nothing saved yet: a fresh run
    # A checkpoint named directly is the only one tried.
    with pytest.raises(RunCheckpointError, match=f"^{tmp_path}/rollout_0000001: no usable run checkpoint"):
        run_state.resume(run_state.checkpoint_dir(tmp_path, 1), lambda *args: None)


def test_the_latest_pointer_bounds_the_candidates(tmp_path):
    write(tmp_path, 1)
    write(tmp_path, 2)
    write(tmp_path, 3)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("rollout_0000002\n")  # 3 never became latest
    assert [p.name for p in run_state.candidates(tmp_path)] == ["rollout_0000002", "rollout_0000001"]
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("garbage")
    assert [p.name for p in run_state.candidates(tmp_path)] == [
        "rollout_0000003",
        "rollout_0000002",
        "rollout_0000001",
    ]


class FakeTrainer:
    def __init__(self, reply=None, error=None):
        self.reply, self.error, self.paths = reply, error, []

    def LoadCheckpoint(self, request):
        self.paths.append(request.path)
        if self.error is not None:
            raise self.error
        return self.reply


class Refusal(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


def loaded(next_rollout_id=None, skipped=()):
    reply = trainer_pb2.LoadCheckpointResponse(checkpoint_dir="/c/trainer/iter_0000004", global_step=4)
    if next_rollout_id is not None:
        reply.extra_state.update({"next_rollout_id": next_rollout_id})
    reply.skipped_checkpoints.extend(skipped)
    return reply


@pytest.mark.parametrize(
    ("trainer", "problem"),
    [
        (FakeTrainer(loaded(2)), None),
        (FakeTrainer(loaded()), None),  # saved before checkpoints recorded their rollout
        (
            FakeTrainer(loaded(3)),
            "/c/trainer/iter_0000004: saved for rollout 3, but /c/coordinator.json continues at rollout 2",
        ),
        (
            FakeTrainer(loaded(2, ["/c/trainer/iter_0000005/meta.json: missing"])),
            "/c/trainer: /c/trainer/iter_0000005/meta.json: missing",
        ),
        (
            FakeTrainer(error=Refusal(grpc.StatusCode.FAILED_PRECONDITION, "checkpoint refused: x")),
            "/c/trainer: checkpoint refused: x",
        ),
        (
            FakeTrainer(error=Refusal(grpc.StatusCode.NOT_FOUND, "path: /c/trainer does not exist")),
            "/c/trainer: path: /c/trainer does not exist",
        ),
    ],
)
def test_restore_services_refuses_a_trainer_checkpoint_that_does_not_belong_to_the_run_state(
    trainer, problem
):
    services = SimpleNamespace(trainer=trainer, dataloader=None)
    restore = functools.partial(
        run_state.restore_services, services, True, Path("/c"), RunState(next_rollout_id=2)
    )
    if problem is None:
        restore(None)
    else:
        with pytest.raises(RunCheckpointError) as info:
            restore(None)
        assert str(info.value) == problem
    assert trainer.paths == ["/c/trainer"]


def test_restore_services_lets_a_dead_trainer_fail_the_resume():
    trainer = FakeTrainer(error=Refusal(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    with pytest.raises(grpc.RpcError):  # not a corrupt checkpoint: no fallback to an older one
        run_state.restore_services(
            SimpleNamespace(trainer=trainer, dataloader=None), True, Path("/c"), RunState(), None
        )


def test_restore_services_names_the_cursor_file_the_dataloader_refuses():
    class Dataloader:
        def RestoreState(self, request):
            assert request.state_json == '{"cursor": {"offset": 999}}'
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "state_json: bad cursor: offset 999")

    services = SimpleNamespace(trainer=None, dataloader=Dataloader())
    with pytest.raises(RunCheckpointError) as info:
        run_state.restore_services(services, False, Path("/c"), RunState(), '{"cursor": {"offset": 999}}')
    assert (
        str(info.value) == "/c/dataloader.json: refused by the dataloader: state_json: bad cursor: offset 999"
    )


def test_debug_rollout_dump_is_bit_exact(tmp_path):
    samples = [
        common_pb2.Sample(
            group_index=1,
            index=2,
            response_token_ids=[5, 6],
            rollout_log_probs=[-0.1234567, -2.5],
            advantages=[0.3, 0.3],
            reward=1.0,
            weight_version=7,
        )
    ]
    template = str(tmp_path / "dump_{rollout_id}.pb")
    path = debug_data.save_rollout(template, 4, samples)
    assert path.name == "dump_4.pb"
    assert debug_data.load_rollout(template, 4) == samples
    assert debug_data.rollout_path(str(tmp_path), 2).name == "rollout_2.pb"
    with pytest.raises(NotFound, match="no dump for rollout 5"):
        debug_data.load_rollout(template, 5)


def flip_bit(path: Path, offset: int, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def test_a_bit_flip_that_still_parses_falls_back_naming_the_file(tmp_path):
    """Issue #24: the cursor's offset 112 -> 110 is valid JSON; only the manifest catches it."""
    for rollout_id in (2, 4):
        write(tmp_path, rollout_id, cursor=json.dumps({"epoch": 0, "offset": 56 * rollout_id // 2}))
    trainer_manifest = tmp_path / "rollout_0000004" / "trainer" / "iter_0000004" / "manifest.json"
    trainer_manifest.parent.mkdir(parents=True)
    trainer_manifest.write_text("{}")
    write(tmp_path, 4, cursor=json.dumps({"epoch": 0, "offset": 112}))  # rewritten: covers trainer/
    cursor_file = tmp_path / "rollout_0000004" / "dataloader.json"
    manifest = json.loads((tmp_path / "rollout_0000004" / "manifest.json").read_text())
    assert sorted(manifest["files"]) == [
        "coordinator.json",
        "dataloader.json",
        "trainer/iter_0000004/manifest.json",
    ]
    offset = cursor_file.read_text().index("112") + 2
    flip_bit(cursor_file, offset, 1)  # "2" (0x32) -> "0" (0x30)
    assert json.loads(cursor_file.read_text())["offset"] == 110
    restored = []
    resumed = run_state.resume(tmp_path, lambda directory, state, cursor: restored.append(cursor))
    assert resumed.directory.name == "rollout_0000002"
    assert json.loads(resumed.cursor) == {"epoch": 0, "offset": 56}
    assert restored == [resumed.cursor]  # the corrupt cursor never reached the dataloader
    assert resumed.skipped == [f"{cursor_file}: sha256 does not match the manifest (corrupt)"]


def test_every_run_checkpoint_file_is_verified(tmp_path):
    directory = write(tmp_path, 3)
    nested = directory / "trainer" / "iter_0000003"
    nested.mkdir(parents=True)
    (nested / "manifest.json").write_text('{"files": {}}')
    (directory / "trainer" / "latest_checkpointed_iteration.txt").write_text("3")
    write(tmp_path, 3)
    run_state.read_checkpoint(directory)
    for name in (
        "coordinator.json",
        "trainer/latest_checkpointed_iteration.txt",
        "trainer/iter_0000003/manifest.json",
    ):
        path = directory / name
        original = path.read_bytes()
        flip_bit(path, len(original) - 1, 0)
        with pytest.raises(RunCheckpointError, match=f"^{path}: "):
            run_state.read_checkpoint(directory)
        path.write_bytes(original)
    (directory / "manifest.json").unlink()  # written before this change, or a save stopped before it
    with pytest.raises(RunCheckpointError, match=f"^{directory / 'manifest.json'}: missing"):
        run_state.read_checkpoint(directory)
