from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetProgressRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CallProgress(_message.Message):
    __slots__ = ("method", "running_seconds", "silent_seconds")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    RUNNING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SILENT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    method: str
    running_seconds: float
    silent_seconds: float
    def __init__(self, method: _Optional[str] = ..., running_seconds: _Optional[float] = ..., silent_seconds: _Optional[float] = ...) -> None: ...

class GetProgressResponse(_message.Message):
    __slots__ = ("pid", "calls", "median_seconds")
    class MedianSecondsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PID_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    calls: _containers.RepeatedCompositeFieldContainer[CallProgress]
    median_seconds: _containers.ScalarMap[str, float]
    def __init__(self, pid: _Optional[int] = ..., calls: _Optional[_Iterable[_Union[CallProgress, _Mapping]]] = ..., median_seconds: _Optional[_Mapping[str, float]] = ...) -> None: ...
