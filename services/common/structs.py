"""Plain dicts as google.protobuf.Struct and back, the type of every settings, overrides and
metadata field in the protos (a run's config, a service's settings, a checkpoint's extra state,
a prompt's metadata). The one place a Struct is read, in every service."""

from __future__ import annotations

from google.protobuf import struct_pb2


def to_struct(mapping: dict | None) -> struct_pb2.Struct:
    """`mapping` (JSON-like: str keys; numbers, strings, bools, None, lists, dicts) as a Struct;
    None gives an empty one."""
    struct = struct_pb2.Struct()
    struct.update(mapping or {})
    return struct


def from_struct(struct: struct_pb2.Struct | None) -> dict:
    """A Struct as plain data (None or unset: {}), numbers as given (floats, as Struct holds them).
    Not json_format.MessageToDict: it fails on NaN or an infinity, which a client can send
    (protobuf's binary form carries them); each service's validation refuses them instead, with an
    error naming the setting."""
    if struct is None:
        return {}
    return {key: _plain(struct.fields[key]) for key in struct.fields}


def _plain(value: struct_pb2.Value):
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return from_struct(value.struct_value)
    if kind == "list_value":
        return [_plain(v) for v in value.list_value.values]
    if kind in (None, "null_value"):
        return None
    return getattr(value, kind)
