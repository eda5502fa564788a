from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]
    FINISH_REASON_MAX_TURNS: _ClassVar[FinishReason]
    FINISH_REASON_MAX_TOKENS: _ClassVar[FinishReason]
    FINISH_REASON_TURN_TIMEOUT: _ClassVar[FinishReason]
    FINISH_REASON_EPISODE_TIMEOUT: _ClassVar[FinishReason]
    FINISH_REASON_FAILED: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
FINISH_REASON_MAX_TURNS: FinishReason
FINISH_REASON_MAX_TOKENS: FinishReason
FINISH_REASON_TURN_TIMEOUT: FinishReason
FINISH_REASON_EPISODE_TIMEOUT: FinishReason
FINISH_REASON_FAILED: FinishReason

class Turn(_message.Message):
    __slots__ = ("role", "num_tokens", "weight_version", "reward")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    role: str
    num_tokens: int
    weight_version: int
    reward: float
    def __init__(self, role: _Optional[str] = ..., num_tokens: _Optional[int] = ..., weight_version: _Optional[int] = ..., reward: _Optional[float] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("group_index", "index", "prompt_token_ids", "response_token_ids", "loss_mask", "reward", "raw_reward", "rollout_log_probs", "advantages", "finish_reason", "weight_version", "source", "label", "metadata", "response_text", "reward_error", "ref_log_probs", "old_log_probs", "turns", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    GROUP_INDEX_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    RAW_REWARD_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGES_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TEXT_FIELD_NUMBER: _ClassVar[int]
    REWARD_ERROR_FIELD_NUMBER: _ClassVar[int]
    REF_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    OLD_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    group_index: int
    index: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_token_ids: _containers.RepeatedScalarFieldContainer[int]
    loss_mask: _containers.RepeatedScalarFieldContainer[int]
    reward: float
    raw_reward: float
    rollout_log_probs: _containers.RepeatedScalarFieldContainer[float]
    advantages: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: FinishReason
    weight_version: int
    source: str
    label: str
    metadata: _struct_pb2.Struct
    response_text: str
    reward_error: str
    ref_log_probs: _containers.RepeatedScalarFieldContainer[float]
    old_log_probs: _containers.RepeatedScalarFieldContainer[float]
    turns: _containers.RepeatedCompositeFieldContainer[Turn]
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, group_index: _Optional[int] = ..., index: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., response_token_ids: _Optional[_Iterable[int]] = ..., loss_mask: _Optional[_Iterable[int]] = ..., reward: _Optional[float] = ..., raw_reward: _Optional[float] = ..., rollout_log_probs: _Optional[_Iterable[float]] = ..., advantages: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., weight_version: _Optional[int] = ..., source: _Optional[str] = ..., label: _Optional[str] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., response_text: _Optional[str] = ..., reward_error: _Optional[str] = ..., ref_log_probs: _Optional[_Iterable[float]] = ..., old_log_probs: _Optional[_Iterable[float]] = ..., turns: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_new_tokens", "stop_token_ids", "stop", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    stop: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset", "num_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    num_bytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., num_bytes: _Optional[int] = ...) -> None: ...

class WeightBucket(_message.Message):
    __slots__ = ("index", "num_bytes", "checksum", "tensors")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    index: int
    num_bytes: int
    checksum: str
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    def __init__(self, index: _Optional[int] = ..., num_bytes: _Optional[int] = ..., checksum: _Optional[str] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ...) -> None: ...

class WeightManifest(_message.Message):
    __slots__ = ("weight_version", "buckets", "checksum_algorithm", "weights_checksum", "transport", "disk_path", "broadcast_chunk_bytes")
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    DISK_PATH_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    weight_version: int
    buckets: _containers.RepeatedCompositeFieldContainer[WeightBucket]
    checksum_algorithm: str
    weights_checksum: str
    transport: str
    disk_path: str
    broadcast_chunk_bytes: int
    def __init__(self, weight_version: _Optional[int] = ..., buckets: _Optional[_Iterable[_Union[WeightBucket, _Mapping]]] = ..., checksum_algorithm: _Optional[str] = ..., weights_checksum: _Optional[str] = ..., transport: _Optional[str] = ..., disk_path: _Optional[str] = ..., broadcast_chunk_bytes: _Optional[int] = ...) -> None: ...

class WeightGroupSpec(_message.Message):
    __slots__ = ("group_name", "master_address", "master_port", "world_size", "rank_offset", "backend", "timeout_seconds", "authenticate_members")
    GROUP_NAME_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANK_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    AUTHENTICATE_MEMBERS_FIELD_NUMBER: _ClassVar[int]
    group_name: str
    master_address: str
    master_port: int
    world_size: int
    rank_offset: int
    backend: str
    timeout_seconds: float
    authenticate_members: bool
    def __init__(self, group_name: _Optional[str] = ..., master_address: _Optional[str] = ..., master_port: _Optional[int] = ..., world_size: _Optional[int] = ..., rank_offset: _Optional[int] = ..., backend: _Optional[str] = ..., timeout_seconds: _Optional[float] = ..., authenticate_members: _Optional[bool] = ...) -> None: ...

class WeightSyncTimings(_message.Message):
    __slots__ = ("gather_seconds", "pause_seconds", "wire_seconds", "load_seconds", "verify_seconds", "total_seconds", "num_bytes")
    GATHER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PAUSE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WIRE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOAD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    gather_seconds: float
    pause_seconds: float
    wire_seconds: float
    load_seconds: float
    verify_seconds: float
    total_seconds: float
    num_bytes: int
    def __init__(self, gather_seconds: _Optional[float] = ..., pause_seconds: _Optional[float] = ..., wire_seconds: _Optional[float] = ..., load_seconds: _Optional[float] = ..., verify_seconds: _Optional[float] = ..., total_seconds: _Optional[float] = ..., num_bytes: _Optional[int] = ...) -> None: ...

class WeightsChecksum(_message.Message):
    __slots__ = ("weight_version", "algorithm", "digest", "num_tensors")
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    NUM_TENSORS_FIELD_NUMBER: _ClassVar[int]
    weight_version: int
    algorithm: str
    digest: str
    num_tensors: int
    def __init__(self, weight_version: _Optional[int] = ..., algorithm: _Optional[str] = ..., digest: _Optional[str] = ..., num_tensors: _Optional[int] = ...) -> None: ...
