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
PAYLOAD_ENCODING_UNSPECIFIED: PayloadEncoding
PAYLOAD_ENCODING_PLAINTEXT_INSECURE: PayloadEncoding
PAYLOAD_ENCODING_HPKE_X25519_SHA256_CHACHAPOLY: PayloadEncoding

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
    __slots__ = ("mechanism", "epsilon_per_word", "n_words", "embedding", "statement")
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    EPSILON_PER_WORD_FIELD_NUMBER: _ClassVar[int]
    N_WORDS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    mechanism: str
    epsilon_per_word: float
    n_words: int
    embedding: str
    statement: str
    def __init__(self, mechanism: _Optional[str] = ..., epsilon_per_word: _Optional[float] = ..., n_words: _Optional[int] = ..., embedding: _Optional[str] = ..., statement: _Optional[str] = ...) -> None: ...

class ReportContent(_message.Message):
    __slots__ = ("report_id", "sentences", "privacy", "n_out_of_vocabulary")
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    SENTENCES_FIELD_NUMBER: _ClassVar[int]
    PRIVACY_FIELD_NUMBER: _ClassVar[int]
    N_OUT_OF_VOCABULARY_FIELD_NUMBER: _ClassVar[int]
    report_id: bytes
    sentences: _containers.RepeatedCompositeFieldContainer[Sentence]
    privacy: LocalPrivacy
    n_out_of_vocabulary: int
    def __init__(self, report_id: _Optional[bytes] = ..., sentences: _Optional[_Iterable[_Union[Sentence, _Mapping]]] = ..., privacy: _Optional[_Union[LocalPrivacy, _Mapping]] = ..., n_out_of_vocabulary: _Optional[int] = ...) -> None: ...

class BatchPrivacy(_message.Message):
    __slots__ = ("n_reports", "local_epsilon", "delta", "central_epsilon", "amplified", "method", "subsample_q", "crowd_threshold", "statement")
    N_REPORTS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    CENTRAL_EPSILON_FIELD_NUMBER: _ClassVar[int]
    AMPLIFIED_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    SUBSAMPLE_Q_FIELD_NUMBER: _ClassVar[int]
    CROWD_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    n_reports: int
    local_epsilon: float
    delta: float
    central_epsilon: float
    amplified: bool
    method: str
    subsample_q: float
    crowd_threshold: int
    statement: str
    def __init__(self, n_reports: _Optional[int] = ..., local_epsilon: _Optional[float] = ..., delta: _Optional[float] = ..., central_epsilon: _Optional[float] = ..., amplified: _Optional[bool] = ..., method: _Optional[str] = ..., subsample_q: _Optional[float] = ..., crowd_threshold: _Optional[int] = ..., statement: _Optional[str] = ...) -> None: ...
