"""Service configuration: a frozen dataclass filled from defaults < TOML < env < flags.

Each field carries its help text (``setting(default, "help")``); ``add_flags`` turns the
fields into ``--kebab-case`` options so ``--help`` documents every one, and ``load``
merges the four sources with that precedence. Env names are ``<PREFIX><FIELD_NAME>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
import typing
from pathlib import Path
from typing import Any, TypeVar

from lac.common.logs import LOG_FORMATS

T = TypeVar("T")
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # usable here
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def setting(default: Any, help: str) -> Any:
    """A config field with its documentation."""
    return dataclasses.field(default=default, metadata={"help": help})


def _field_types(cls: type) -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        args = [a for a in typing.get_args(t) if a is not type(None)]
        out[f.name] = args[0] if args else t
    return out


def _convert(kind: type, value: Any, origin: str) -> Any:
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE | _FALSE:
                return text in _TRUE
            raise ValueError(f"expected true/false, got {value!r}")
        if kind is Path:
            return Path(value).expanduser()
        if kind is float:
            return float(value)
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"expected an integer, got {value!r}")
            return int(value)
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{origin}: {exc}") from None


def add_flags(parser: argparse.ArgumentParser, cls: type, env_prefix: str) -> None:
    """Add ``--config`` and one flag per field of ``cls`` to ``parser``."""
    parser.add_argument(
        "--config",
        type=Path,
        metavar="TOML",
        help="TOML file with any of the settings below (flags override env, env overrides file)",
    )
    parser.set_defaults(_env_prefix=env_prefix)  # for requested_log_format
    types = _field_types(cls)
    for f in dataclasses.fields(cls):
        kind = types[f.name]
        flag = "--" + f.name.replace("_", "-")
        env = env_prefix + f.name.upper()
        text = f"{f.metadata.get('help', '')} [default: {f.default}; env {env}]"
        if kind is bool:
            parser.add_argument(flag, dest=f.name, default=None, action=argparse.BooleanOptionalAction, help=text)
        else:
            parser.add_argument(flag, dest=f.name, default=None, metavar=kind.__name__.upper(), help=text)


def load(
    cls: type[T],
    env_prefix: str,
    toml_path: Path | None = None,
    flags: dict[str, Any] | None = None,
    environ: typing.Mapping[str, str] | None = None,
) -> T:
    """Build ``cls`` from defaults, then TOML, then environment, then non-None flags."""
    environ = os.environ if environ is None else environ
    types = _field_types(cls)
    values: dict[str, Any] = {}
    if toml_path is not None:
        with open(toml_path, "rb") as fh:
            data = tomllib.load(fh)
        unknown = set(data) - set(types)
        if unknown:
            raise ValueError(f"{toml_path}: unknown settings {sorted(unknown)}; known: {sorted(types)}")
        for k, v in data.items():
            values[k] = _convert(types[k], v, f"{toml_path}: {k}")
    for name, kind in types.items():
        env = env_prefix + name.upper()
        if env in environ:
            values[name] = _convert(kind, environ[env], env)
    for name, v in (flags or {}).items():
        if name in types and v is not None:
            values[name] = _convert(types[name], v, "--" + name.replace("_", "-"))
    return cls(**values)


def requested_log_format(args: argparse.Namespace, environ: typing.Mapping[str, str] | None = None) -> str:
    """The ``log_format`` a command built with ``add_flags`` asks for (flag, else environment, else TOML file, as
    ``load`` would take it), read alone before its other settings, so that a failure to load them is logged in that
    format; ``"text"`` for other commands, or when the TOML file cannot be read."""
    prefix = getattr(args, "_env_prefix", None)
    if prefix is None:
        return "text"
    environ = os.environ if environ is None else environ
    found = getattr(args, "log_format", None) or environ.get(prefix + "LOG_FORMAT")
    if found is None and getattr(args, "config", None) is not None:
        try:
            with open(args.config, "rb") as fh:
                found = tomllib.load(fh).get("log_format")
        except (OSError, ValueError):
            found = None
    return found if found in LOG_FORMATS else "text"


def from_args(cls: type[T], env_prefix: str, args: argparse.Namespace) -> T:
    """``load`` using the namespace produced by a parser built with ``add_flags``."""
    return load(cls, env_prefix, getattr(args, "config", None), vars(args))


@dataclasses.dataclass(frozen=True)
class ServiceSettings:
    """The settings every service has: its metrics endpoint and its log format (a base of each
    service's configuration)."""

    metrics_port: int | None = setting(
        None, "serve Prometheus text metrics at http://METRICS_HOST:PORT/metrics (0 = any free port; unset = off)"
    )
    metrics_host: str = setting(
        "127.0.0.1",
        "address of the metrics endpoint (plaintext, unauthenticated, for "
        "the operator only: it has exact counts; keep it on loopback or a "
        "private network; any other address is logged as a warning at start)",
    )
    log_format: str = setting(
        "text",
        "log lines as 'text' or 'json' (one JSON object per line: time, level, logger, message and extra fields)",
    )
    otlp_endpoint: str = setting(
        "",
        "send OpenTelemetry traces over OTLP/HTTP to this collector URL (e.g. http://127.0.0.1:4318/v1/traces; "
        "needs lac-common[tracing]; spans hold no payload, token or identity); empty = off",
    )
    trace_console: bool = setting(
        False, "print each finished trace span to stdout as one JSON object (needs lac-common[tracing])"
    )

    def __post_init__(self) -> None:
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log_format must be one of {', '.join(LOG_FORMATS)}")
