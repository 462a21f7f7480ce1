from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PayloadEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAYLOAD_ENCODING_UNSPECIFIED: _ClassVar[PayloadEncoding]
    PAYLOAD_ENCODING_PLAINTEXT_INSECURE: _ClassVar[PayloadEncoding]
    PAYLOAD_ENCODING_HPKE_X25519_SHA256_CHACHAPOLY: _ClassVar[PayloadEncoding]

class LocalMechanism(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOCAL_MECHANISM_UNSPECIFIED: _ClassVar[LocalMechanism]
    LOCAL_MECHANISM_MULTIVARIATE_LAPLACE: _ClassVar[LocalMechanism]
    LOCAL_MECHANISM_DISTANCE_TRUNCATED: _ClassVar[LocalMechanism]
    LOCAL_MECHANISM_KNN_TRUNCATED: _ClassVar[LocalMechanism]
    LOCAL_MECHANISM_DENSITY_MODULATED: _ClassVar[LocalMechanism]
PAYLOAD_ENCODING_UNSPECIFIED: PayloadEncoding
PAYLOAD_ENCODING_PLAINTEXT_INSECURE: PayloadEncoding
PAYLOAD_ENCODING_HPKE_X25519_SHA256_CHACHAPOLY: PayloadEncoding
LOCAL_MECHANISM_UNSPECIFIED: LocalMechanism
LOCAL_MECHANISM_MULTIVARIATE_LAPLACE: LocalMechanism
LOCAL_MECHANISM_DISTANCE_TRUNCATED: LocalMechanism
LOCAL_MECHANISM_KNN_TRUNCATED: LocalMechanism
LOCAL_MECHANISM_DENSITY_MODULATED: LocalMechanism

class SealedPayload(_message.Message):
    __slots__ = ("encoding", "key_id", "data")
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    encoding: PayloadEncoding
    key_id: str
    data: bytes
    def __init__(self, encoding: _Optional[_Union[PayloadEncoding, str]] = ..., key_id: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class Sentence(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tokens: _Optional[_Iterable[str]] = ...) -> None: ...

class LocalPrivacy(_message.Message):
    __slots__ = ("mechanism", "epsilon_per_word", "embedding")
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    EPSILON_PER_WORD_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    mechanism: LocalMechanism
    epsilon_per_word: float
    embedding: str
    def __init__(self, mechanism: _Optional[_Union[LocalMechanism, str]] = ..., epsilon_per_word: _Optional[float] = ..., embedding: _Optional[str] = ...) -> None: ...

class ReportContent(_message.Message):
    __slots__ = ("report_id", "sentences", "local_privacy")
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    SENTENCES_FIELD_NUMBER: _ClassVar[int]
    LOCAL_PRIVACY_FIELD_NUMBER: _ClassVar[int]
    report_id: bytes
    sentences: _containers.RepeatedCompositeFieldContainer[Sentence]
    local_privacy: LocalPrivacy
    def __init__(self, report_id: _Optional[bytes] = ..., sentences: _Optional[_Iterable[_Union[Sentence, _Mapping]]] = ..., local_privacy: _Optional[_Union[LocalPrivacy, _Mapping]] = ...) -> None: ...

class Deployment(_message.Message):
    __slots__ = ("mechanism", "epsilon_per_word", "embedding", "word_distance_bound", "max_report_words", "reports_per_window", "window_seconds", "report_epsilon0", "server_version", "key_ids", "period_seconds", "windows_per_period", "exact_epsilon")
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    EPSILON_PER_WORD_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    WORD_DISTANCE_BOUND_FIELD_NUMBER: _ClassVar[int]
    MAX_REPORT_WORDS_FIELD_NUMBER: _ClassVar[int]
    REPORTS_PER_WINDOW_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REPORT_EPSILON0_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    KEY_IDS_FIELD_NUMBER: _ClassVar[int]
    PERIOD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_PER_PERIOD_FIELD_NUMBER: _ClassVar[int]
    EXACT_EPSILON_FIELD_NUMBER: _ClassVar[int]
    mechanism: LocalMechanism
    epsilon_per_word: float
    embedding: str
    word_distance_bound: float
    max_report_words: int
    reports_per_window: int
    window_seconds: float
    report_epsilon0: float
    server_version: str
    key_ids: _containers.RepeatedScalarFieldContainer[str]
    period_seconds: float
    windows_per_period: int
    exact_epsilon: bool
    def __init__(self, mechanism: _Optional[_Union[LocalMechanism, str]] = ..., epsilon_per_word: _Optional[float] = ..., embedding: _Optional[str] = ..., word_distance_bound: _Optional[float] = ..., max_report_words: _Optional[int] = ..., reports_per_window: _Optional[int] = ..., window_seconds: _Optional[float] = ..., report_epsilon0: _Optional[float] = ..., server_version: _Optional[str] = ..., key_ids: _Optional[_Iterable[str]] = ..., period_seconds: _Optional[float] = ..., windows_per_period: _Optional[int] = ..., exact_epsilon: _Optional[bool] = ...) -> None: ...

class DeploymentRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BatchPrivacy(_message.Message):
    __slots__ = ("n_reports", "report_epsilon0", "delta", "central_epsilon", "amplified", "method", "subsample_q", "crowd_threshold", "statement", "distinct_clients", "reports_per_window", "window_seconds", "first_window", "last_window", "windows_per_period", "period_seconds")
    N_REPORTS_FIELD_NUMBER: _ClassVar[int]
    REPORT_EPSILON0_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    CENTRAL_EPSILON_FIELD_NUMBER: _ClassVar[int]
    AMPLIFIED_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    SUBSAMPLE_Q_FIELD_NUMBER: _ClassVar[int]
    CROWD_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    DISTINCT_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    REPORTS_PER_WINDOW_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_WINDOW_FIELD_NUMBER: _ClassVar[int]
    LAST_WINDOW_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_PER_PERIOD_FIELD_NUMBER: _ClassVar[int]
    PERIOD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    n_reports: int
    report_epsilon0: float
    delta: float
    central_epsilon: float
    amplified: bool
    method: str
    subsample_q: float
    crowd_threshold: int
    statement: str
    distinct_clients: bool
    reports_per_window: int
    window_seconds: float
    first_window: int
    last_window: int
    windows_per_period: int
    period_seconds: float
    def __init__(self, n_reports: _Optional[int] = ..., report_epsilon0: _Optional[float] = ..., delta: _Optional[float] = ..., central_epsilon: _Optional[float] = ..., amplified: _Optional[bool] = ..., method: _Optional[str] = ..., subsample_q: _Optional[float] = ..., crowd_threshold: _Optional[int] = ..., statement: _Optional[str] = ..., distinct_clients: _Optional[bool] = ..., reports_per_window: _Optional[int] = ..., window_seconds: _Optional[float] = ..., first_window: _Optional[int] = ..., last_window: _Optional[int] = ..., windows_per_period: _Optional[int] = ..., period_seconds: _Optional[float] = ...) -> None: ...
