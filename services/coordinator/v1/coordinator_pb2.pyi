from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATE_UNSPECIFIED: _ClassVar[RunState]
    RUN_STATE_STARTING: _ClassVar[RunState]
    RUN_STATE_RUNNING: _ClassVar[RunState]
    RUN_STATE_SUCCEEDED: _ClassVar[RunState]
    RUN_STATE_FAILED: _ClassVar[RunState]
    RUN_STATE_STOPPED: _ClassVar[RunState]
RUN_STATE_UNSPECIFIED: RunState
RUN_STATE_STARTING: RunState
RUN_STATE_RUNNING: RunState
RUN_STATE_SUCCEEDED: RunState
RUN_STATE_FAILED: RunState
RUN_STATE_STOPPED: RunState

class RunInfo(_message.Message):
    __slots__ = ("run_id", "state", "step", "num_steps", "run_dir", "error", "last_metrics", "checkpoint_dir", "hf_export_dir", "service_addresses", "num_restarts", "dashboard_url", "created_time", "started_time", "finished_time", "seconds_per_step", "eta_seconds", "config", "end_of_data", "notices", "startup")
    class LastMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class ServiceAddressesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    RUN_DIR_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_METRICS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    HF_EXPORT_DIR_FIELD_NUMBER: _ClassVar[int]
    SERVICE_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    NUM_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    DASHBOARD_URL_FIELD_NUMBER: _ClassVar[int]
    CREATED_TIME_FIELD_NUMBER: _ClassVar[int]
    STARTED_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISHED_TIME_FIELD_NUMBER: _ClassVar[int]
    SECONDS_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    ETA_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    END_OF_DATA_FIELD_NUMBER: _ClassVar[int]
    NOTICES_FIELD_NUMBER: _ClassVar[int]
    STARTUP_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    state: RunState
    step: int
    num_steps: int
    run_dir: str
    error: str
    last_metrics: _containers.ScalarMap[str, float]
    checkpoint_dir: str
    hf_export_dir: str
    service_addresses: _containers.ScalarMap[str, str]
    num_restarts: int
    dashboard_url: str
    created_time: float
    started_time: float
    finished_time: float
    seconds_per_step: float
    eta_seconds: float
    config: _struct_pb2.Struct
    end_of_data: str
    notices: _containers.RepeatedScalarFieldContainer[str]
    startup: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., state: _Optional[_Union[RunState, str]] = ..., step: _Optional[int] = ..., num_steps: _Optional[int] = ..., run_dir: _Optional[str] = ..., error: _Optional[str] = ..., last_metrics: _Optional[_Mapping[str, float]] = ..., checkpoint_dir: _Optional[str] = ..., hf_export_dir: _Optional[str] = ..., service_addresses: _Optional[_Mapping[str, str]] = ..., num_restarts: _Optional[int] = ..., dashboard_url: _Optional[str] = ..., created_time: _Optional[float] = ..., started_time: _Optional[float] = ..., finished_time: _Optional[float] = ..., seconds_per_step: _Optional[float] = ..., eta_seconds: _Optional[float] = ..., config: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., end_of_data: _Optional[str] = ..., notices: _Optional[_Iterable[str]] = ..., startup: _Optional[_Iterable[str]] = ...) -> None: ...

class StartRunRequest(_message.Message):
    __slots__ = ("config", "run_id")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    config: _struct_pb2.Struct
    run_id: str
    def __init__(self, config: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., run_id: _Optional[str] = ...) -> None: ...

class StartRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: RunInfo
    def __init__(self, run: _Optional[_Union[RunInfo, _Mapping]] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: RunInfo
    def __init__(self, run: _Optional[_Union[RunInfo, _Mapping]] = ...) -> None: ...

class StreamMetricsRequest(_message.Message):
    __slots__ = ("run_id", "from_step")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_STEP_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    from_step: int
    def __init__(self, run_id: _Optional[str] = ..., from_step: _Optional[int] = ...) -> None: ...

class StreamMetricsResponse(_message.Message):
    __slots__ = ("step", "metrics", "time", "state")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    step: int
    metrics: _containers.ScalarMap[str, float]
    time: float
    state: RunState
    def __init__(self, step: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., time: _Optional[float] = ..., state: _Optional[_Union[RunState, str]] = ...) -> None: ...

class ValidateRunRequest(_message.Message):
    __slots__ = ("config", "run_id")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    config: _struct_pb2.Struct
    run_id: str
    def __init__(self, config: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., run_id: _Optional[str] = ...) -> None: ...

class ValidateRunResponse(_message.Message):
    __slots__ = ("num_steps", "end_of_data", "num_epochs", "num_rows", "samples_per_rollout", "optimizer_steps_per_rollout", "plan", "config")
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    END_OF_DATA_FIELD_NUMBER: _ClassVar[int]
    NUM_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_STEPS_PER_ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    num_steps: int
    end_of_data: str
    num_epochs: float
    num_rows: int
    samples_per_rollout: int
    optimizer_steps_per_rollout: int
    plan: str
    config: _struct_pb2.Struct
    def __init__(self, num_steps: _Optional[int] = ..., end_of_data: _Optional[str] = ..., num_epochs: _Optional[float] = ..., num_rows: _Optional[int] = ..., samples_per_rollout: _Optional[int] = ..., optimizer_steps_per_rollout: _Optional[int] = ..., plan: _Optional[str] = ..., config: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class GetConfigSchemaRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetConfigSchemaResponse(_message.Message):
    __slots__ = ("json_schema",)
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    def __init__(self, json_schema: _Optional[str] = ...) -> None: ...

class StopRunRequest(_message.Message):
    __slots__ = ("run_id", "immediate")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    IMMEDIATE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    immediate: bool
    def __init__(self, run_id: _Optional[str] = ..., immediate: _Optional[bool] = ...) -> None: ...

class StopRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: RunInfo
    def __init__(self, run: _Optional[_Union[RunInfo, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[RunInfo]
    def __init__(self, runs: _Optional[_Iterable[_Union[RunInfo, _Mapping]]] = ...) -> None: ...
