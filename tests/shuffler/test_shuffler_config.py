import argparse
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from lac.common import config as cfg
from lac.shuffler.config import ENV_PREFIX, ShufflerConfig


def test_precedence_defaults_toml_env_flags(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text('min_batch = 7\nport = 1234\ncurator = "c:1"\n')
    env = {"LAC_SHUFFLER_PORT": "2345", "LAC_SHUFFLER_RELEASE_INTERVAL_SECONDS": "9.5"}
    c = cfg.load(ShufflerConfig, ENV_PREFIX, toml, {"curator": "flag:2", "host": None}, environ=env)
    assert (c.min_batch, c.port, c.release_interval_seconds, c.curator, c.host) == (7, 2345, 9.5, "flag:2", "127.0.0.1")
    with pytest.raises(FrozenInstanceError):
        c.port = 1


def test_errors_are_clear(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text("min_batchh = 7\n")
    with pytest.raises(ValueError, match="unknown settings.*min_batchh"):
        cfg.load(ShufflerConfig, ENV_PREFIX, toml, environ={})
    with pytest.raises(ValueError, match="LAC_SHUFFLER_MIN_BATCH"):
        cfg.load(ShufflerConfig, ENV_PREFIX, environ={"LAC_SHUFFLER_MIN_BATCH": "many"})
    with pytest.raises(ValueError, match="min_batch must be at least 1"):
        cfg.load(ShufflerConfig, ENV_PREFIX, flags={"min_batch": "0"}, environ={})


def test_every_field_has_a_documented_flag():
    parser = argparse.ArgumentParser()
    cfg.add_flags(parser, ShufflerConfig, ENV_PREFIX)
    text = parser.format_help()
    for name in ("--min-batch", "--state-dir", "--port-file", "--release-interval-seconds", "LAC_SHUFFLER_CURATOR"):
        assert name in text
    args = parser.parse_args(["--state-dir", "x", "--port", "0"])
    c = cfg.from_args(ShufflerConfig, ENV_PREFIX, args)
    assert c.state_dir == Path("x") and c.port == 0
