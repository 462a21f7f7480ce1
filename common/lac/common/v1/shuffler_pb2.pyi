from lac.common.v1 import reports_pb2 as _reports_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AckStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_STATUS_UNSPECIFIED: _ClassVar[AckStatus]
    ACK_STATUS_STORED: _ClassVar[AckStatus]
    ACK_STATUS_DUPLICATE: _ClassVar[AckStatus]
ACK_STATUS_UNSPECIFIED: AckStatus
ACK_STATUS_STORED: AckStatus
ACK_STATUS_DUPLICATE: AckStatus

class ClientReport(_message.Message):
    __slots__ = ("idempotency_id", "payload", "crowd_id")
    IDEMPOTENCY_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CROWD_ID_FIELD_NUMBER: _ClassVar[int]
    idempotency_id: bytes
    payload: _reports_pb2.SealedPayload
    crowd_id: str
    def __init__(self, idempotency_id: _Optional[bytes] = ..., payload: _Optional[_Union[_reports_pb2.SealedPayload, _Mapping]] = ..., crowd_id: _Optional[str] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("reports",)
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[ClientReport]
    def __init__(self, reports: _Optional[_Iterable[_Union[ClientReport, _Mapping]]] = ...) -> None: ...

class ReportAck(_message.Message):
    __slots__ = ("idempotency_id", "status")
    IDEMPOTENCY_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    idempotency_id: bytes
    status: AckStatus
    def __init__(self, idempotency_id: _Optional[bytes] = ..., status: _Optional[_Union[AckStatus, str]] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("acks",)
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[ReportAck]
    def __init__(self, acks: _Optional[_Iterable[_Union[ReportAck, _Mapping]]] = ...) -> None: ...

class ShufflerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShufflerStatus(_message.Message):
    __slots__ = ("buffered_reports", "min_batch", "buffered_clients", "batches_forwarded", "reports_forwarded", "batches_pending", "rejects", "note", "window", "seconds_to_next_window", "log_bytes", "max_log_bytes", "counters", "recent_batches", "auth", "batches_dead_letter", "deployment_mismatch", "release_lease")
    class RejectsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    BUFFERED_REPORTS_FIELD_NUMBER: _ClassVar[int]
    MIN_BATCH_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FORWARDED_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FORWARDED_FIELD_NUMBER: _ClassVar[int]
    BATCHES_PENDING_FIELD_NUMBER: _ClassVar[int]
    REJECTS_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    SECONDS_TO_NEXT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    LOG_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_LOG_BYTES_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    RECENT_BATCHES_FIELD_NUMBER: _ClassVar[int]
    AUTH_FIELD_NUMBER: _ClassVar[int]
    BATCHES_DEAD_LETTER_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_MISMATCH_FIELD_NUMBER: _ClassVar[int]
    RELEASE_LEASE_FIELD_NUMBER: _ClassVar[int]
    buffered_reports: int
    min_batch: int
    buffered_clients: int
    batches_forwarded: int
    reports_forwarded: int
    batches_pending: int
    rejects: _containers.ScalarMap[str, int]
    note: str
    window: int
    seconds_to_next_window: float
    log_bytes: int
    max_log_bytes: int
    counters: _containers.ScalarMap[str, int]
    recent_batches: _containers.RepeatedCompositeFieldContainer[BatchInfo]
    auth: str
    batches_dead_letter: int
    deployment_mismatch: str
    release_lease: bool
    def __init__(self, buffered_reports: _Optional[int] = ..., min_batch: _Optional[int] = ..., buffered_clients: _Optional[int] = ..., batches_forwarded: _Optional[int] = ..., reports_forwarded: _Optional[int] = ..., batches_pending: _Optional[int] = ..., rejects: _Optional[_Mapping[str, int]] = ..., note: _Optional[str] = ..., window: _Optional[int] = ..., seconds_to_next_window: _Optional[float] = ..., log_bytes: _Optional[int] = ..., max_log_bytes: _Optional[int] = ..., counters: _Optional[_Mapping[str, int]] = ..., recent_batches: _Optional[_Iterable[_Union[BatchInfo, _Mapping]]] = ..., auth: _Optional[str] = ..., batches_dead_letter: _Optional[int] = ..., deployment_mismatch: _Optional[str] = ..., release_lease: _Optional[bool] = ...) -> None: ...

class BatchInfo(_message.Message):
    __slots__ = ("batch_id", "size", "delivered", "privacy", "refusal")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    PRIVACY_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    size: int
    delivered: bool
    privacy: _reports_pb2.BatchPrivacy
    refusal: str
    def __init__(self, batch_id: _Optional[str] = ..., size: _Optional[int] = ..., delivered: _Optional[bool] = ..., privacy: _Optional[_Union[_reports_pb2.BatchPrivacy, _Mapping]] = ..., refusal: _Optional[str] = ...) -> None: ...

class FlushRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FlushResponse(_message.Message):
    __slots__ = ("released", "batch_id", "batch_size", "note")
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    released: bool
    batch_id: str
    batch_size: int
    note: str
    def __init__(self, released: _Optional[bool] = ..., batch_id: _Optional[str] = ..., batch_size: _Optional[int] = ..., note: _Optional[str] = ...) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("batch_id", "size", "refusal", "dead_since_unix", "privacy")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    DEAD_SINCE_UNIX_FIELD_NUMBER: _ClassVar[int]
    PRIVACY_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    size: int
    refusal: str
    dead_since_unix: float
    privacy: _reports_pb2.BatchPrivacy
    def __init__(self, batch_id: _Optional[str] = ..., size: _Optional[int] = ..., refusal: _Optional[str] = ..., dead_since_unix: _Optional[float] = ..., privacy: _Optional[_Union[_reports_pb2.BatchPrivacy, _Mapping]] = ...) -> None: ...

class DeadLetters(_message.Message):
    __slots__ = ("batches",)
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[DeadLetter]
    def __init__(self, batches: _Optional[_Iterable[_Union[DeadLetter, _Mapping]]] = ...) -> None: ...

class DeadLetterSelection(_message.Message):
    __slots__ = ("batch_ids", "all")
    BATCH_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    batch_ids: _containers.RepeatedScalarFieldContainer[str]
    all: bool
    def __init__(self, batch_ids: _Optional[_Iterable[str]] = ..., all: _Optional[bool] = ...) -> None: ...

class DeadLetterResult(_message.Message):
    __slots__ = ("batch_ids", "reports")
    BATCH_IDS_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    batch_ids: _containers.RepeatedScalarFieldContainer[str]
    reports: int
    def __init__(self, batch_ids: _Optional[_Iterable[str]] = ..., reports: _Optional[int] = ...) -> None: ...

class GetShardsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShardAssignment(_message.Message):
    __slots__ = ("shards", "shard_name", "assigned_shard", "effective_window", "shards_digest", "store_id")
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    SHARD_NAME_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_SHARD_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_WINDOW_FIELD_NUMBER: _ClassVar[int]
    SHARDS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    STORE_ID_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedScalarFieldContainer[str]
    shard_name: str
    assigned_shard: str
    effective_window: int
    shards_digest: str
    store_id: str
    def __init__(self, shards: _Optional[_Iterable[str]] = ..., shard_name: _Optional[str] = ..., assigned_shard: _Optional[str] = ..., effective_window: _Optional[int] = ..., shards_digest: _Optional[str] = ..., store_id: _Optional[str] = ...) -> None: ...
