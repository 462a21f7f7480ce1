"""Shuffler configuration (defaults < TOML < env LAC_SHUFFLER_* < flags)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from lac.common.config import ServiceSettings, setting
from lac.common.database import is_postgres_url
from lac.shuffler.shards import parse_shards

ENV_PREFIX = "LAC_SHUFFLER_"


@dataclass(frozen=True)
class ShufflerConfig(ServiceSettings):
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(50051, "port to listen on (0 = any free port)")
    port_file: Path | None = setting(None, "write the bound port to this file once serving")
    state_dir: Path = setting(
        Path("lac-state/shuffler"),
        "directory of the durable report log (without store), the tokens file and client.key",
    )
    store: str = setting(
        "",
        "the report log's database: empty for SQLite (shuffler.sqlite in state_dir), or a "
        "postgresql://USER@HOST:PORT/DB URL (needs lac-shuffler[postgresql]; the password from PGPASSWORD or "
        "~/.pgpass, not the URL; every replica's state_dir holds the same client.key, the key of the client "
        "hashes, which the database never holds); `lac shuffler migrate --to URL` copies a SQLite log there",
    )
    curator: str = setting("127.0.0.1:50052", "curator ingest address host:port")
    min_batch: int = setting(
        100,
        "release a batch only when reports of at least this many distinct clients are "
        "buffered (a batch holds at most one report per client)",
    )
    release_interval_seconds: float = setting(
        3600.0,
        "at the end of each interval a batch is released if the "
        "threshold is reached (it is also checked after every commit)",
    )
    keep_reserve: bool = setting(
        False,
        "releases after a commit keep a uniformly random min_batch (the next threshold) of the buffered "
        "clients' reports back, so they wait for twice the threshold; the end of the release interval and "
        "`lac shuffler flush` release everything. Every batch still reaches the threshold, and a stream of "
        "batches during the interval does not strand its last reports below it (off: a batch takes every "
        "buffered report once the threshold is reached, and fewer than min_batch left at the interval's end "
        "wait for the next one)",
    )
    max_report_bytes: int = setting(
        66_000, "largest accepted sealed payload in bytes (HPKE payloads are at most 65,584)"
    )
    max_reports_per_request: int = setting(
        10_000,
        "most reports accepted in one Submit call, and in all "
        "messages of one SubmitStream call together; more: "
        "INVALID_ARGUMENT (from the shuffler)",
    )
    max_message_bytes: int = setting(
        8 * 1024**2,
        "largest gRPC message received or sent (the SDK's largest Submit, 100 reports of "
        "the largest padded size, is 6.6 MB); a larger request is refused by gRPC itself "
        "with RESOURCE_EXHAUSTED (no retry-after-seconds) before it is parsed",
    )
    max_concurrent_streams: int = setting(
        1000,
        "most calls served at once on one client connection (HTTP/2 "
        "streams); further calls on that connection wait in the client "
        "or are refused with UNAVAILABLE (HTTP/2 REFUSED_STREAM; retry)",
    )
    max_connections: int = setting(
        1000,
        "most client connections open at once; gRPC closes a further one as soon as it is "
        "accepted (its client gets UNAVAILABLE at once and retries), so new handshakes never "
        "wait on exhausted file descriptors (the open-file limit is raised to fit, up to the "
        "hard limit; a warning at start says when it cannot)",
    )
    receive_timeout_seconds: float = setting(
        30.0,
        "a request message not received in full within this long after its caller was "
        "authenticated is answered UNAVAILABLE with retry-after-seconds, so a slow sender "
        "holds the shuffler's memory for a bounded time",
    )
    max_pending_bytes: int = setting(
        256 * 1024**2,
        "most payload bytes received but not yet durably "
        "committed (the group-commit queue); a Submit that would "
        "exceed it: UNAVAILABLE with retry-after-seconds",
    )
    commit_timeout_seconds: float = setting(
        10.0,
        "a Submit whose durable commit has not finished after this "
        "long answers UNAVAILABLE (retry with the same idempotency "
        "ids: a stored report is then acknowledged as a duplicate) and "
        "the storage counts as stalled (health NOT_SERVING) until a "
        "write succeeds; so does any other operation on the report "
        "log (a release, a delivery) without an answer for this long",
    )
    min_free_disk_bytes: int = setting(
        128 * 1024**2,
        "free space the state directory's filesystem must keep: "
        "below it (or after any write error) Submit answers "
        "UNAVAILABLE with retry-after-seconds and health is "
        "NOT_SERVING until a test write succeeds again with enough "
        "space (a release writes only its batches' keys, 8 bytes per "
        "report; the buffered payloads are forwarded from where they "
        "are and freed once every batch of the release is acknowledged)",
    )
    forward_retry_max_seconds: float = setting(30.0, "longest back-off between delivery attempts to the curator")
    forward_in_flight: int = setting(
        2,
        "batches sent to the curator at once, each until acknowledged (1: one at a time); "
        "with 2 the curator opens and counts one batch while it stores the previous one. "
        "Each batch in flight holds up to max_batch_bytes of memory",
    )
    max_batch_bytes: int = setting(
        60 * 1024**2,
        "largest forwarded batch message; a larger release is cut "
        "into several batches (keep below the curator's gRPC "
        "receive limit, 64 MiB by default), none below the release "
        "threshold: a last batch that would be takes reports from the "
        "one before or is merged into it, and a batch exceeds this "
        "limit only when the threshold's reports do not fit in it "
        "(logged as a warning)",
    )
    tls_cert: str = setting("", "TLS certificate of this server (PEM; `lac keys tls --name shuffler`)")
    tls_key: str = setting("", "TLS private key of this server")
    tls_client_ca: str = setting(
        "",
        "CA of client certificates: when set, every caller must present one (mutual "
        "TLS) and certificates in operator_identities / client_identities carry those "
        "roles; when unset, callers are identified by bearer tokens only",
    )
    operator_identities: str = setting(
        "operator",
        "comma-separated mTLS common names with the operator role "
        "(GetStatus, Flush); operators can also use tokens made with "
        "`lac shuffler add-client NAME --role operator`",
    )
    client_identities: str = setting(
        "", "comma-separated mTLS common names that may submit as clients (besides bearer tokens)"
    )
    curator_ca: str = setting("", "CA that signed the curator's certificate")
    curator_cert: str = setting(
        "",
        "this shuffler's client certificate towards the curator (mutual TLS; its "
        "common name must be in the curator's ingest_identities); default tls_cert",
    )
    curator_key: str = setting("", "key of curator_cert; default tls_key")
    insecure: bool = setting(
        False, "INSECURE local demos and tests: serve and reach the curator over plaintext gRPC without TLS"
    )
    allow_plaintext_payloads: bool = setting(
        False, "accept PAYLOAD_ENCODING_PLAINTEXT_INSECURE reports, which this shuffler could read: local demos only"
    )
    auth: str = setting(
        "token",
        "client authentication: 'token' (bearer tokens from tokens_file, or an mTLS "
        "certificate in client_identities) or 'none' (INSECURE: anyone may submit, there "
        "is no per-client quota and batches carry no distinct-client guarantee)",
    )
    tokens_file: Path | None = setting(
        None,
        "file of '<sha256 of token> <id> [client|operator]' lines, re-read "
        "when it changes (default: STATE_DIR/clients.tokens; add clients "
        "and operators with `lac shuffler add-client`)",
    )
    reports_per_window: int = setting(
        1,
        "k: reports accepted per client per accounting window; over it: "
        "RESOURCE_EXHAUSTED with retry-after-seconds. Must equal the curator's "
        "reports_per_window (it is the privacy unit)",
    )
    window_seconds: float = setting(
        86400.0,
        "the accounting window of the quota (the privacy unit is one client "
        "over a window); must equal the curator's window_seconds",
    )
    period_days: float = setting(
        365.0, "the period of max_windows_per_client_per_period (counted from the Unix epoch); as the curator's"
    )
    max_windows_per_client_per_period: int = setting(
        0,
        "one client may store reports in at most this many accounting windows per period (0: no cap); a report "
        "in one more window is refused (RESOURCE_EXHAUSTED, reject period_cap). Must equal the curator's",
    )
    idempotency_window_days: float = setting(
        7.0,
        "a report's idempotency id is remembered (a retry is acknowledged "
        "as a duplicate) for at least this many days and at most twice "
        "that; older ids are forgotten so the log stays bounded",
    )
    max_log_bytes: int = setting(
        2 * 1024**3,
        "disk quota of the report log (buffered reports + undelivered "
        "batches); when full, Submit answers UNAVAILABLE until "
        "forwarding drains it",
    )
    batch_threshold_noise: float = setting(
        0.0,
        "mean of a geometric random amount added to min_batch for each "
        "release (0 = exact min_batch), so batch sizes do not reveal "
        "exactly when the threshold was crossed",
    )
    subsample_q: float = setting(
        1.0,
        "Poisson sub-sampling at release: keep each report with probability q "
        "(1 = keep all); dropped reports are counted, never forwarded",
    )
    crowd_threshold: int = setting(
        0,
        "drop, at release, every crowd id with fewer than this many reports "
        "(0 = off; reports without a crowd id form one crowd)",
    )
    target_delta: float = setting(1e-6, "central delta of each batch's amplification statement")
    trace_link_callers: bool = setting(
        False,
        "with tracing on, a call's span (Submit, ...) starts a new trace with an OpenTelemetry link to the "
        "caller's span (its traceparent: an app's span around an SDK call), so an app's traces join this "
        "shuffler's; off, every call's span starts a new trace and the caller's is ignored. Keep the apps' "
        "trace store apart from the shuffler's either way",
    )
    shards: str = setting(
        "",
        "comma-separated public addresses host:port of all shuffler replicas, the same list "
        "on every replica (empty = one unsharded shuffler). Each client belongs to one "
        "replica (rendezvous hashing of its identity); the others refuse its reports with "
        "FAILED_PRECONDITION naming the right address, so its quota holds across replicas. "
        "Change the list only at a window boundary (see shards_effective_window): a client "
        "that moves to another replica mid-window gets a fresh quota there",
    )
    shard_name: str = setting("", "this replica's own entry in shards (required when shards is set)")
    shards_effective_window: int = setting(
        0,
        "the accounting window (unix time // window_seconds) from which "
        "this shard list applies; before it this replica refuses Submit "
        "with UNAVAILABLE and retry-after-seconds. To change the list, give "
        "every replica the new list with the next window here, so all of "
        "them switch at the same boundary (0 = applies at once)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for cert, key in (("tls_cert", "tls_key"), ("curator_cert", "curator_key")):
            if bool(getattr(self, cert)) != bool(getattr(self, key)):
                given, missing = (key, cert) if getattr(self, key) else (cert, key)
                raise ValueError(
                    f"--{given.replace('_', '-')} was given without --{missing.replace('_', '-')}: "
                    "a certificate and its key go together (`lac keys tls` writes NAME.pem and NAME.key)"
                )
        if self.min_batch < 1:
            raise ValueError("min_batch must be at least 1")
        if self.store and not is_postgres_url(self.store):
            raise ValueError("store must be empty (SQLite in state_dir) or a postgresql:// URL")
        if not (self.release_interval_seconds > 0 and self.window_seconds > 0):
            raise ValueError("release_interval_seconds and window_seconds must be positive")
        if not self.idempotency_window_days > 0:
            raise ValueError("idempotency_window_days must be positive")
        if self.max_report_bytes < 1 or self.max_reports_per_request < 1:
            raise ValueError("size limits must be positive")
        if self.auth not in ("token", "none"):
            raise ValueError("auth must be 'token' or 'none'")
        if self.reports_per_window < 1:
            raise ValueError("reports_per_window must be at least 1")
        if not (math.isfinite(self.period_days) and self.period_days > 0):
            raise ValueError("period_days must be finite and > 0")
        if self.max_windows_per_client_per_period < 0:
            raise ValueError("max_windows_per_client_per_period must be >= 0 (0: no cap)")
        if self.crowd_threshold < 0 or self.batch_threshold_noise < 0:
            raise ValueError("crowd_threshold and batch_threshold_noise must be >= 0")
        if not 0.0 < self.subsample_q <= 1.0:
            raise ValueError("subsample_q must be in (0, 1]")
        if not 0.0 < self.target_delta < 1.0:
            raise ValueError("target_delta must be in (0, 1)")
        if self.forward_in_flight < 1:
            raise ValueError("forward_in_flight must be at least 1")
        if self.max_log_bytes < 1 or self.max_batch_bytes < 1024:
            raise ValueError("max_log_bytes must be positive and max_batch_bytes at least 1024")
        if self.max_message_bytes < 1024 or self.max_concurrent_streams < 1 or self.max_pending_bytes < 1:
            raise ValueError(
                "max_message_bytes must be at least 1024, max_concurrent_streams and max_pending_bytes positive"
            )
        if not self.receive_timeout_seconds > 0 or self.max_connections < 1:
            raise ValueError("receive_timeout_seconds and max_connections must be positive")
        if not self.commit_timeout_seconds > 0 or self.min_free_disk_bytes < 0:
            raise ValueError("commit_timeout_seconds must be positive and min_free_disk_bytes >= 0")
        shards = parse_shards(self.shards)
        if shards and self.shard_name not in shards:
            raise ValueError(
                f"shard_name must be this replica's entry in shards ({', '.join(shards)}); got {self.shard_name!r}"
                if self.shard_name
                else f"shard_name is required with shards: this replica's entry among {', '.join(shards)}"
            )
        if self.shard_name and not shards:
            raise ValueError(
                f"shard_name is {self.shard_name!r} but shards is empty: set shards to the addresses "
                f"of all replicas (or unset shard_name for one unsharded shuffler)"
            )
        if shards and self.auth != "token":
            raise ValueError(
                "shards need client authentication (auth=token): an anonymous client cannot be assigned to a shard"
            )
        if self.shards_effective_window < 0:
            raise ValueError("shards_effective_window must be >= 0")

    @property
    def tokens_path(self) -> Path:
        """The tokens file in use (tokens_file, or STATE_DIR/clients.tokens)."""
        return self.tokens_file if self.tokens_file is not None else self.state_dir / "clients.tokens"

    @property
    def shard_list(self) -> tuple[str, ...]:
        """The replicas' addresses from ``shards`` (empty: not sharded)."""
        return parse_shards(self.shards)
