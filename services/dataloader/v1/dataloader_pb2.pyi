from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataItem(_message.Message):
    __slots__ = ("prompt_token_ids", "token_ids", "loss_mask", "label", "metadata", "source", "row_index", "epoch", "prompt_text")
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ROW_INDEX_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    loss_mask: _containers.RepeatedScalarFieldContainer[int]
    label: str
    metadata: _struct_pb2.Struct
    source: str
    row_index: int
    epoch: int
    prompt_text: str
    def __init__(self, prompt_token_ids: _Optional[_Iterable[int]] = ..., token_ids: _Optional[_Iterable[int]] = ..., loss_mask: _Optional[_Iterable[int]] = ..., label: _Optional[str] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., source: _Optional[str] = ..., row_index: _Optional[int] = ..., epoch: _Optional[int] = ..., prompt_text: _Optional[str] = ...) -> None: ...

class NextBatchRequest(_message.Message):
    __slots__ = ("batch_size", "batch_id")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    batch_id: int
    def __init__(self, batch_size: _Optional[int] = ..., batch_id: _Optional[int] = ...) -> None: ...

class NextBatchResponse(_message.Message):
    __slots__ = ("items", "prefetch_queue_depth", "epoch", "exhausted", "counters")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[DataItem]
    prefetch_queue_depth: int
    epoch: int
    exhausted: bool
    counters: _containers.ScalarMap[str, int]
    def __init__(self, items: _Optional[_Iterable[_Union[DataItem, _Mapping]]] = ..., prefetch_queue_depth: _Optional[int] = ..., epoch: _Optional[int] = ..., exhausted: _Optional[bool] = ..., counters: _Optional[_Mapping[str, int]] = ...) -> None: ...

class GetStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStateResponse(_message.Message):
    __slots__ = ("state_json", "num_batches_served", "epoch")
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    NUM_BATCHES_SERVED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    state_json: str
    num_batches_served: int
    epoch: int
    def __init__(self, state_json: _Optional[str] = ..., num_batches_served: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class RestoreStateRequest(_message.Message):
    __slots__ = ("state_json",)
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    state_json: str
    def __init__(self, state_json: _Optional[str] = ...) -> None: ...

class RestoreStateResponse(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SourceInfo(_message.Message):
    __slots__ = ("name", "path", "num_rows", "weight", "format", "num_usable_rows", "num_bad_rows")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    NUM_USABLE_ROWS_FIELD_NUMBER: _ClassVar[int]
    NUM_BAD_ROWS_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    num_rows: int
    weight: float
    format: str
    num_usable_rows: int
    num_bad_rows: int
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., num_rows: _Optional[int] = ..., weight: _Optional[float] = ..., format: _Optional[str] = ..., num_usable_rows: _Optional[int] = ..., num_bad_rows: _Optional[int] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("sources", "mode", "counters", "config", "error", "epoch", "exhausted", "eval_sources")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    EVAL_SOURCES_FIELD_NUMBER: _ClassVar[int]
    sources: _containers.RepeatedCompositeFieldContainer[SourceInfo]
    mode: str
    counters: _containers.ScalarMap[str, int]
    config: _struct_pb2.Struct
    error: str
    epoch: int
    exhausted: bool
    eval_sources: _containers.RepeatedCompositeFieldContainer[SourceInfo]
    def __init__(self, sources: _Optional[_Iterable[_Union[SourceInfo, _Mapping]]] = ..., mode: _Optional[str] = ..., counters: _Optional[_Mapping[str, int]] = ..., config: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., error: _Optional[str] = ..., epoch: _Optional[int] = ..., exhausted: _Optional[bool] = ..., eval_sources: _Optional[_Iterable[_Union[SourceInfo, _Mapping]]] = ...) -> None: ...

class EvalBatchRequest(_message.Message):
    __slots__ = ("name", "offset", "batch_size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    offset: int
    batch_size: int
    def __init__(self, name: _Optional[str] = ..., offset: _Optional[int] = ..., batch_size: _Optional[int] = ...) -> None: ...

class EvalBatchResponse(_message.Message):
    __slots__ = ("items", "next_offset", "done", "num_rows", "num_dropped")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    NUM_DROPPED_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[DataItem]
    next_offset: int
    done: bool
    num_rows: int
    num_dropped: int
    def __init__(self, items: _Optional[_Iterable[_Union[DataItem, _Mapping]]] = ..., next_offset: _Optional[int] = ..., done: _Optional[bool] = ..., num_rows: _Optional[int] = ..., num_dropped: _Optional[int] = ...) -> None: ...

class InitRequest(_message.Message):
    __slots__ = ("config", "run_id", "rebuild")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REBUILD_FIELD_NUMBER: _ClassVar[int]
    config: _struct_pb2.Struct
    run_id: str
    rebuild: bool
    def __init__(self, config: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., run_id: _Optional[str] = ..., rebuild: _Optional[bool] = ...) -> None: ...

class InitResponse(_message.Message):
    __slots__ = ("run_id", "already_initialized", "settings", "vocab_size", "error")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ALREADY_INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    already_initialized: bool
    settings: _struct_pb2.Struct
    vocab_size: int
    error: str
    def __init__(self, run_id: _Optional[str] = ..., already_initialized: _Optional[bool] = ..., settings: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., vocab_size: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class EndRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class EndRunResponse(_message.Message):
    __slots__ = ("was_holding",)
    WAS_HOLDING_FIELD_NUMBER: _ClassVar[int]
    was_holding: bool
    def __init__(self, was_holding: _Optional[bool] = ...) -> None: ...
