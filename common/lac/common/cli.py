"""The ``lac`` command. Each installed component adds its subcommands.

Components register through the ``lac.commands`` entry-point group: a function
``register(subparsers)`` that adds one subparser and sets ``func`` on it. A component
that is not installed is named with the package that provides it; one whose import or
``register`` fails breaks only its own command, which then says why in one line.

One grammar for every command: lower-case kebab-case flags, ``--server HOST:PORT`` for the
service a command talks to, and every bad input (a usage error, a refused or failed RPC, a
missing file) ends in one line on stderr and exit code 2, never a traceback (unless ``-v``).
A reader that goes away early (``lac shuffler status | head -1``) ends the command quietly with
exit code 141, as a tool killed by SIGPIPE does.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, NoReturn

from lac.common.errors import RemoteError

if TYPE_CHECKING:
    from _typeshed import SupportsWrite
    from google.protobuf.descriptor import FieldDescriptor
    from google.protobuf.message import Message

PROVIDERS = {
    "client": "lac-client",
    "shuffler": "lac-shuffler",
    "curator": "lac-curator (or lac-analyst for its client commands)",
    "data": "lac-privacy-suite (the suite: pip install .)",
    "demo": "lac-privacy-suite (the suite: pip install .)",
    "dev": "lac-privacy-suite (the suite: pip install .)",
    "eval": "lac-privacy-suite (the suite: pip install .)",
}


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr and exit code 2 (subcommand
    parsers inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_one_line(message)}\n")

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        # argparse's swallows a closed pipe (``lac --help | head -1`` then exits 0); main() ends it as any other
        if message:
            (file or sys.stderr).write(message)


def positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    """An argparse ``type``: a finite number of ``kind`` > 0, so a bad value is a usage error before any work."""

    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'} > 0, got {text!r}"
            ) from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
        return value

    convert.__name__ = kind.__name__
    return convert


def message_dict(message: Message) -> dict[str, Any]:
    """A protobuf message as the ``--json`` of every command prints it: field names as in the .proto,
    every field without presence included (zeros, empty lists and maps: a count of 0 is printed, not left
    out), ``optional`` fields only when set, enums by name, and 64-bit integers as JSON numbers (protobuf's
    JSON mapping writes them as strings; Python's ``json`` holds any integer exactly). Map keys stay
    strings, as JSON requires; a NaN or infinite double is the string ``"NaN"``/``"Infinity"``."""
    from google.protobuf.json_format import MessageToDict

    found = MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return _int64_as_numbers(message.DESCRIPTOR, found)


def message_json(message: Message) -> str:
    """``message_dict(message)`` as indented JSON text (non-ASCII characters such as ε kept as they are)."""
    return json.dumps(message_dict(message), indent=2, ensure_ascii=False)


def _int64_as_numbers(descriptor: Any, found: dict[str, Any]) -> dict[str, Any]:
    """``found`` (``MessageToDict`` of a message whose ``Descriptor`` is ``descriptor``) with its 64-bit
    integers, at any depth, turned from strings back into ints."""
    for name, value in found.items():
        field = descriptor.fields_by_name.get(name)
        if field is None:  # not a field of this message (MessageToDict writes only fields; kept as it is)
            continue
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            value_field = entry.fields_by_name["value"]
            found[name] = {key: _field_value(value_field, v) for key, v in value.items()}
        elif field.is_repeated:
            found[name] = [_field_value(field, v) for v in value]
        else:
            found[name] = _field_value(field, value)
    return found


def _field_value(field: FieldDescriptor, value: Any) -> Any:
    from google.protobuf.descriptor import FieldDescriptor as F

    if field.type in (F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_SINT64, F.TYPE_FIXED64, F.TYPE_SFIXED64):
        return int(value)
    message = field.message_type
    if message is not None and isinstance(value, dict) and not message.full_name.startswith("google.protobuf."):
        return _int64_as_numbers(message, value)  # a nested message (well-known types have their own JSON)
    return value


def _provides(ep: EntryPoint) -> bool:
    """Whether ``ep`` comes from the distribution ``PROVIDERS`` names for its command."""
    return ep.dist is not None and PROVIDERS.get(ep.name, "").split(" ")[0] == ep.dist.name


def _unregister(sub: argparse._SubParsersAction[Any], name: str) -> None:
    """Remove what a failed ``register`` may have added under ``name``."""
    sub._name_parser_map.pop(name, None)
    sub._choices_actions[:] = [a for a in sub._choices_actions if a.dest != name]


def _add_broken(sub: argparse._SubParsersAction[Any], ep: EntryPoint, exc: BaseException) -> None:
    """``lac NAME`` for a plugin that failed to load: whatever follows, one line naming it and the error."""
    why = f"{type(exc).__name__}: {_one_line(exc)}"
    p = sub.add_parser(ep.name, help=f"(failed to load: {why})", add_help=False)

    def broken(args: argparse.Namespace) -> NoReturn:
        if getattr(args, "verbose", False):
            logging.getLogger("lac").error("plugin %s failed to load", ep.value, exc_info=exc)
        raise SystemExit(f"lac {ep.name}: the plugin {ep.name!r} ({ep.value}) failed to load: {why}")

    p.set_defaults(func=broken, _any_arguments=True)


class _Version(argparse.Action):
    """``--version``: print ``lac.common.version.version_line()`` (unwrapped, on stdout) and exit 0."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> NoReturn:
        from lac.common.version import version_line

        print(version_line())
        parser.exit()


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``lac`` parser with every installed command; given the ``argv`` to parse, only the command it
    names is loaded when that is an installed one (each command imports its own component, some of them
    scipy or matplotlib: loading all of them took over a second before any command ran)."""
    parser = Parser(prog="lac", description="LAC: learn aggregate language statistics without learning about people.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action=_Version, help="print the installed LAC distributions' versions and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    found = set()
    # By name; for one name from two distributions (lac-analyst's `curator` and lac-curator's), PROVIDERS' first.
    plugins = sorted(entry_points(group="lac.commands"), key=lambda e: (e.name, not _provides(e)))
    named = next((a for a in argv or () if not a.startswith("-")), None)
    if named is not None and any(ep.name == named for ep in plugins):
        plugins = [ep for ep in plugins if ep.name == named]
        found = {name for name in PROVIDERS if name != named}  # the others are not needed to parse argv
    for ep in plugins:
        if ep.name in found:  # the same command from two installed distributions: the first one wins
            continue
        found.add(ep.name)
        try:
            ep.load()(sub)
        except Exception as exc:  # a broken plugin must not take the other commands down
            _unregister(sub, ep.name)
            _add_broken(sub, ep, exc)
    for name, package in PROVIDERS.items():
        if name not in found:
            p = sub.add_parser(name, help=f"(not installed: {package})")
            p.set_defaults(
                func=lambda args, package=package, name=name: sys.exit(
                    f"lac {name}: not installed here; install {package}"
                )
            )
    return parser


def command_name(args: argparse.Namespace) -> str:
    """``lac curator query top`` for a namespace parsed by ``build_parser``."""
    words = [args.command] + [v for k, v in vars(args).items() if k.endswith("_command") and isinstance(v, str)]
    return " ".join(["lac", *[w for w in words if w]])


def main(argv: list[str] | None = None) -> None:
    """The ``lac`` command: parse ``argv`` (default ``sys.argv[1:]``), run the command, exit with its code."""
    try:
        try:
            code = _main(argv)
        finally:
            sys.stdout.flush()  # a piped stdout is written here, not at exit, so a closed pipe is caught below
    except BrokenPipeError:
        code = _reader_gone()
    sys.exit(code)


def _main(argv: list[str] | None) -> int:
    parser = build_parser(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "_any_arguments", False):
        args._json_logs = _json_logs(args)
        _fail(args, f"{command_name(args)}: error: unrecognized arguments: {_one_line(' '.join(extra))}")
        sys.exit(2)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return run_command(args)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what the shell reports for `yes | head -1`'s yes, so `set -o pipefail` agrees


def _reader_gone() -> int:
    """Stdout's reader closed the pipe: nothing more can be said there (and the output is cut short, so this is
    not success). Stdout goes to /dev/null, so the interpreter's last flush raises nothing; no message."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return SIGPIPE_EXIT


def _json_logs(args: argparse.Namespace) -> bool:
    """Log as JSON lines now if the command's settings ask for them (``lac.common.config.requested_log_format``:
    a service's ``serve``), so that even a failure to load its settings is a JSON line; whether they do."""
    from lac.common.config import requested_log_format

    if requested_log_format(args) != "json":
        return False
    from lac.common.logs import configure

    configure("json", getattr(args, "verbose", False))
    return True


def _fail(args: argparse.Namespace, message: str) -> None:
    """Say why the command failed: one line on stderr, or, with JSON logs, one record at CRITICAL of logger
    ``lac`` (the same text as its ``message``)."""
    if getattr(args, "_json_logs", False):
        logging.getLogger("lac").critical(message, extra={"command": command_name(args)})
    else:
        print(message, file=sys.stderr)


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command; every failure ends in one line on stderr and exit code 2 (a
    traceback only with -v): a refused or failed RPC as ``CODE: details``, a bad input as the
    command's own message. A service's ``serve`` with JSON logs says it as a JSON record at CRITICAL instead."""
    name = command_name(args)
    args._json_logs = _json_logs(args)
    try:
        if (connection := getattr(args, "_connection", None)) is not None:
            connection.apply(args)  # --server/--ca/--cert/--key from the environment or --profile (lac.common.profiles)
        return int(args.func(args) or 0)
    except BrokenPipeError:  # not a failure of the command: main() ends it quietly
        raise
    except KeyboardInterrupt:
        _fail(args, f"{name}: interrupted")
        return 130
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        message = _one_line(exc.code)
        _fail(args, message if message.startswith("lac ") else f"{name}: {message}")
        return 2
    except Exception as exc:
        code = getattr(exc, "code", None)
        status: str | None = None
        if isinstance(exc, RemoteError):  # a client library's typed error (lac.analyst)
            status, details = exc.code, exc.details
        elif callable(code) and hasattr(exc, "details"):  # a gRPC error (or the SDK's, which subclass it)
            status, details = getattr(code(), "name", str(code())), exc.details() or ""
        if status is not None:
            message = f"{status}: {_one_line(details)}"
            if status == "UNAVAILABLE":  # "Socket closed" may be a server that requires a client certificate
                from lac.common.tls import missing_client_cert

                message = missing_client_cert(args) or message
            _fail(args, f"{name}: {message}")
        elif isinstance(exc, OSError) and exc.filename and exc.strerror:  # a missing or unreadable file
            if getattr(args, "verbose", False):
                logging.getLogger("lac").exception("%s failed", name)
            _fail(args, f"{name}: {exc.strerror}: {exc.filename}")
        else:
            if args.verbose:
                logging.getLogger("lac").exception("%s failed", name)
            hint = "" if args.verbose else " (run with -v for details)"
            _fail(args, f"{name}: {type(exc).__name__}: {_one_line(exc)}{hint}")
        return 2
