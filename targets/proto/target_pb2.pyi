# ruff: noqa
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EchoRequest(_message.Message):
    __slots__ = ("message", "delay_ms", "payload_bytes")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    message: str
    delay_ms: int
    payload_bytes: int
    def __init__(self, message: _Optional[str] = ..., delay_ms: _Optional[int] = ..., payload_bytes: _Optional[int] = ...) -> None: ...

class EchoReply(_message.Message):
    __slots__ = ("message", "pod", "proxy_version", "app_attempts", "payload")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    PROXY_VERSION_FIELD_NUMBER: _ClassVar[int]
    APP_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    message: str
    pod: str
    proxy_version: str
    app_attempts: int
    payload: bytes
    def __init__(self, message: _Optional[str] = ..., pod: _Optional[str] = ..., proxy_version: _Optional[str] = ..., app_attempts: _Optional[int] = ..., payload: _Optional[bytes] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("interval_ms", "max_events", "payload_bytes")
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_EVENTS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    interval_ms: int
    max_events: int
    payload_bytes: int
    def __init__(self, interval_ms: _Optional[int] = ..., max_events: _Optional[int] = ..., payload_bytes: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("seq", "sent_unix_nanos", "pod", "proxy_version", "payload")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    PROXY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    seq: int
    sent_unix_nanos: int
    pod: str
    proxy_version: str
    payload: bytes
    def __init__(self, seq: _Optional[int] = ..., sent_unix_nanos: _Optional[int] = ..., pod: _Optional[str] = ..., proxy_version: _Optional[str] = ..., payload: _Optional[bytes] = ...) -> None: ...

class RelayRequest(_message.Message):
    __slots__ = ("destination",)
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    destination: str
    def __init__(self, destination: _Optional[str] = ...) -> None: ...

class PodIdentity(_message.Message):
    __slots__ = ("pod", "namespace", "proxy_version")
    POD_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PROXY_VERSION_FIELD_NUMBER: _ClassVar[int]
    pod: str
    namespace: str
    proxy_version: str
    def __init__(self, pod: _Optional[str] = ..., namespace: _Optional[str] = ..., proxy_version: _Optional[str] = ...) -> None: ...

class RelayReply(_message.Message):
    __slots__ = ("destination", "outcome", "status", "grpc_code", "latency_us", "attempts", "attempts_from", "answered_by", "caller", "address", "detail")
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    GRPC_CODE_FIELD_NUMBER: _ClassVar[int]
    LATENCY_US_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FROM_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    destination: str
    outcome: str
    status: int
    grpc_code: str
    latency_us: int
    attempts: int
    attempts_from: str
    answered_by: PodIdentity
    caller: PodIdentity
    address: str
    detail: str
    def __init__(self, destination: _Optional[str] = ..., outcome: _Optional[str] = ..., status: _Optional[int] = ..., grpc_code: _Optional[str] = ..., latency_us: _Optional[int] = ..., attempts: _Optional[int] = ..., attempts_from: _Optional[str] = ..., answered_by: _Optional[_Union[PodIdentity, _Mapping]] = ..., caller: _Optional[_Union[PodIdentity, _Mapping]] = ..., address: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...
