from google.protobuf import struct_pb2 as _struct_pb2
from rollway.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
    __slots__ = ("num_parameters", "world_size", "global_step", "model", "already_initialized", "run_id", "vocab_size", "settings", "rebuilt")
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ALREADY_INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    REBUILT_FIELD_NUMBER: _ClassVar[int]
    num_parameters: int
    world_size: int
    global_step: int
    model: str
    already_initialized: bool
    run_id: str
    vocab_size: int
    settings: _struct_pb2.Struct
    rebuilt: bool
    def __init__(self, num_parameters: _Optional[int] = ..., world_size: _Optional[int] = ..., global_step: _Optional[int] = ..., model: _Optional[str] = ..., already_initialized: _Optional[bool] = ..., run_id: _Optional[str] = ..., vocab_size: _Optional[int] = ..., settings: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., rebuilt: _Optional[bool] = ...) -> None: ...

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

class ComputeLogProbsHeader(_message.Message):
    __slots__ = ("temperature", "with_entropy", "use_reference")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    WITH_ENTROPY_FIELD_NUMBER: _ClassVar[int]
    USE_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    with_entropy: bool
    use_reference: bool
    def __init__(self, temperature: _Optional[float] = ..., with_entropy: _Optional[bool] = ..., use_reference: _Optional[bool] = ...) -> None: ...

class ComputeLogProbsRequest(_message.Message):
    __slots__ = ("header", "samples")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    header: ComputeLogProbsHeader
    samples: SampleChunk
    def __init__(self, header: _Optional[_Union[ComputeLogProbsHeader, _Mapping]] = ..., samples: _Optional[_Union[SampleChunk, _Mapping]] = ...) -> None: ...

class SampleLogProbs(_message.Message):
    __slots__ = ("index", "log_probs", "entropy")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_FIELD_NUMBER: _ClassVar[int]
    index: int
    log_probs: _containers.RepeatedScalarFieldContainer[float]
    entropy: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, index: _Optional[int] = ..., log_probs: _Optional[_Iterable[float]] = ..., entropy: _Optional[_Iterable[float]] = ...) -> None: ...

class ComputeLogProbsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SampleLogProbs]
    def __init__(self, results: _Optional[_Iterable[_Union[SampleLogProbs, _Mapping]]] = ...) -> None: ...

class SampleChunk(_message.Message):
    __slots__ = ("samples",)
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[_common_pb2.Sample]
    def __init__(self, samples: _Optional[_Iterable[_Union[_common_pb2.Sample, _Mapping]]] = ...) -> None: ...

class TrainStepHeader(_message.Message):
    __slots__ = ("step_id", "num_samples", "overrides")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    num_samples: int
    overrides: _struct_pb2.Struct
    def __init__(self, step_id: _Optional[int] = ..., num_samples: _Optional[int] = ..., overrides: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class TrainStepRequest(_message.Message):
    __slots__ = ("header", "samples")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    header: TrainStepHeader
    samples: SampleChunk
    def __init__(self, header: _Optional[_Union[TrainStepHeader, _Mapping]] = ..., samples: _Optional[_Union[SampleChunk, _Mapping]] = ...) -> None: ...

class TrainStepResponse(_message.Message):
    __slots__ = ("step_id", "global_step", "metrics", "already_applied")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    ALREADY_APPLIED_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    global_step: int
    metrics: _containers.ScalarMap[str, float]
    already_applied: bool
    def __init__(self, step_id: _Optional[int] = ..., global_step: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., already_applied: _Optional[bool] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ("path", "hf_export", "extra_state", "async_save", "adapter")
    PATH_FIELD_NUMBER: _ClassVar[int]
    HF_EXPORT_FIELD_NUMBER: _ClassVar[int]
    EXTRA_STATE_FIELD_NUMBER: _ClassVar[int]
    ASYNC_SAVE_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    path: str
    hf_export: bool
    extra_state: _struct_pb2.Struct
    async_save: bool
    adapter: str
    def __init__(self, path: _Optional[str] = ..., hf_export: _Optional[bool] = ..., extra_state: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., async_save: _Optional[bool] = ..., adapter: _Optional[str] = ...) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ("checkpoint_dir", "hf_dir", "global_step", "blocking_seconds")
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    HF_DIR_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    BLOCKING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    checkpoint_dir: str
    hf_dir: str
    global_step: int
    blocking_seconds: float
    def __init__(self, checkpoint_dir: _Optional[str] = ..., hf_dir: _Optional[str] = ..., global_step: _Optional[int] = ..., blocking_seconds: _Optional[float] = ...) -> None: ...

class WaitCheckpointRequest(_message.Message):
    __slots__ = ("checkpoint_dir",)
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    checkpoint_dir: str
    def __init__(self, checkpoint_dir: _Optional[str] = ...) -> None: ...

class WaitCheckpointResponse(_message.Message):
    __slots__ = ("checkpoint_dir", "write_seconds", "size_bytes")
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    WRITE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    checkpoint_dir: str
    write_seconds: float
    size_bytes: int
    def __init__(self, checkpoint_dir: _Optional[str] = ..., write_seconds: _Optional[float] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class ExportHFRequest(_message.Message):
    __slots__ = ("path", "adapter")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    path: str
    adapter: str
    def __init__(self, path: _Optional[str] = ..., adapter: _Optional[str] = ...) -> None: ...

class ExportHFResponse(_message.Message):
    __slots__ = ("hf_dir", "global_step")
    HF_DIR_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    hf_dir: str
    global_step: int
    def __init__(self, hf_dir: _Optional[str] = ..., global_step: _Optional[int] = ...) -> None: ...

class LoadCheckpointRequest(_message.Message):
    __slots__ = ("path", "adapter")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    path: str
    adapter: str
    def __init__(self, path: _Optional[str] = ..., adapter: _Optional[str] = ...) -> None: ...

class LoadCheckpointResponse(_message.Message):
    __slots__ = ("checkpoint_dir", "global_step", "extra_state", "skipped_checkpoints")
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    EXTRA_STATE_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoint_dir: str
    global_step: int
    extra_state: _struct_pb2.Struct
    skipped_checkpoints: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, checkpoint_dir: _Optional[str] = ..., global_step: _Optional[int] = ..., extra_state: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., skipped_checkpoints: _Optional[_Iterable[str]] = ...) -> None: ...

class InitWeightGroupRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: _common_pb2.WeightGroupSpec
    def __init__(self, group: _Optional[_Union[_common_pb2.WeightGroupSpec, _Mapping]] = ...) -> None: ...

class InitWeightGroupResponse(_message.Message):
    __slots__ = ("already_initialized",)
    ALREADY_INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    already_initialized: bool
    def __init__(self, already_initialized: _Optional[bool] = ...) -> None: ...

class PushWeightsRequest(_message.Message):
    __slots__ = ("weight_version", "bucket_size_bytes", "transport", "disk_path", "dtype", "acknowledge", "broadcast_chunk_bytes")
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    BUCKET_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    DISK_PATH_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGE_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    weight_version: int
    bucket_size_bytes: int
    transport: str
    disk_path: str
    dtype: str
    acknowledge: bool
    broadcast_chunk_bytes: int
    def __init__(self, weight_version: _Optional[int] = ..., bucket_size_bytes: _Optional[int] = ..., transport: _Optional[str] = ..., disk_path: _Optional[str] = ..., dtype: _Optional[str] = ..., acknowledge: _Optional[bool] = ..., broadcast_chunk_bytes: _Optional[int] = ...) -> None: ...

class PushWeightsResponse(_message.Message):
    __slots__ = ("manifest", "timings")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    manifest: _common_pb2.WeightManifest
    timings: _common_pb2.WeightSyncTimings
    def __init__(self, manifest: _Optional[_Union[_common_pb2.WeightManifest, _Mapping]] = ..., timings: _Optional[_Union[_common_pb2.WeightSyncTimings, _Mapping]] = ...) -> None: ...

class WeightChecksumRequest(_message.Message):
    __slots__ = ("dtype",)
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    def __init__(self, dtype: _Optional[str] = ...) -> None: ...

class WeightChecksumResponse(_message.Message):
    __slots__ = ("checksum",)
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    checksum: _common_pb2.WeightsChecksum
    def __init__(self, checksum: _Optional[_Union[_common_pb2.WeightsChecksum, _Mapping]] = ...) -> None: ...

class Datum(_message.Message):
    __slots__ = ("token_ids", "target_token_ids", "weights", "sampling_log_probs", "advantages")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TARGET_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGES_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    target_token_ids: _containers.RepeatedScalarFieldContainer[int]
    weights: _containers.RepeatedScalarFieldContainer[float]
    sampling_log_probs: _containers.RepeatedScalarFieldContainer[float]
    advantages: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., target_token_ids: _Optional[_Iterable[int]] = ..., weights: _Optional[_Iterable[float]] = ..., sampling_log_probs: _Optional[_Iterable[float]] = ..., advantages: _Optional[_Iterable[float]] = ...) -> None: ...

class ForwardBackwardRequest(_message.Message):
    __slots__ = ("loss_fn", "forward_only", "data", "loss_fn_config", "adapter")
    class LossFnConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    LOSS_FN_FIELD_NUMBER: _ClassVar[int]
    FORWARD_ONLY_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LOSS_FN_CONFIG_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    loss_fn: str
    forward_only: bool
    data: _containers.RepeatedCompositeFieldContainer[Datum]
    loss_fn_config: _containers.ScalarMap[str, float]
    adapter: str
    def __init__(self, loss_fn: _Optional[str] = ..., forward_only: _Optional[bool] = ..., data: _Optional[_Iterable[_Union[Datum, _Mapping]]] = ..., loss_fn_config: _Optional[_Mapping[str, float]] = ..., adapter: _Optional[str] = ...) -> None: ...

class DatumOutput(_message.Message):
    __slots__ = ("log_probs", "elementwise_loss")
    LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    ELEMENTWISE_LOSS_FIELD_NUMBER: _ClassVar[int]
    log_probs: _containers.RepeatedScalarFieldContainer[float]
    elementwise_loss: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, log_probs: _Optional[_Iterable[float]] = ..., elementwise_loss: _Optional[_Iterable[float]] = ...) -> None: ...

class ForwardBackwardResponse(_message.Message):
    __slots__ = ("outputs", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.RepeatedCompositeFieldContainer[DatumOutput]
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, outputs: _Optional[_Iterable[_Union[DatumOutput, _Mapping]]] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class OptimStepRequest(_message.Message):
    __slots__ = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm", "adapter")
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    BETA1_FIELD_NUMBER: _ClassVar[int]
    BETA2_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    GRAD_CLIP_NORM_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    learning_rate: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    grad_clip_norm: float
    adapter: str
    def __init__(self, learning_rate: _Optional[float] = ..., beta1: _Optional[float] = ..., beta2: _Optional[float] = ..., eps: _Optional[float] = ..., weight_decay: _Optional[float] = ..., grad_clip_norm: _Optional[float] = ..., adapter: _Optional[str] = ...) -> None: ...

class OptimStepResponse(_message.Message):
    __slots__ = ("global_step", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    global_step: int
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, global_step: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class DropAdapterRequest(_message.Message):
    __slots__ = ("adapter",)
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    adapter: str
    def __init__(self, adapter: _Optional[str] = ...) -> None: ...

class DropAdapterResponse(_message.Message):
    __slots__ = ("was_held", "num_adapters")
    WAS_HELD_FIELD_NUMBER: _ClassVar[int]
    NUM_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    was_held: bool
    num_adapters: int
    def __init__(self, was_held: _Optional[bool] = ..., num_adapters: _Optional[int] = ...) -> None: ...
