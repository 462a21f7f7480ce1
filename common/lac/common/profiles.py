"""Connection profiles: how a ``lac`` command reaches a service without ``--server --ca --cert --key`` each time.

Each setting comes from its flag, else its environment variable (``LAC_SERVER``, ``LAC_CA``, ``LAC_CERT``,
``LAC_KEY``; the shuffler's operator token from ``LAC_OPERATOR_TOKEN``), else the profile named by ``--profile``,
else the command's default. Profiles are tables of a TOML file, ``$LAC_PROFILES`` if set, else
``$XDG_CONFIG_HOME/lac/profiles.toml`` (``~/.config/lac/profiles.toml``): configuration, kept apart from the data
directory, which is a cache. A profile holds ``server``, ``ca``, ``cert``, ``key`` and ``token-file`` (relative
paths are relative to the file) and may hold ``replicas``, the list of every replica's address, for the SDK's
failover (``ShufflerClient.connect(profile(...)["replicas"], ...)``; a command talks to ``server``); or one table per
service, ``[NAME.curator]`` and ``[NAME.shuffler]``, which ``lac curator …`` and ``lac shuffler …`` pick;
``--profile NAME.curator`` names one table outright. ``lac dev up`` writes the profile ``dev``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lac.common.files import atomic_file

__all__ = ["PROFILES_ENV", "ENV", "ProfileError", "profiles_file", "profile", "write_profile", "add_connection_flags"]

PROFILES_ENV = "LAC_PROFILES"
# argparse dest -> (its environment variable, its key in a profile)
ENV = {"server": "LAC_SERVER", "ca": "LAC_CA", "cert": "LAC_CERT", "key": "LAC_KEY"}
TOKEN_ENV = "LAC_OPERATOR_TOKEN"  # a token itself: when set, a profile's token-file is not read
KEYS = {"server": "server", "ca": "ca", "cert": "cert", "key": "key", "token_file": "token-file"}
KEYS["replicas"] = "replicas"  # a list: every replica's address, which the SDK takes (no command has the flag)
_PATHS = ("ca", "cert", "key", "token_file")
_NAME = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)?$")
_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")


class ProfileError(ValueError):
    """A profile that cannot be used: no file, no such profile, or a malformed one (the message says which)."""


def profiles_file() -> Path:
    """``$LAC_PROFILES``, else ``$XDG_CONFIG_HOME/lac/profiles.toml``, else ``~/.config/lac/profiles.toml``."""
    if value := os.environ.get(PROFILES_ENV):
        return Path(value)
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".config") / "lac" / "profiles.toml"


def profile(name: str, service: str | None) -> dict[str, Any]:
    """The settings of profile ``name`` for ``service`` (its ``[name.service]`` table if it has one), with paths
    made absolute against the file's directory; ``ProfileError`` if there is none."""
    path = profiles_file()
    if not _NAME.match(name):
        raise ProfileError(f"profile names are letters, digits, - and _ (NAME or NAME.SERVICE), not {name!r}")
    try:
        found: Any = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileError(
            f"no profiles file {path} (`lac dev up` writes the profile dev; set {PROFILES_ENV})"
        ) from None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"cannot read the profiles file {path}: {exc}") from None
    for part in name.split("."):
        found = found.get(part) if isinstance(found, dict) else None
    if not isinstance(found, dict):
        raise ProfileError(f"no profile {name!r} in {path}")
    if service is not None and isinstance(found.get(service), dict):
        found = found[service]
    settings = {k: v for k, v in found.items() if not isinstance(v, dict)}
    unknown = set(settings) - set(KEYS.values())
    if unknown or not all(
        isinstance(v, list) and all(isinstance(a, str) for a in v) if k == "replicas" else isinstance(v, str)
        for k, v in settings.items()
    ):
        texts = ", ".join(k for k in KEYS.values() if k != "replicas")
        raise ProfileError(f"profile {name!r} in {path}: expected text values of {texts} only, and replicas a list")
    if not settings:
        tables = ", ".join(k for k, v in found.items() if isinstance(v, dict))
        raise ProfileError(
            f"profile {name!r} in {path} has tables for {tables}: name one, e.g. --profile {name}.curator"
        )
    return {dest: _value(dest, settings[k], path.parent) for dest, k in KEYS.items() if k in settings}


def _value(dest: str, value: str, base: Path) -> Any:
    if dest not in _PATHS:
        return value
    p = base / Path(value).expanduser()
    return p if dest == "token_file" else str(p)


def write_profile(name: str, tables: dict[str, dict[str, str | list[str]]]) -> Path:
    """Set profile ``name`` to ``tables`` (service -> settings) in ``profiles_file()``, keeping its other profiles
    and their comments; the file is written atomically, readable by its owner only. Returns its path."""
    path = profiles_file()
    if not _NAME.match(name) or "." in name:
        raise ProfileError(f"profile names are letters, digits, - and _, not {name!r}")
    try:
        old = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        old = ""
    kept, skipping = [], False
    for line in old.splitlines():
        if header := _HEADER.match(line):
            table = header.group(1).strip().strip('"')
            skipping = table == name or table.startswith(f"{name}.")
        if not skipping:
            kept.append(line)
    while kept and not kept[-1].strip():
        kept.pop()
    new = [
        f"[{name}.{service}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in s.items())
        for service, s in tables.items()
    ]
    text = "\n".join(["\n".join(kept) + "\n" if kept else "", *new]).lstrip("\n")
    tomllib.loads(text)  # what is written must read back
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with atomic_file(path) as f:
        f.write(text.encode("utf-8"))
    return path


@dataclass(frozen=True)
class _Connection:
    """What ``add_connection_flags`` records on a parser; ``apply`` fills the settings in before the command runs."""

    service: str | None
    default_server: str | None

    def apply(self, args: argparse.Namespace) -> None:
        """Flags, else environment, else ``--profile``, else defaults, into ``args``; SystemExit (one line) for a
        profile that cannot be used or no server at all."""
        missing = [d for d in KEYS if d in vars(args) and getattr(args, d) in (None, "")]
        if args.insecure:  # a plaintext channel: no CA or certificate from elsewhere may contradict the flag
            missing = [d for d in missing if d not in ("ca", "cert", "key")]
        for dest in missing:
            if env := os.environ.get(ENV.get(dest, "")):
                setattr(args, dest, env)
        chosen: dict[str, Any] = {}
        if args.profile:
            try:
                chosen = profile(args.profile, self.service)
            except ProfileError as exc:
                raise SystemExit(f"error: {exc}") from None
        for dest in missing:
            if getattr(args, dest) in (None, "") and not (dest == "token_file" and os.environ.get(TOKEN_ENV)):
                setattr(args, dest, chosen.get(dest, getattr(args, dest)))
        if not args.server:
            args.server = self.default_server
        if not args.server:
            raise SystemExit(f"error: no server: give --server HOST:PORT, set {ENV['server']}, or --profile NAME")


def add_connection_flags(p: argparse.ArgumentParser, service: str | None, default_server: str | None) -> None:
    """``--server``, ``--profile``, ``--ca``, ``--cert``, ``--key`` and ``--insecure`` on a command that talks to
    ``service`` (None: any, e.g. ``lac health``), resolved by ``lac.common.cli.run_command`` before it runs."""
    where = f"the {service}'s" if service else "the service's"
    default = f", else {default_server}" if default_server else ""
    p.add_argument(
        "--server",
        default=None,
        help=f"{where} address host:port [default: ${ENV['server']}, else the profile's{default}]",
    )
    table = f"[NAME.{service}] or [NAME]" if service else "[NAME] (e.g. --profile dev.curator)"
    p.add_argument(
        "--profile",
        metavar="NAME",
        default=None,
        help=f"connection profile: table {table} of ${PROFILES_ENV} or $XDG_CONFIG_HOME/lac/profiles.toml "
        "(~/.config/lac/profiles.toml); `lac dev up` writes dev. Flags win over environment variables, which win "
        "over the profile",
    )
    p.add_argument("--ca", default=None, help=f"CA certificate to trust (ca.pem from `lac keys tls`) [${ENV['ca']}]")
    p.add_argument("--cert", default=None, help=f"client certificate, for servers that require mTLS [${ENV['cert']}]")
    p.add_argument("--key", default=None, help=f"client certificate's key [${ENV['key']}]")
    p.add_argument("--insecure", action="store_true", help="plaintext channel without TLS (local demos only)")
    p.set_defaults(_connection=_Connection(service, default_server))
