# ruff: noqa
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

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
