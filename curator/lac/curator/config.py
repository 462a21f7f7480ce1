"""Curator configuration (defaults < TOML < env LAC_CURATOR_* < flags)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lac.common.config import setting

ENV_PREFIX = "LAC_CURATOR_"


@dataclass(frozen=True)
class CuratorConfig:
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(50052, "port to listen on (0 = any free port)")
    port_file: Path | None = setting(None, "write the bound port to this file once serving")
    state_dir: Path = setting(Path("lac-state/curator"), "directory of the report store and releases")
    public_corpus: Path | None = setting(None, "public text for the prior and release vocabulary "
                                               "(default: the corpus prepared by `lac data`)")
    max_n: int = setting(3, "longest n-gram released")
    vocab_min_count: int = setting(2, "public n-grams seen fewer times are left out of the release vocabulary")
    vocab_max_items: int = setting(50_000, "most n-grams in the release vocabulary (most frequent public ones)")
    max_items_per_report: int = setting(100, "W: most distinct n-grams counted per report")
    max_sentences_per_report: int = setting(1_000, "reports with more sentences are rejected")
    max_token_chars: int = setting(64, "reports with a longer token are rejected")
    key_dir: Path | None = setting(None, "directory of the curator's HPKE key ring (`lac keys curator`); "
                                         "sealed reports cannot be opened without it")
    tls_cert: str = setting("", "TLS certificate of this server (PEM; `lac keys tls --name curator`)")
    tls_key: str = setting("", "TLS private key of this server")
    tls_client_ca: str = setting("", "CA whose client certificates are accepted (mutual TLS; clients without "
                                     "one are refused): the shuffler's and analysts' certificates")
    ingest_identities: str = setting("shuffler", "comma-separated mTLS common names allowed to call "
                                                 "IngestBatch (others get PERMISSION_DENIED)")
    insecure: bool = setting(False, "INSECURE local demos and tests: serve plaintext gRPC without TLS and let "
                                    "anyone ingest")
    allow_plaintext_payloads: bool = setting(False, "accept PAYLOAD_ENCODING_PLAINTEXT_INSECURE reports (the "
                                                    "shuffler could read them): local demos only")
    budget_epsilon: float = setting(10.0, "total ε of this curator's data set; releases spend it "
                                          "(basic composition) and are refused once it would be exceeded")
    budget_delta: float = setting(1e-5, "total δ of this curator's data set (basic composition)")
    n_max: int = setting(1_000_000, "public cap on the number of reports in a release (sensitivity 'sound')")
    replay_window_days: float = setting(30.0, "a report id seen within this many days is rejected as a replay; "
                                              "older ids are forgotten")
    quarantine_max_rows: int = setting(10_000, "quarantined reports kept for diagnosis (the newest; 0 = none); "
                                               "reject counters keep the totals")
    allow_non_dp_releases: bool = setting(False, "allow the 'kanon' baseline over RPC (NOT differentially "
                                                 "private; it spends no budget and is flagged as such)")

    def __post_init__(self) -> None:
        if not 1 <= self.max_n <= 5:
            raise ValueError("max_n must be between 1 and 5")
        if self.vocab_min_count < 1 or self.vocab_max_items < 1 or self.max_items_per_report < 1:
            raise ValueError("vocabulary limits and W must be positive")
        if not (self.budget_epsilon >= 0 and 0 <= self.budget_delta < 1):
            raise ValueError("budget_epsilon must be >= 0 and budget_delta in [0, 1)")
        if self.n_max < 1 or not self.replay_window_days > 0:
            raise ValueError("n_max and replay_window_days must be positive")
        if self.quarantine_max_rows < 0:
            raise ValueError("quarantine_max_rows must be >= 0")
