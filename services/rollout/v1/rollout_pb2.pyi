from google.protobuf import struct_pb2 as _struct_pb2
from rollway.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PauseMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAUSE_MODE_UNSPECIFIED: _ClassVar[PauseMode]
    PAUSE_MODE_ABORT: _ClassVar[PauseMode]
    PAUSE_MODE_WAIT: _ClassVar[PauseMode]
PAUSE_MODE_UNSPECIFIED: PauseMode
PAUSE_MODE_ABORT: PauseMode
PAUSE_MODE_WAIT: PauseMode

class Prompt(_message.Message):
    __slots__ = ("token_ids", "text", "messages", "label", "metadata", "source", "group_index", "response_prefix")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    GROUP_INDEX_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_PREFIX_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    label: str
    metadata: _struct_pb2.Struct
    source: str
    group_index: int
    response_prefix: ResponsePrefix
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., label: _Optional[str] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., source: _Optional[str] = ..., group_index: _Optional[int] = ..., response_prefix: _Optional[_Union[ResponsePrefix, _Mapping]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ResponsePrefix(_message.Message):
    __slots__ = ("token_ids", "log_probs", "loss_mask", "turns")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    log_probs: _containers.RepeatedScalarFieldContainer[float]
    loss_mask: _containers.RepeatedScalarFieldContainer[int]
    turns: _containers.RepeatedCompositeFieldContainer[_common_pb2.Turn]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., log_probs: _Optional[_Iterable[float]] = ..., loss_mask: _Optional[_Iterable[int]] = ..., turns: _Optional[_Iterable[_Union[_common_pb2.Turn, _Mapping]]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompts", "n_samples_per_prompt", "sampling_params", "reward", "request_id", "environment", "prompt_log_probs")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    N_SAMPLES_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[Prompt]
    n_samples_per_prompt: int
    sampling_params: _common_pb2.SamplingParams
    reward: str
    request_id: str
    environment: str
    prompt_log_probs: bool
    def __init__(self, prompts: _Optional[_Iterable[_Union[Prompt, _Mapping]]] = ..., n_samples_per_prompt: _Optional[int] = ..., sampling_params: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., reward: _Optional[str] = ..., request_id: _Optional[str] = ..., environment: _Optional[str] = ..., prompt_log_probs: _Optional[bool] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("sample", "prompt_log_probs")
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    sample: _common_pb2.Sample
    prompt_log_probs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, sample: _Optional[_Union[_common_pb2.Sample, _Mapping]] = ..., prompt_log_probs: _Optional[_Iterable[float]] = ...) -> None: ...

class InitWeightGroupRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: _common_pb2.WeightGroupSpec
    def __init__(self, group: _Optional[_Union[_common_pb2.WeightGroupSpec, _Mapping]] = ...) -> None: ...

class InitWeightGroupResponse(_message.Message):
    __slots__ = ("ranks", "already_initialized")
    RANKS_FIELD_NUMBER: _ClassVar[int]
    ALREADY_INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    ranks: _containers.RepeatedScalarFieldContainer[int]
    already_initialized: bool
    def __init__(self, ranks: _Optional[_Iterable[int]] = ..., already_initialized: _Optional[bool] = ...) -> None: ...

class UpdateWeightsRequest(_message.Message):
    __slots__ = ("manifest", "acknowledge")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGE_FIELD_NUMBER: _ClassVar[int]
    manifest: _common_pb2.WeightManifest
    acknowledge: bool
    def __init__(self, manifest: _Optional[_Union[_common_pb2.WeightManifest, _Mapping]] = ..., acknowledge: _Optional[bool] = ...) -> None: ...

class UpdateWeightsResponse(_message.Message):
    __slots__ = ("weight_version", "already_applied", "timings")
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ALREADY_APPLIED_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    weight_version: int
    already_applied: bool
    timings: _common_pb2.WeightSyncTimings
    def __init__(self, weight_version: _Optional[int] = ..., already_applied: _Optional[bool] = ..., timings: _Optional[_Union[_common_pb2.WeightSyncTimings, _Mapping]] = ...) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ("mode",)
    MODE_FIELD_NUMBER: _ClassVar[int]
    mode: PauseMode
    def __init__(self, mode: _Optional[_Union[PauseMode, str]] = ...) -> None: ...

class PauseResponse(_message.Message):
    __slots__ = ("num_aborted",)
    NUM_ABORTED_FIELD_NUMBER: _ClassVar[int]
    num_aborted: int
    def __init__(self, num_aborted: _Optional[int] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResumeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReleaseMemoryRequest(_message.Message):
    __slots__ = ("tags",)
    TAGS_FIELD_NUMBER: _ClassVar[int]
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tags: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseMemoryResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResumeMemoryRequest(_message.Message):
    __slots__ = ("tags",)
    TAGS_FIELD_NUMBER: _ClassVar[int]
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tags: _Optional[_Iterable[str]] = ...) -> None: ...

class ResumeMemoryResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

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

class ScrambleWeightsRequest(_message.Message):
    __slots__ = ("seed",)
    SEED_FIELD_NUMBER: _ClassVar[int]
    seed: int
    def __init__(self, seed: _Optional[int] = ...) -> None: ...

class ScrambleWeightsResponse(_message.Message):
    __slots__ = ("num_tensors",)
    NUM_TENSORS_FIELD_NUMBER: _ClassVar[int]
    num_tensors: int
    def __init__(self, num_tensors: _Optional[int] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetInfoResponse(_message.Message):
    __slots__ = ("model", "engine", "weight_version", "paused", "num_workers", "dtype", "rewards", "memory_released", "max_context_len", "vocab_size", "eos_token_ids", "default_reward", "num_samples_generated", "num_samples_aborted", "num_reward_errors", "num_reward_timeouts", "num_samples_in_flight", "acknowledges_weight_updates", "num_generate_calls_running", "num_generate_calls_queued", "num_workers_awaiting_weights", "weight_sync_backend")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_RELEASED_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_LEN_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_REWARD_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_GENERATED_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_ABORTED_FIELD_NUMBER: _ClassVar[int]
    NUM_REWARD_ERRORS_FIELD_NUMBER: _ClassVar[int]
    NUM_REWARD_TIMEOUTS_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGES_WEIGHT_UPDATES_FIELD_NUMBER: _ClassVar[int]
    NUM_GENERATE_CALLS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_GENERATE_CALLS_QUEUED_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_AWAITING_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_SYNC_BACKEND_FIELD_NUMBER: _ClassVar[int]
    model: str
    engine: str
    weight_version: int
    paused: bool
    num_workers: int
    dtype: str
    rewards: _containers.RepeatedScalarFieldContainer[str]
    memory_released: bool
    max_context_len: int
    vocab_size: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    default_reward: str
    num_samples_generated: int
    num_samples_aborted: int
    num_reward_errors: int
    num_reward_timeouts: int
    num_samples_in_flight: int
    acknowledges_weight_updates: bool
    num_generate_calls_running: int
    num_generate_calls_queued: int
    num_workers_awaiting_weights: int
    weight_sync_backend: str
    def __init__(self, model: _Optional[str] = ..., engine: _Optional[str] = ..., weight_version: _Optional[int] = ..., paused: _Optional[bool] = ..., num_workers: _Optional[int] = ..., dtype: _Optional[str] = ..., rewards: _Optional[_Iterable[str]] = ..., memory_released: _Optional[bool] = ..., max_context_len: _Optional[int] = ..., vocab_size: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., default_reward: _Optional[str] = ..., num_samples_generated: _Optional[int] = ..., num_samples_aborted: _Optional[int] = ..., num_reward_errors: _Optional[int] = ..., num_reward_timeouts: _Optional[int] = ..., num_samples_in_flight: _Optional[int] = ..., acknowledges_weight_updates: _Optional[bool] = ..., num_generate_calls_running: _Optional[int] = ..., num_generate_calls_queued: _Optional[int] = ..., num_workers_awaiting_weights: _Optional[int] = ..., weight_sync_backend: _Optional[str] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("num_aborted",)
    NUM_ABORTED_FIELD_NUMBER: _ClassVar[int]
    num_aborted: int
    def __init__(self, num_aborted: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("run_id", "already_initialized", "settings", "model", "vocab_size", "weight_version")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ALREADY_INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    already_initialized: bool
    settings: _struct_pb2.Struct
    model: str
    vocab_size: int
    weight_version: int
    def __init__(self, run_id: _Optional[str] = ..., already_initialized: _Optional[bool] = ..., settings: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., model: _Optional[str] = ..., vocab_size: _Optional[int] = ..., weight_version: _Optional[int] = ...) -> None: ...

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
