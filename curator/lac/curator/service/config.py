"""Curator configuration (defaults < TOML < env LAC_CURATOR_* < flags).

Everything a release's guarantee depends on besides the request's (ε, δ) is here, never in a
request: the public caps (W, C, the clip on item totals), the privacy unit (reports per client
per accounting window), the published local-privacy deployment, the per-window budget, and
whether data-dependent (NOT differentially private) releases may run at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from lac.common.config import CORES, ServiceSettings, setting
from lac.common.database import is_postgres_url
from lac.common.deployment import DEFAULT_EMBEDDING, DEFAULT_EMBEDDING_DIAMETER, Deployment
from lac.common.envelope import CuratorKeyRing
from lac.common.rpc import Role, parse_names
from lac.curator.ingest.chunks import STALL_SECONDS, IngestContext
from lac.curator.release.errorbars import DRAWS
from lac.curator.runner.preview import MIN_SIGNAL_SHARE

ENV_PREFIX = "LAC_CURATOR_"
"""The cores this process may run on."""


@dataclass(frozen=True)
class CuratorConfig(ServiceSettings):
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(50052, "port to listen on (0 = any free port)")
    port_file: Path | None = setting(None, "write the bound port to this file once serving")
    state_dir: Path = setting(
        Path("lac-state/curator"),
        "this replica's own directory: its lock, the ledger journal, local caches, the segments and releases unless "
        "shared_dir is set, and, without store, its "
        "SQLite database",
    )
    store: str = setting(
        "",
        "the curator's database: empty for SQLite (curator.sqlite in state_dir), or a postgresql://USER@HOST:PORT/DB "
        "URL (needs lac-curator[postgresql]; the password from PGPASSWORD or ~/.pgpass, not the URL); "
        "`lac curator migrate --to URL` copies a SQLite state there",
    )
    shared_dir: Path | None = setting(
        None,
        "directory of the files every replica reads: segments, words and release files (default: state_dir). With "
        "a PostgreSQL store only (with SQLite the files stay in state_dir); with more than one replica, every "
        "replica names the same directory here (NFSv4 or a cluster filesystem across machines: the operator "
        'guide\'s "Curator replicas"); the database records it at its first start and a replica started on another '
        "directory is refused",
    )
    public_corpus: Path | None = setting(
        None, "public text for the prior and release vocabulary (default: the corpus prepared by `lac data`)"
    )
    max_n: int = setting(3, "longest n-gram released")
    vocab_min_count: int = setting(2, "public n-grams seen fewer times are left out of the release vocabulary")
    vocab_max_items: int = setting(50_000, "most n-grams in the release vocabulary (most frequent public ones)")
    # -- public caps of every release (sensitivities are computed from these, never from the data)
    max_items_per_report: int = setting(100, "W: most distinct n-grams counted per report (a report's first W)")
    item_clamp: int = setting(3, "C: a report contributes at most C to any one n-gram")
    item_count_clip: int = setting(
        1_000_000,
        "M: n-gram totals are clipped at M before BayesianDP's log (so its "
        "sound sensitivity needs no cap on the number of reports)",
    )
    max_sentences_per_report: int = setting(1_000, "reports with more sentences are quarantined")
    max_token_chars: int = setting(64, "reports with a longer token are quarantined")
    endtoend_validation_cap: int = setting(
        100_000,
        "EndToEndDP (sound): most reports in the validation split "
        "(a larger split is cut to a random subset of this size)",
    )
    # -- the deployment published to clients: each accepted report satisfies it
    local_mechanism: str = setting(
        "multivariate-laplace", "the clients' word-level mechanism (reports declaring another are quarantined)"
    )
    epsilon_per_word: float = setting(
        8.0,
        "metric-DP ε per word of the clients' reports; 8 is the SDK's 'balanced' preset. With clean_estimate (the "
        "default) reports are made at exactly this ε (the deployment publishes exact_epsilon; the SDK refuses a "
        "smaller preset and the curator quarantines another ε as epsilon_not_exact), since the clean text is "
        "estimated with this ε's local channel; without it, it is the largest accepted. Reports declaring more are "
        "quarantined",
    )
    embedding: str = setting(DEFAULT_EMBEDDING, "the clients' embedding id (reports naming another are quarantined)")
    word_distance_bound: float = setting(
        DEFAULT_EMBEDDING_DIAMETER,
        "largest per-word distance term: the "
        "embedding's diameter for multivariate-laplace "
        "(`lac client embedding-info` prints it)",
    )
    max_report_words: int = setting(
        40,
        "L: most words per report (clients split or truncate longer texts; "
        "longer reports are quarantined). Report-level ε0 = L·ε·bound",
    )
    reports_per_window: int = setting(
        1,
        "k: reports per client per accounting window, enforced by the shuffler's "
        "quota; batches from a shuffler with another quota are refused",
    )
    window_seconds: float = setting(
        86400.0,
        "the accounting window: the privacy unit is one client over a window. Recorded in the state directory at "
        "its first start, with reports_per_window, period_days and max_windows_per_client_per_period: a curator "
        "configured with other values does not start on that state",
    )
    period_days: float = setting(
        365.0,
        "the period over which every release states one client's total privacy loss (periods counted from the "
        "Unix epoch, a whole number of windows); batches from a shuffler with another period are refused",
    )
    max_windows_per_client_per_period: int = setting(
        0,
        "cap: one client contributes to at most this many accounting windows per period (0: no cap), enforced "
        "by the shuffler; bounds a client's loss over a period to cap × the per-window budget. Batches from a "
        "shuffler with another cap are refused",
    )
    clean_estimate: bool = setting(
        True,
        "the default release estimates the users' clean text from their perturbed reports with the deployment's "
        "public local channel (post-processing; needs lac-curator[channel]; sampled once per deployment and cached)",
    )
    channel_cache_dir: Path | None = setting(
        None,
        "where the sampled local channel and its n-gram products are cached (default: the shared_dir's prior/, which "
        "is state_dir/prior without one; public "
        "data only; the products, ~90 MB for the default vocabulary, make a restart's channel ready in ~2 s, not ~20). "
        "`lac curator channel build` fills it ahead of time; every replica pointed at it reuses it and never samples",
    )
    error_bar_draws: int = setting(
        DRAWS,
        "bootstrap redraws of the DP noise behind each release's error bars (its cost grows with them: about the "
        "release's post-processing, and for the channel-aware default its deconvolution, once per draw; the "
        "standard deviation is known to about 1/√(2·draws))",
    )
    # -- identities and roles (mTLS common names)
    key_dir: Path | None = setting(
        None,
        "directory of the curator's HPKE key ring (`lac keys curator`); sealed reports cannot be opened without it",
    )
    tls_cert: str = setting("", "TLS certificate of this server (PEM; `lac keys tls --name curator`)")
    tls_key: str = setting("", "TLS private key of this server")
    tls_client_ca: str = setting("", "CA whose client certificates identify callers (mutual TLS)")
    ingest_identities: str = setting(
        "shuffler", "comma-separated mTLS common names with the ingest role (IngestBatch, GetDeployment)"
    )
    analyst_identities: str = setting(
        "analyst", "comma-separated mTLS common names with the analyst role (releases and queries on them, budget)"
    )
    operator_identities: str = setting(
        "operator",
        "comma-separated mTLS common names with the operator role "
        "(everything an analyst may, plus status: exact counts, "
        "quarantine, ledger)",
    )
    export_identities: str = setting(
        "",
        "comma-separated mTLS common names allowed to export the privatized reports of closed windows "
        "(ExportReports: local DP only, no central DP; recorded in the ledger, not charged). Empty (the "
        "default): export is off for everyone, analysts and operators included",
    )
    shuffler_release_interval_seconds: float = setting(
        3600.0,
        "the shufflers' release_interval_seconds: a shuffler may release a window's reports up to this long after "
        "the window closed. A window is exported only once settled: closed for longer than this plus "
        "forward_horizon_seconds",
    )
    forward_horizon_seconds: float = setting(
        86400.0,
        "how long a released batch may take to reach this curator (a shuffler retrying through an outage). A window "
        "is exported only once settled (see shuffler_release_interval_seconds); a batch that belongs to a window "
        "already exported is refused with FAILED_PRECONDITION (reason window_exported), never stored",
    )
    export_retention_days: float = setting(
        30.0,
        "with export on: each batch's reports' words are kept (in the shared directory's words/, for export only) "
        "this many days after its window closes, then deleted; its window can no longer be exported then. With "
        "export off no words are kept, and those kept earlier are deleted at start",
    )
    insecure: bool = setting(
        False,
        "INSECURE local demos and tests: serve plaintext gRPC without TLS; no caller "
        "can be identified, so every caller has every role",
    )
    allow_plaintext_payloads: bool = setting(
        False, "accept PAYLOAD_ENCODING_PLAINTEXT_INSECURE reports (the shuffler could read them): local demos only"
    )
    # -- the privacy budget
    budget_epsilon: float = setting(
        10.0,
        "ε budget of each accounting window; every release covering a window "
        "spends from it (basic composition) and is refused if any window would "
        "overspend",
    )
    budget_delta: float = setting(1e-5, "δ budget of each accounting window (basic composition)")
    allow_data_dependent_releases: bool = setting(
        False,
        "allow the papers' data-dependent sensitivities "
        "(bruteforce, claim1, laplace-public observed): such "
        "releases are NOT differentially private, labelled so, "
        "never charged as DP, and their γ and σ are operator-only",
    )
    data_dependent_releases_per_window: int = setting(
        1,
        "with allow_data_dependent_releases: at most this many data-dependent releases may cover any one "
        "accounting window (each draws fresh noise, so repeating one and averaging would undo its noise); "
        "they are listed in the ledger with the window, never charged as DP, and the statements of DP "
        "releases over such windows say so",
    )
    min_signal_share: float = setting(
        MIN_SIGNAL_SHARE,
        "a release whose predicted signal share (the share of the text's words "
        "expected to stand out of its noise; see lac.curator.runner.preview) is below "
        "this is refused unless forced; 0 disables the check",
    )
    count_epsilon: float = setting(
        0.01,
        "ε of the DP report count an analyst's release uses for that check when "
        "the request gives no expected_reports (Laplace, charged to the windows "
        "covered; kept and reused while those windows are closed)",
    )
    # -- where releases are computed (the noise and the ledger stay in this process either way)
    engine: str = setting(
        "local",
        "where a release's aggregations run: 'local' (this machine, release_workers "
        "processes) or 'spark' (a Spark cluster at spark_master; needs "
        "`pip install 'lac-curator[spark]'`, see docs/operator/spark.md)",
    )
    spark_master: str = setting(
        "",
        "the Spark master of engine or ingest_engine 'spark': local[N], "
        "spark://host:port, yarn, ... or sc://host:port (Spark Connect); executors "
        "must read the shared directory's segments (shared_dir, by default state_dir) at the same path",
    )
    release_workers: int = setting(
        1,
        "engine 'local': processes that read and map segments in parallel (1 = one "
        "segment at a time in the server process: bounded memory)",
    )
    ingest_engine: str = setting(
        "local",
        "where ingested reports are opened, validated and counted: 'local' "
        "(ingest_workers processes) or 'spark' (at spark_master; the executors "
        "then get the curator's PRIVATE keys: see docs/operator/spark.md)",
    )
    replay_window_days: float = setting(
        30.0, "a report id seen within this many days is rejected as a replay; older ids are forgotten"
    )
    quarantine_max_rows: int = setting(
        10_000, "quarantined reports kept for diagnosis (the newest; 0 = none); reject counters keep the totals"
    )
    # -- limits and storage
    max_message_bytes: int = setting(
        64 * 1024**2,
        "largest gRPC message received or sent; a larger request is "
        "refused by gRPC itself with RESOURCE_EXHAUSTED before it is "
        "parsed (keep it above the shuffler's max_batch_bytes)",
    )
    max_concurrent_streams: int = setting(
        100,
        "most calls served at once on one client connection (HTTP/2 "
        "streams); further calls on that connection wait in the client or "
        "are refused with UNAVAILABLE (HTTP/2 REFUSED_STREAM; retry)",
    )
    max_connections: int = setting(
        200,
        "most client connections open at once (shufflers, analysts, operators); gRPC closes a further one "
        "as soon as it is accepted (its client gets UNAVAILABLE at once and retries), so new handshakes "
        "never wait on exhausted file descriptors (the open-file limit is raised to fit, up to the hard "
        "limit; a warning at start says when it cannot)",
    )
    max_reports_per_batch: int = setting(
        1_000_000,
        "most reports in one IngestBatch, counted before the message is "
        "parsed (INVALID_ARGUMENT beyond it); keep it above the "
        "shuffler's largest batch",
    )
    min_free_disk_bytes: int = setting(
        128 * 1024**2,
        "free space the filesystem of the segments and releases (shared_dir, by default state_dir) must keep: "
        "below it (or after any write error) IngestBatch and Release "
        "answer UNAVAILABLE with retry-after-seconds and health is "
        "NOT_SERVING until a test write succeeds with enough space",
    )
    stall_timeout_seconds: float = setting(
        300.0,
        "a storage operation (a batch's segment and commit, a release's "
        "commit, a read) without an answer after this long marks the "
        "storage STALLED (a hanging disk): health NOT_SERVING, IngestBatch "
        "and Release answer UNAVAILABLE at once, until a test write "
        "succeeds; the operation itself goes on. Keep it well above the "
        "time of the largest batch's commit (~22 µs per report)",
    )
    ingest_workers: int = setting(
        CORES,
        "processes that open, validate and count ingested reports (default: "
        "every core this process may use; 1 = in the server process). Batches "
        "under 200 reports are opened in the server process",
    )
    ingest_stall_seconds: float = setting(
        STALL_SECONDS,
        "when batches wait on the ingest workers and no worker has finished a "
        "chunk (up to 2,000 reports, well under a second of work) for this "
        "long, the workers are taken to hang: those batches answer UNAVAILABLE "
        "(the shuffler sends them again) and the workers are killed and started "
        "again, health NOT_SERVING meanwhile. A worker that dies fails the "
        "batches being counted at once",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.max_n <= 5:
            raise ValueError("max_n must be between 1 and 5")
        for name in (
            "vocab_min_count",
            "vocab_max_items",
            "max_items_per_report",
            "item_clamp",
            "item_count_clip",
            "endtoend_validation_cap",
            "data_dependent_releases_per_window",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not (self.budget_epsilon >= 0 and 0 <= self.budget_delta < 1):
            raise ValueError("budget_epsilon must be >= 0 and budget_delta in [0, 1)")
        if not 0 <= self.min_signal_share < 1:
            raise ValueError("min_signal_share must be in [0, 1)")
        if not (math.isfinite(self.count_epsilon) and self.count_epsilon > 0):
            raise ValueError("count_epsilon must be finite and > 0")
        if not self.replay_window_days > 0:
            raise ValueError("replay_window_days must be positive")
        if not (math.isfinite(self.export_retention_days) and self.export_retention_days > 0):
            raise ValueError("export_retention_days must be finite and positive")
        for name in ("shuffler_release_interval_seconds", "forward_horizon_seconds"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be finite and >= 0")
        if self.quarantine_max_rows < 0:
            raise ValueError("quarantine_max_rows must be >= 0")
        if (
            self.max_message_bytes < 1024
            or min(self.max_concurrent_streams, self.max_reports_per_batch, self.max_connections) < 1
        ):
            raise ValueError(
                "max_message_bytes must be at least 1024, max_concurrent_streams, max_reports_per_batch and "
                "max_connections positive"
            )
        if self.min_free_disk_bytes < 0:
            raise ValueError("min_free_disk_bytes must be >= 0")
        if not self.stall_timeout_seconds > 0:
            raise ValueError("stall_timeout_seconds must be positive")
        if self.ingest_workers < 1:
            raise ValueError("ingest_workers must be at least 1")
        if not self.ingest_stall_seconds > 0:
            raise ValueError("ingest_stall_seconds must be positive")
        for name in ("engine", "ingest_engine"):
            if getattr(self, name) not in ("local", "spark"):
                raise ValueError(f"{name} must be 'local' or 'spark'")
            if getattr(self, name) == "spark" and not self.spark_master:
                raise ValueError(
                    f"{name} 'spark' needs spark_master (local[N], spark://host:port, sc://host:port, ...)"
                )
        if self.release_workers < 1:
            raise ValueError("release_workers must be at least 1")
        if self.error_bar_draws < 2:
            raise ValueError("error_bar_draws must be at least 2")
        if self.store and not is_postgres_url(self.store):
            raise ValueError("store must be empty (SQLite in state_dir) or a postgresql:// URL")
        if not self.store and self.shared_dir is not None and Path(self.shared_dir) != Path(self.state_dir):
            # one curator on SQLite: its files stay in state_dir, where `lac curator backup` copies them from
            raise ValueError(
                "shared_dir is for replicas over a PostgreSQL store (store postgresql://...); with SQLite the files "
                "stay in state_dir"
            )
        _ = self.deployment  # validates the published configuration

    @property
    def deployment(self) -> Deployment:
        """The local-privacy configuration published to clients."""
        return Deployment(
            mechanism=self.local_mechanism,
            epsilon_per_word=self.epsilon_per_word,
            embedding=self.embedding,
            word_distance_bound=self.word_distance_bound,
            max_report_words=self.max_report_words,
            reports_per_window=self.reports_per_window,
            window_seconds=self.window_seconds,
            period_seconds=self.period_days * 86400.0,
            windows_per_period=self.max_windows_per_client_per_period,
            exact_epsilon=self.clean_estimate,
        )

    @property
    def settle_seconds(self) -> float:
        """How long after it closes a window is settled (exportable): batches of its reports may come until then."""
        return self.shuffler_release_interval_seconds + self.forward_horizon_seconds

    @property
    def roles(self) -> dict[Role, frozenset[str]]:
        """mTLS common names per role."""
        return {
            Role.INGEST: parse_names(self.ingest_identities),
            Role.ANALYST: parse_names(self.analyst_identities),
            Role.OPERATOR: parse_names(self.operator_identities),
            Role.EXPORT: parse_names(self.export_identities),
        }

    @property
    def files_dir(self) -> Path:
        """Where the files every replica reads are: ``shared_dir``, by default ``state_dir``."""
        return self.shared_dir or self.state_dir

    @property
    def channel_dir(self) -> Path:
        """Where the local channel is cached: ``channel_cache_dir``, by default files_dir/prior."""
        return self.channel_cache_dir or self.files_dir / "prior"

    def ingest_context(self, keyring: CuratorKeyRing | None, max_n: int) -> IngestContext:
        """What opening and validating a report needs on this curator, with ``keyring``, counting n-grams up to
        ``max_n``."""
        d = self.deployment
        return IngestContext(
            keys=keyring.private_material() if keyring is not None else (),
            allow_plaintext=self.allow_plaintext_payloads,
            mechanism=d.mechanism,
            epsilon_per_word=d.epsilon_per_word,
            embedding=d.embedding,
            max_report_words=d.max_report_words,
            max_sentences_per_report=self.max_sentences_per_report,
            max_token_chars=self.max_token_chars,
            max_n=max_n,
            exact_epsilon=d.exact_epsilon,
        )
