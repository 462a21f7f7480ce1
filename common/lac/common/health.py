"""``lac health --server HOST:PORT``: is a LAC service serving? Exit 0 if so, 1 if it answers that it is
not, 2 if it cannot be asked (unreachable, refused, bad flags); for probes and scripts."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import grpc

from lac.common import tls
from lac.common.profiles import add_connection_flags


def check(address: str, channel_tls: tls.ClientTls | None, timeout: float, wait: bool = False) -> bool:
    """True if the service at ``address`` reports SERVING."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc  # a service dependency, not the client's

    with tls.channel(address, channel_tls) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout, wait_for_ready=wait
        )
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "health", help="check that a LAC service is serving (exit 0 if so, 1 if not, 2 if it cannot be asked)"
    )
    add_connection_flags(p, None, None)
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    address = args.server
    try:
        ok = check(address, tls.client_tls_from_args(args, "lac health"), args.timeout)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    except grpc.RpcError as e:
        cause = tls.missing_client_cert(args) if e.code() == grpc.StatusCode.UNAVAILABLE else None
        if cause:
            print(f"lac health: {cause}", file=sys.stderr)
        else:
            print(f"lac health: {address}: {e.code().name}: {' '.join((e.details() or '').split())}", file=sys.stderr)
        return 2
    print(f"{address}: {'SERVING' if ok else 'NOT SERVING'}")
    return 0 if ok else 1
