from lac.common.v1 import reports_pb2 as _reports_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class IngestBatchRequest(_message.Message):
    __slots__ = ("batch_id", "reports", "privacy")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    PRIVACY_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    reports: _containers.RepeatedCompositeFieldContainer[_reports_pb2.SealedPayload]
    privacy: _reports_pb2.BatchPrivacy
    def __init__(self, batch_id: _Optional[str] = ..., reports: _Optional[_Iterable[_Union[_reports_pb2.SealedPayload, _Mapping]]] = ..., privacy: _Optional[_Union[_reports_pb2.BatchPrivacy, _Mapping]] = ...) -> None: ...

class IngestBatchResponse(_message.Message):
    __slots__ = ("batch_id", "duplicate", "accepted", "rejected")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    duplicate: bool
    accepted: int
    rejected: int
    def __init__(self, batch_id: _Optional[str] = ..., duplicate: _Optional[bool] = ..., accepted: _Optional[int] = ..., rejected: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("mechanism", "epsilon", "delta", "s", "rho", "sensitivity", "calibration", "public_sensitivity", "first_window", "last_window", "discovery", "force", "expected_reports", "request_id")
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    S_FIELD_NUMBER: _ClassVar[int]
    RHO_FIELD_NUMBER: _ClassVar[int]
    SENSITIVITY_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_SENSITIVITY_FIELD_NUMBER: _ClassVar[int]
    FIRST_WINDOW_FIELD_NUMBER: _ClassVar[int]
    LAST_WINDOW_FIELD_NUMBER: _ClassVar[int]
    DISCOVERY_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REPORTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    mechanism: str
    epsilon: float
    delta: float
    s: float
    rho: float
    sensitivity: str
    calibration: str
    public_sensitivity: str
    first_window: int
    last_window: int
    discovery: bool
    force: bool
    expected_reports: int
    request_id: str
    def __init__(self, mechanism: _Optional[str] = ..., epsilon: _Optional[float] = ..., delta: _Optional[float] = ..., s: _Optional[float] = ..., rho: _Optional[float] = ..., sensitivity: _Optional[str] = ..., calibration: _Optional[str] = ..., public_sensitivity: _Optional[str] = ..., first_window: _Optional[int] = ..., last_window: _Optional[int] = ..., discovery: _Optional[bool] = ..., force: _Optional[bool] = ..., expected_reports: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReleaseRecord(_message.Message):
    __slots__ = ("release_id", "created_at", "mechanism", "params", "sensitivity_method", "data_dependent", "gamma", "sigma", "calibration", "epsilon", "delta", "n_reports", "vocab_size", "max_n", "statement", "differentially_private", "laplace_scale", "ledger_epsilon", "ledger_delta", "first_window", "last_window", "privacy_unit", "reports_per_user", "discovery_threshold", "discovered", "request_id")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    SENSITIVITY_METHOD_FIELD_NUMBER: _ClassVar[int]
    DATA_DEPENDENT_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    SIGMA_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    N_REPORTS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_N_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    DIFFERENTIALLY_PRIVATE_FIELD_NUMBER: _ClassVar[int]
    LAPLACE_SCALE_FIELD_NUMBER: _ClassVar[int]
    LEDGER_EPSILON_FIELD_NUMBER: _ClassVar[int]
    LEDGER_DELTA_FIELD_NUMBER: _ClassVar[int]
    FIRST_WINDOW_FIELD_NUMBER: _ClassVar[int]
    LAST_WINDOW_FIELD_NUMBER: _ClassVar[int]
    PRIVACY_UNIT_FIELD_NUMBER: _ClassVar[int]
    REPORTS_PER_USER_FIELD_NUMBER: _ClassVar[int]
    DISCOVERY_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    DISCOVERED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    created_at: str
    mechanism: str
    params: _containers.ScalarMap[str, float]
    sensitivity_method: str
    data_dependent: bool
    gamma: float
    sigma: float
    calibration: str
    epsilon: float
    delta: float
    n_reports: int
    vocab_size: int
    max_n: int
    statement: str
    differentially_private: bool
    laplace_scale: float
    ledger_epsilon: float
    ledger_delta: float
    first_window: int
    last_window: int
    privacy_unit: str
    reports_per_user: int
    discovery_threshold: float
    discovered: int
    request_id: str
    def __init__(self, release_id: _Optional[str] = ..., created_at: _Optional[str] = ..., mechanism: _Optional[str] = ..., params: _Optional[_Mapping[str, float]] = ..., sensitivity_method: _Optional[str] = ..., data_dependent: _Optional[bool] = ..., gamma: _Optional[float] = ..., sigma: _Optional[float] = ..., calibration: _Optional[str] = ..., epsilon: _Optional[float] = ..., delta: _Optional[float] = ..., n_reports: _Optional[int] = ..., vocab_size: _Optional[int] = ..., max_n: _Optional[int] = ..., statement: _Optional[str] = ..., differentially_private: _Optional[bool] = ..., laplace_scale: _Optional[float] = ..., ledger_epsilon: _Optional[float] = ..., ledger_delta: _Optional[float] = ..., first_window: _Optional[int] = ..., last_window: _Optional[int] = ..., privacy_unit: _Optional[str] = ..., reports_per_user: _Optional[int] = ..., discovery_threshold: _Optional[float] = ..., discovered: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReleasePreview(_message.Message):
    __slots__ = ("mechanism", "epsilon", "delta", "noise", "noise_unit", "reports", "reports_source", "resolvable", "signal_share", "swamped", "target_share", "reports_needed", "epsilon_needed", "advice", "statement", "budget_after", "channel_progress", "channel_status")
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    NOISE_FIELD_NUMBER: _ClassVar[int]
    NOISE_UNIT_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    REPORTS_SOURCE_FIELD_NUMBER: _ClassVar[int]
    RESOLVABLE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_SHARE_FIELD_NUMBER: _ClassVar[int]
    SWAMPED_FIELD_NUMBER: _ClassVar[int]
    TARGET_SHARE_FIELD_NUMBER: _ClassVar[int]
    REPORTS_NEEDED_FIELD_NUMBER: _ClassVar[int]
    EPSILON_NEEDED_FIELD_NUMBER: _ClassVar[int]
    ADVICE_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    BUDGET_AFTER_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_STATUS_FIELD_NUMBER: _ClassVar[int]
    mechanism: str
    epsilon: float
    delta: float
    noise: float
    noise_unit: str
    reports: int
    reports_source: str
    resolvable: _containers.RepeatedScalarFieldContainer[int]
    signal_share: float
    swamped: bool
    target_share: float
    reports_needed: int
    epsilon_needed: float
    advice: str
    statement: str
    budget_after: _containers.RepeatedCompositeFieldContainer[WindowBudget]
    channel_progress: float
    channel_status: str
    def __init__(self, mechanism: _Optional[str] = ..., epsilon: _Optional[float] = ..., delta: _Optional[float] = ..., noise: _Optional[float] = ..., noise_unit: _Optional[str] = ..., reports: _Optional[int] = ..., reports_source: _Optional[str] = ..., resolvable: _Optional[_Iterable[int]] = ..., signal_share: _Optional[float] = ..., swamped: _Optional[bool] = ..., target_share: _Optional[float] = ..., reports_needed: _Optional[int] = ..., epsilon_needed: _Optional[float] = ..., advice: _Optional[str] = ..., statement: _Optional[str] = ..., budget_after: _Optional[_Iterable[_Union[WindowBudget, _Mapping]]] = ..., channel_progress: _Optional[float] = ..., channel_status: _Optional[str] = ...) -> None: ...

class ListReleasesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListReleasesResponse(_message.Message):
    __slots__ = ("releases",)
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    releases: _containers.RepeatedCompositeFieldContainer[ReleaseRecord]
    def __init__(self, releases: _Optional[_Iterable[_Union[ReleaseRecord, _Mapping]]] = ...) -> None: ...

class GetReleaseRequest(_message.Message):
    __slots__ = ("release_id",)
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    def __init__(self, release_id: _Optional[str] = ...) -> None: ...

class GetReleaseResponse(_message.Message):
    __slots__ = ("record", "items", "log_probs", "pseudo_counts")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    PSEUDO_COUNTS_FIELD_NUMBER: _ClassVar[int]
    record: ReleaseRecord
    items: _containers.RepeatedScalarFieldContainer[str]
    log_probs: _containers.RepeatedScalarFieldContainer[float]
    pseudo_counts: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, record: _Optional[_Union[ReleaseRecord, _Mapping]] = ..., items: _Optional[_Iterable[str]] = ..., log_probs: _Optional[_Iterable[float]] = ..., pseudo_counts: _Optional[_Iterable[float]] = ...) -> None: ...

class TopNgramsRequest(_message.Message):
    __slots__ = ("release_id", "k", "order", "exclude_special")
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_SPECIAL_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    k: int
    order: int
    exclude_special: bool
    def __init__(self, release_id: _Optional[str] = ..., k: _Optional[int] = ..., order: _Optional[int] = ..., exclude_special: _Optional[bool] = ...) -> None: ...

class NgramProbability(_message.Message):
    __slots__ = ("ngram", "probability", "noise_sd")
    NGRAM_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    NOISE_SD_FIELD_NUMBER: _ClassVar[int]
    ngram: str
    probability: float
    noise_sd: float
    def __init__(self, ngram: _Optional[str] = ..., probability: _Optional[float] = ..., noise_sd: _Optional[float] = ...) -> None: ...

class TopNgramsResponse(_message.Message):
    __slots__ = ("ngrams",)
    NGRAMS_FIELD_NUMBER: _ClassVar[int]
    ngrams: _containers.RepeatedCompositeFieldContainer[NgramProbability]
    def __init__(self, ngrams: _Optional[_Iterable[_Union[NgramProbability, _Mapping]]] = ...) -> None: ...

class BudgetRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WindowBudget(_message.Message):
    __slots__ = ("window", "spent_epsilon", "spent_delta", "remaining_epsilon", "remaining_delta", "exports")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    SPENT_EPSILON_FIELD_NUMBER: _ClassVar[int]
    SPENT_DELTA_FIELD_NUMBER: _ClassVar[int]
    REMAINING_EPSILON_FIELD_NUMBER: _ClassVar[int]
    REMAINING_DELTA_FIELD_NUMBER: _ClassVar[int]
    EXPORTS_FIELD_NUMBER: _ClassVar[int]
    window: int
    spent_epsilon: float
    spent_delta: float
    remaining_epsilon: float
    remaining_delta: float
    exports: int
    def __init__(self, window: _Optional[int] = ..., spent_epsilon: _Optional[float] = ..., spent_delta: _Optional[float] = ..., remaining_epsilon: _Optional[float] = ..., remaining_delta: _Optional[float] = ..., exports: _Optional[int] = ...) -> None: ...

class BudgetStatus(_message.Message):
    __slots__ = ("budget_epsilon", "budget_delta", "windows", "window_seconds", "reports_per_window", "exports")
    BUDGET_EPSILON_FIELD_NUMBER: _ClassVar[int]
    BUDGET_DELTA_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REPORTS_PER_WINDOW_FIELD_NUMBER: _ClassVar[int]
    EXPORTS_FIELD_NUMBER: _ClassVar[int]
    budget_epsilon: float
    budget_delta: float
    windows: _containers.RepeatedCompositeFieldContainer[WindowBudget]
    window_seconds: float
    reports_per_window: int
    exports: _containers.RepeatedCompositeFieldContainer[ExportRecord]
    def __init__(self, budget_epsilon: _Optional[float] = ..., budget_delta: _Optional[float] = ..., windows: _Optional[_Iterable[_Union[WindowBudget, _Mapping]]] = ..., window_seconds: _Optional[float] = ..., reports_per_window: _Optional[int] = ..., exports: _Optional[_Iterable[_Union[ExportRecord, _Mapping]]] = ...) -> None: ...

class CuratorStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CuratorStatus(_message.Message):
    __slots__ = ("batches", "reports", "rejects", "releases", "budget_epsilon", "budget_delta", "quarantined", "replay_window_days", "windows", "reports_by_window")
    class RejectsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ReportsByWindowEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    REJECTS_FIELD_NUMBER: _ClassVar[int]
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_EPSILON_FIELD_NUMBER: _ClassVar[int]
    BUDGET_DELTA_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    REPLAY_WINDOW_DAYS_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    REPORTS_BY_WINDOW_FIELD_NUMBER: _ClassVar[int]
    batches: int
    reports: int
    rejects: _containers.ScalarMap[str, int]
    releases: int
    budget_epsilon: float
    budget_delta: float
    quarantined: int
    replay_window_days: float
    windows: _containers.RepeatedCompositeFieldContainer[WindowBudget]
    reports_by_window: _containers.ScalarMap[int, int]
    def __init__(self, batches: _Optional[int] = ..., reports: _Optional[int] = ..., rejects: _Optional[_Mapping[str, int]] = ..., releases: _Optional[int] = ..., budget_epsilon: _Optional[float] = ..., budget_delta: _Optional[float] = ..., quarantined: _Optional[int] = ..., replay_window_days: _Optional[float] = ..., windows: _Optional[_Iterable[_Union[WindowBudget, _Mapping]]] = ..., reports_by_window: _Optional[_Mapping[int, int]] = ...) -> None: ...

class NgramProbabilitiesRequest(_message.Message):
    __slots__ = ("release_id", "ngrams")
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    NGRAMS_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    ngrams: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, release_id: _Optional[str] = ..., ngrams: _Optional[_Iterable[str]] = ...) -> None: ...

class NgramProbabilitiesResponse(_message.Message):
    __slots__ = ("ngrams",)
    NGRAMS_FIELD_NUMBER: _ClassVar[int]
    ngrams: _containers.RepeatedCompositeFieldContainer[NgramProbability]
    def __init__(self, ngrams: _Optional[_Iterable[_Union[NgramProbability, _Mapping]]] = ...) -> None: ...

class NextWordRequest(_message.Message):
    __slots__ = ("release_id", "context", "k")
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    context: str
    k: int
    def __init__(self, release_id: _Optional[str] = ..., context: _Optional[str] = ..., k: _Optional[int] = ...) -> None: ...

class NextWordResponse(_message.Message):
    __slots__ = ("context_used", "words")
    CONTEXT_USED_FIELD_NUMBER: _ClassVar[int]
    WORDS_FIELD_NUMBER: _ClassVar[int]
    context_used: str
    words: _containers.RepeatedCompositeFieldContainer[NgramProbability]
    def __init__(self, context_used: _Optional[str] = ..., words: _Optional[_Iterable[_Union[NgramProbability, _Mapping]]] = ...) -> None: ...

class PerplexityRequest(_message.Message):
    __slots__ = ("release_id", "text")
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    text: str
    def __init__(self, release_id: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class PerplexityResponse(_message.Message):
    __slots__ = ("perplexity", "n_sentences", "n_tokens", "n_out_of_vocabulary")
    PERPLEXITY_FIELD_NUMBER: _ClassVar[int]
    N_SENTENCES_FIELD_NUMBER: _ClassVar[int]
    N_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_OUT_OF_VOCABULARY_FIELD_NUMBER: _ClassVar[int]
    perplexity: float
    n_sentences: int
    n_tokens: int
    n_out_of_vocabulary: int
    def __init__(self, perplexity: _Optional[float] = ..., n_sentences: _Optional[int] = ..., n_tokens: _Optional[int] = ..., n_out_of_vocabulary: _Optional[int] = ...) -> None: ...

class ExportArpaRequest(_message.Message):
    __slots__ = ("release_id",)
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    def __init__(self, release_id: _Optional[str] = ...) -> None: ...

class ArpaChunk(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class ExportReportsRequest(_message.Message):
    __slots__ = ("first_window", "last_window")
    FIRST_WINDOW_FIELD_NUMBER: _ClassVar[int]
    LAST_WINDOW_FIELD_NUMBER: _ClassVar[int]
    first_window: int
    last_window: int
    def __init__(self, first_window: _Optional[int] = ..., last_window: _Optional[int] = ...) -> None: ...

class WindowShuffle(_message.Message):
    __slots__ = ("window", "batches", "reports", "smallest_batch", "epsilon", "delta", "amplified", "method", "unverified")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    SMALLEST_BATCH_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    AMPLIFIED_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    UNVERIFIED_FIELD_NUMBER: _ClassVar[int]
    window: int
    batches: int
    reports: int
    smallest_batch: int
    epsilon: float
    delta: float
    amplified: bool
    method: str
    unverified: int
    def __init__(self, window: _Optional[int] = ..., batches: _Optional[int] = ..., reports: _Optional[int] = ..., smallest_batch: _Optional[int] = ..., epsilon: _Optional[float] = ..., delta: _Optional[float] = ..., amplified: _Optional[bool] = ..., method: _Optional[str] = ..., unverified: _Optional[int] = ...) -> None: ...

class LocalGuarantee(_message.Message):
    __slots__ = ("mechanism", "epsilon_per_word", "embedding", "word_distance_bound", "max_report_words", "reports_per_window", "window_seconds", "first_window", "last_window", "rows", "shuffles", "statement")
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    EPSILON_PER_WORD_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    WORD_DISTANCE_BOUND_FIELD_NUMBER: _ClassVar[int]
    MAX_REPORT_WORDS_FIELD_NUMBER: _ClassVar[int]
    REPORTS_PER_WINDOW_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_WINDOW_FIELD_NUMBER: _ClassVar[int]
    LAST_WINDOW_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    SHUFFLES_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    mechanism: str
    epsilon_per_word: float
    embedding: str
    word_distance_bound: float
    max_report_words: int
    reports_per_window: int
    window_seconds: float
    first_window: int
    last_window: int
    rows: int
    shuffles: _containers.RepeatedCompositeFieldContainer[WindowShuffle]
    statement: str
    def __init__(self, mechanism: _Optional[str] = ..., epsilon_per_word: _Optional[float] = ..., embedding: _Optional[str] = ..., word_distance_bound: _Optional[float] = ..., max_report_words: _Optional[int] = ..., reports_per_window: _Optional[int] = ..., window_seconds: _Optional[float] = ..., first_window: _Optional[int] = ..., last_window: _Optional[int] = ..., rows: _Optional[int] = ..., shuffles: _Optional[_Iterable[_Union[WindowShuffle, _Mapping]]] = ..., statement: _Optional[str] = ...) -> None: ...

class ExportChunk(_message.Message):
    __slots__ = ("export_id", "guarantee", "arrow_ipc")
    EXPORT_ID_FIELD_NUMBER: _ClassVar[int]
    GUARANTEE_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    export_id: str
    guarantee: LocalGuarantee
    arrow_ipc: bytes
    def __init__(self, export_id: _Optional[str] = ..., guarantee: _Optional[_Union[LocalGuarantee, _Mapping]] = ..., arrow_ipc: _Optional[bytes] = ...) -> None: ...

class ExportRecord(_message.Message):
    __slots__ = ("export_id", "identity", "exported_at", "first_window", "last_window", "rows")
    EXPORT_ID_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    EXPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    FIRST_WINDOW_FIELD_NUMBER: _ClassVar[int]
    LAST_WINDOW_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    export_id: str
    identity: str
    exported_at: str
    first_window: int
    last_window: int
    rows: int
    def __init__(self, export_id: _Optional[str] = ..., identity: _Optional[str] = ..., exported_at: _Optional[str] = ..., first_window: _Optional[int] = ..., last_window: _Optional[int] = ..., rows: _Optional[int] = ...) -> None: ...
