"""The ``lac`` command. Each installed component adds its subcommands.

Components register through the ``lac.commands`` entry-point group: a function
``register(subparsers)`` that adds one subparser and sets ``func`` on it. A component
that is not installed is named with the package that provides it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib.metadata import entry_points

PROVIDERS = {
    "client": "lac-client",
    "shuffler": "lac-shuffler",
    "curator": "lac-curator",
    "data": "lac (the suite: pip install .)",
    "demo": "lac (the suite: pip install .)",
    "eval": "lac (the suite: pip install .)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lac", description="LAC: learn aggregate language statistics without learning about people.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    found = set()
    for ep in sorted(entry_points(group="lac.commands"), key=lambda e: e.name):
        ep.load()(sub)
        found.add(ep.name)
    for name, package in PROVIDERS.items():
        if name not in found:
            p = sub.add_parser(name, help=f"(not installed: {package})")
            p.set_defaults(func=lambda args, package=package, name=name: sys.exit(
                f"lac {name}: not installed here; install {package}"))
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        sys.exit(2)
    sys.exit(run_command(args))


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command; every failure ends in one line on stderr and exit code 2 (a
    traceback only with -v): a refused or failed RPC as ``CODE: details``, a bad input as the
    command's own message."""
    name = f"lac {args.command}"
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        message = _one_line(exc.code)
        print(message if message.startswith("lac ") or message.startswith("error") else f"{name}: {message}",
              file=sys.stderr)
        return 2
    except Exception as exc:
        code = getattr(exc, "code", None)
        if callable(code) and hasattr(exc, "details"):  # a gRPC error (or the SDK's, which subclass it)
            status = getattr(code(), "name", str(code()))
            print(f"{name}: {status}: {_one_line(exc.details() or '')}", file=sys.stderr)
        else:
            if args.verbose:
                logging.getLogger("lac").exception("%s failed", name)
            print(f"{name}: {type(exc).__name__}: {_one_line(exc)}"
                  + ("" if args.verbose else " (run with -v for details)"), file=sys.stderr)
        return 2
