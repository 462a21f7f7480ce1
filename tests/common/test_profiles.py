"""Connection profiles (``lac.common.profiles``): ``--server --ca --cert --key`` (and the shuffler's
``--token-file``) from the flags, else ``LAC_SERVER``/``LAC_CA``/``LAC_CERT``/``LAC_KEY``, else ``--profile``'s table
in ``$LAC_PROFILES`` or ``$XDG_CONFIG_HOME/lac/profiles.toml``, else the command's default; writing a profile keeps
the file's other profiles and comments. Against real servers: ``tests/system/test_cli_profiles.py`` and the docs'
commands against ``lac dev up`` (``tests/system/test_dev.py``)."""

from __future__ import annotations

import argparse
import stat
import tomllib
from pathlib import Path

import pytest

from lac.common import profiles
from lac.common.profiles import add_connection_flags, profiles_file, write_profile

FILE = """# my deployments
[prod]  # an analyst's profile, one table for every service
server = "curator.example.org:50052"
ca = "keys/ca.pem"
cert = "/abs/analyst.pem"
key = "/abs/analyst.key"

[dev.curator]
server = "127.0.0.1:1111"
ca = "/old/ca.pem"

[dev.shuffler]
server = "127.0.0.1:2222"
token-file = "ops.token"
"""


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A profiles file of the test's own (through XDG_CONFIG_HOME) and none of the connection variables set."""
    for name in (*profiles.ENV.values(), profiles.TOKEN_ENV, profiles.PROFILES_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    path = tmp_path / "config" / "lac" / "profiles.toml"
    path.parent.mkdir(parents=True)
    path.write_text(FILE)
    return monkeypatch


def _resolved(service: str | None, *argv: str, default: str | None = "127.0.0.1:50052") -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_connection_flags(p, service, default)
    if service == "shuffler":
        p.add_argument("--token-file", type=Path, default=None)
    args = p.parse_args(argv)
    args._connection.apply(args)
    return args


def _where(args) -> tuple:
    return args.server, args.ca, args.cert, args.key


def test_the_file_is_found_by_the_settings(tmp_path, env):
    assert profiles_file() == tmp_path / "config" / "lac" / "profiles.toml"
    env.setenv("LAC_PROFILES", str(tmp_path / "other.toml"))
    assert profiles_file() == tmp_path / "other.toml"
    env.delenv("LAC_PROFILES")
    env.delenv("XDG_CONFIG_HOME")
    env.setenv("HOME", str(tmp_path / "home"))
    assert profiles_file() == tmp_path / "home" / ".config" / "lac" / "profiles.toml"


def test_flags_win_over_the_environment_which_wins_over_the_profile(tmp_path, env):
    base = tmp_path / "config" / "lac"
    assert _where(_resolved("curator")) == ("127.0.0.1:50052", None, None, None)  # the command's default
    assert _where(_resolved("curator", "--profile", "dev")) == ("127.0.0.1:1111", "/old/ca.pem", None, None)
    assert _where(_resolved("curator", "--profile", "prod")) == (
        "curator.example.org:50052",
        str(base / "keys" / "ca.pem"),  # relative to the file
        "/abs/analyst.pem",
        "/abs/analyst.key",
    )
    env.setenv("LAC_SERVER", "env:1")
    env.setenv("LAC_CERT", "env.pem")
    got = _resolved("curator", "--profile", "prod")
    assert _where(got) == ("env:1", str(base / "keys" / "ca.pem"), "env.pem", "/abs/analyst.key")
    got = _resolved("curator", "--profile", "prod", "--server", "flag:2", "--cert", "flag.pem")
    assert _where(got) == ("flag:2", str(base / "keys" / "ca.pem"), "flag.pem", "/abs/analyst.key")
    # --insecure takes no CA or certificate from elsewhere (they would contradict it)
    assert _where(_resolved("curator", "--profile", "prod", "--insecure")) == ("env:1", None, None, None)


def test_a_service_table_and_the_operator_token(tmp_path, env):
    got = _resolved("shuffler", "--profile", "dev", default="127.0.0.1:50051")
    assert (got.server, got.token_file) == ("127.0.0.1:2222", tmp_path / "config" / "lac" / "ops.token")
    assert _resolved("shuffler", "--profile", "dev", "--token-file", "mine").token_file == Path("mine")
    env.setenv("LAC_OPERATOR_TOKEN", "a-token")  # a token in the environment wins over the profile's file
    assert _resolved("shuffler", "--profile", "dev", default="127.0.0.1:50051").token_file is None
    # `lac health` serves any service: it names the table
    assert _resolved(None, "--profile", "dev.curator", default=None).server == "127.0.0.1:1111"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--profile", "nope"], "no profile 'nope' in"),
        (["--profile", "dev"], "has tables for curator, shuffler: name one, e.g. --profile dev.curator"),
        (["--profile", "bad name"], "profile names are"),
        ([], "no server: give --server HOST:PORT, set LAC_SERVER, or --profile NAME"),
    ],
)
def test_a_profile_that_cannot_be_used_is_one_line(env, argv, message):
    with pytest.raises(SystemExit) as err:
        _resolved(None, *argv, default=None)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_no_file_and_a_malformed_file_say_so(tmp_path, env):
    env.setenv("LAC_PROFILES", str(tmp_path / "missing.toml"))
    with pytest.raises(SystemExit, match="no profiles file .*missing.toml .*lac dev up"):
        _resolved("curator", "--profile", "dev")
    (tmp_path / "bad.toml").write_text("[dev\nserver = 1\n")
    env.setenv("LAC_PROFILES", str(tmp_path / "bad.toml"))
    with pytest.raises(SystemExit, match="cannot read the profiles file"):
        _resolved("curator", "--profile", "dev")
    (tmp_path / "bad.toml").write_text('[dev]\nserver = 1\nport = "2"\n')
    with pytest.raises(SystemExit, match="expected text values of server, ca, cert, key, token-file only"):
        _resolved("curator", "--profile", "dev")


def test_writing_a_profile_replaces_it_and_keeps_the_rest(tmp_path, env):
    path = write_profile("dev", {"curator": {"server": "127.0.0.1:3333", "ca": '/new/"quoted" ca.pem'}})
    assert path == profiles_file() and stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert text.startswith("# my deployments\n[prod]  # an analyst's profile") and "/old/ca.pem" not in text
    found = tomllib.loads(text)
    assert found["dev"] == {"curator": {"server": "127.0.0.1:3333", "ca": '/new/"quoted" ca.pem'}}
    assert found["prod"]["server"] == "curator.example.org:50052"
    assert write_profile("dev", {"curator": {"server": "127.0.0.1:3333", "ca": '/new/"quoted" ca.pem'}}) == path
    assert path.read_text() == text  # rewriting the same profile changes nothing
    env.setenv("LAC_PROFILES", str(tmp_path / "new" / "profiles.toml"))  # a first profile in a new file
    write_profile("dev", {"shuffler": {"server": "h:1"}})
    assert tomllib.loads((tmp_path / "new" / "profiles.toml").read_text()) == {"dev": {"shuffler": {"server": "h:1"}}}


def test_a_profile_lists_every_replica_for_the_sdk_and_commands_take_its_server(tmp_path, env):
    """``replicas`` (what `lac dev up --ha` writes for its shufflers) reads back as a list; a command still talks to
    the one ``server``; replicas that are not a list of addresses are refused."""
    env.setenv("LAC_PROFILES", str(tmp_path / "replicas.toml"))
    write_profile("ha", {"shuffler": {"server": "h:1", "replicas": ["h:1", "h:2"]}})
    assert profiles.profile("ha", "shuffler")["replicas"] == ["h:1", "h:2"]
    assert _where(_resolved("shuffler", "--profile", "ha"))[0] == "h:1"
    (tmp_path / "replicas.toml").write_text('[ha]\nserver = "h:1"\nreplicas = "h:1,h:2"\n')
    with pytest.raises(SystemExit, match="and replicas a list"):
        _resolved("shuffler", "--profile", "ha")
