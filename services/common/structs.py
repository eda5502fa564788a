"""Plain dicts as google.protobuf.Struct, the type of every settings and overrides field in the
protos (a run's config, a service's settings, a checkpoint's extra state)."""

from __future__ import annotations

from google.protobuf import struct_pb2


def to_struct(mapping: dict | None) -> struct_pb2.Struct:
    """`mapping` (JSON-like: str keys; numbers, strings, bools, None, lists, dicts) as a Struct;
    None gives an empty one."""
    struct = struct_pb2.Struct()
    struct.update(mapping or {})
    return struct
