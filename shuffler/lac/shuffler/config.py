"""Shuffler configuration (defaults < TOML < env LAC_SHUFFLER_* < flags)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lac.common.config import setting

ENV_PREFIX = "LAC_SHUFFLER_"


@dataclass(frozen=True)
class ShufflerConfig:
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(50051, "port to listen on (0 = any free port)")
    port_file: Path | None = setting(None, "write the bound port to this file once serving")
    state_dir: Path = setting(Path("lac-state/shuffler"), "directory of the durable report log")
    curator: str = setting("127.0.0.1:50052", "curator ingest address host:port")
    min_batch: int = setting(100, "release a batch only when at least this many reports are buffered")
    epoch_seconds: float = setting(3600.0, "epoch length; at each epoch end a batch is released if large enough")
    max_report_bytes: int = setting(64 * 1024, "largest accepted sealed payload")
    max_reports_per_request: int = setting(10_000, "most reports accepted in one Submit call")
    forward_retry_max_seconds: float = setting(30.0, "longest back-off between delivery attempts to the curator")

    def __post_init__(self) -> None:
        if self.min_batch < 1:
            raise ValueError("min_batch must be at least 1")
        if self.epoch_seconds <= 0:
            raise ValueError("epoch_seconds must be positive")
        if self.max_report_bytes < 1 or self.max_reports_per_request < 1:
            raise ValueError("size limits must be positive")
