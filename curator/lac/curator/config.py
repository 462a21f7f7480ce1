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

    def __post_init__(self) -> None:
        if not 1 <= self.max_n <= 5:
            raise ValueError("max_n must be between 1 and 5")
        if self.vocab_min_count < 1 or self.vocab_max_items < 1 or self.max_items_per_report < 1:
            raise ValueError("vocabulary limits and W must be positive")
