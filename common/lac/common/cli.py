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
    code = args.func(args)
    sys.exit(code or 0)
