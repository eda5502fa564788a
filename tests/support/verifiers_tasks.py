"""verifiers (0.4.0) tasksets built from the package's own classes on local data, for the tests of
--environment verifiers: the demo's addition task (single turn) and the same task with a Python
function tool (vf.Toolset with a @vf.tool method, served over MCP by verifiers' code).

The addition rows come from the parquet file in $ROLLWAY_VF_ADDITION_DATA (the demo's rl.parquet),
its first $ROLLWAY_VF_ADDITION_ROWS rows (default 32).
"""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import verifiers.v1 as vf


class AdditionData(vf.TaskData):
    answer: str


class AdditionTask(vf.Task[AdditionData]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        """The last reply is the sum."""
        return float((trace.messages[-1].content or "").strip() == task.answer)

    @vf.reward(weight=0.5)
    async def starts_with_digit(self, trace) -> float:
        """A format reward with variance on a random tiny model: the reply starts with a digit."""
        return float((trace.messages[-1].content or "")[:1].isdigit())

    @vf.metric
    async def num_tool_calls(self, trace) -> float:
        return float(sum(len(m.tool_calls or []) for m in trace.assistant_messages))


class Calculator(vf.Toolset):
    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class AdditionWithToolTask(AdditionTask):
    @classmethod
    def toolsets(cls, config):
        return [Calculator(vf.ToolsetConfig())]


def _rows():
    table = pq.read_table(os.environ["ROLLWAY_VF_ADDITION_DATA"]).to_pylist()
    return table[: int(os.environ.get("ROLLWAY_VF_ADDITION_ROWS", "32"))]


class AdditionTaskset(vf.Taskset[AdditionTask]):
    def load(self):
        for row in _rows():
            yield AdditionTask(AdditionData(prompt=row["prompt"], answer=row["label"]))


class AdditionToolTaskset(vf.Taskset[AdditionWithToolTask]):
    def load(self):
        for row in _rows():
            yield AdditionWithToolTask(
                AdditionData(
                    prompt=row["prompt"],
                    system_prompt="Use the add tool, then answer with the number.",
                    answer=row["label"],
                )
            )


def addition() -> AdditionTaskset:
    return AdditionTaskset(vf.TasksetConfig(id="rollway-addition"))


def addition_with_tool() -> AdditionToolTaskset:
    return AdditionToolTaskset(vf.TasksetConfig(id="rollway-addition-tool"))
