"""Struct <-> plain data (common/structs.py), the one reader of Struct fields in every service."""

from __future__ import annotations

import math

from google.protobuf import json_format

from rollway.common.structs import from_struct, to_struct

NESTED = {"lr": 3e-4, "steps": 2, "name": "x", "on": True, "none": None, "list": [1, "a", {"k": [False]}],
          "inner": {"deep": {"n": -1.5}}}  # fmt: skip


def test_from_struct_reads_what_json_format_reads_and_round_trips_to_struct():
    struct = to_struct(NESTED)
    assert from_struct(struct) == json_format.MessageToDict(struct)
    assert from_struct(struct) == NESTED  # a Struct's numbers are floats: 2.0 == 2
    assert isinstance(from_struct(struct)["steps"], float)
    assert from_struct(None) == {} and from_struct(to_struct(None)) == {}


def test_non_finite_numbers_come_through_for_validation_to_name():
    struct = to_struct({"lr": float("nan"), "clip": float("inf"), "nested": {"x": float("-inf")}})
    plain = from_struct(struct)
    assert math.isnan(plain["lr"]) and plain["clip"] == math.inf and plain["nested"] == {"x": -math.inf}
