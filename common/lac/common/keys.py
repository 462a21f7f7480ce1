"""``lac keys``: curator key pairs (HPKE) and the deployment's TLS material."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lac.common import envelope, tls


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``lac keys`` (curator, tls, show) to the ``lac`` command."""
    p = sub.add_parser("keys", help="generate curator keys and TLS material")
    ks = p.add_subparsers(dest="keys_command", metavar="KIND", required=True)

    c = ks.add_parser(
        "curator",
        help="create (or with --rotate, replace) the curator's HPKE key pair",
        description="Writes curator-<id>.key (0600), curator-<id>.pub, curator.pub (give this "
        "to clients) and keyring.json. After --rotate the curator accepts the new "
        "and the previous key; older keys are dropped from the ring.",
    )
    c.add_argument("--dir", required=True, type=Path, help="the curator's key directory")
    c.add_argument("--rotate", action="store_true", help="make a new current key; the old one becomes previous")
    c.set_defaults(func=_curator)

    t = ks.add_parser(
        "tls",
        help="create a private CA and certificates for the services",
        description="Creates ca.pem/ca.key (unless present) and, per --name, <name>.pem/<name>.key "
        "valid for --hosts, usable for server and client (mTLS) authentication. "
        "The certificate's common name is the mTLS identity.",
    )
    t.add_argument("--dir", required=True, type=Path, help="where the CA and certificates live")
    t.add_argument(
        "--name",
        action="append",
        required=True,
        help="certificate to issue, e.g. shuffler, curator, or a client id (repeatable)",
    )
    t.add_argument(
        "--hosts",
        default="localhost,127.0.0.1",
        help="comma-separated DNS names / IPs the certificates are valid for (default %(default)s)",
    )
    t.set_defaults(func=_tls)

    s = ks.add_parser("show", help="print the key ids in a curator key directory")
    s.add_argument("--dir", required=True, type=Path)
    s.set_defaults(func=_show)


def _curator(args: argparse.Namespace) -> None:
    kid = envelope.generate_key(args.dir, rotate=args.rotate)
    print(
        f"curator key {kid} written to {args.dir} ({'rotated' if args.rotate else 'new'}); "
        f"distribute {args.dir / 'curator.pub'} to clients"
    )


def _tls(args: argparse.Namespace) -> None:
    if not (args.dir / "ca.key").exists():
        tls.make_ca(args.dir)
        print(f"CA written to {args.dir}/ca.pem (keep ca.key offline)")
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    for name in args.name:
        cert, key = tls.issue(args.dir, name, hosts)
        print(f"{name}: {cert} and {key} for {', '.join(hosts)}")


def _show(args: argparse.Namespace) -> None:
    ring = envelope.CuratorKeyRing.load(args.dir)
    print(json.dumps({"current": ring.current, "accepted": ring.key_ids}))
