"""The step timeline's trace index: read as the file grows, dataloading summed per step."""

from __future__ import annotations

import json

from rollway.coordinator.dashboard.trace_index import TraceIndex


def span(name: str, trace_id: str, start: float, end: float, kind: str = "CLIENT", **attributes) -> str:
    record = {"name": name, "trace_id": trace_id, "kind": kind, "start_ns": int(start * 1e9),
              "end_ns": int(end * 1e9), "attributes": attributes}  # fmt: skip
    return json.dumps(record) + "\n"


NEXT_BATCH = "rollway.dataloader.v1.DataloaderService/NextBatch"


def test_dataloading_is_summed_per_step_as_the_file_grows(tmp_path):
    path = tmp_path / "trace.jsonl"
    first = span(NEXT_BATCH, "t1", 100.0, 100.25) + span(NEXT_BATCH, "t1", 100.5, 100.75)
    first += span(NEXT_BATCH, "t1", 100.6, 100.7, kind="SERVER")  # the dataloader's side: not counted
    root = span("rl_step", "t1", 100.0, 102.0, kind="INTERNAL", step=0)
    path.write_text(first + root[:10])  # the root span still being written
    index = TraceIndex(path)
    index.refresh()
    assert index.dataloading(0, 101.9) is None
    with path.open("a") as f:
        f.write(root[10:] + span(NEXT_BATCH, "t2", 102.0, 102.125))
    index.refresh()
    assert index.dataloading(0, 101.9) == 0.5
    assert index.dataloading(1, 103.0) is None  # its root has not ended yet
    assert index.dataloading(0, 500.0) is None  # a step 0 of another run, much later


def test_a_new_file_at_the_path_is_read_from_its_start(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text(span(NEXT_BATCH, "a", 0, 1) * 5 + span("rl_step", "a", 0, 2, kind="INTERNAL", step=3))
    index = TraceIndex(path)
    index.refresh()
    assert index.dataloading(3, 2.0) == 5.0
    path.write_text(span("rl_step", "b", 10, 11, kind="INTERNAL", step=3))
    index.refresh()
    assert index.dataloading(3, 11.0) == 0.0
    assert [s.end for s in index.steps] == [11.0]  # the old file's steps are gone
