"""``lac health ADDRESS``: is a LAC service serving? (exit 0 if so; for probes and scripts)."""

from __future__ import annotations

import sys

import grpc

from lac.common import tls


def check(address: str, channel_tls: tls.ClientTls | None, timeout: float, wait: bool = False) -> bool:
    """True if the service at ``address`` reports SERVING."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc  # a service dependency, not the client's

    with tls.channel(address, channel_tls) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                          timeout=timeout, wait_for_ready=wait)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def register(sub) -> None:
    p = sub.add_parser("health", help="check that a LAC service is serving (exit 0 if so)")
    p.add_argument("address", help="host:port")
    p.add_argument("--timeout", type=float, default=3.0)
    tls.add_client_flags(p)
    p.set_defaults(func=_main)


def _main(args) -> int:
    try:
        ok = check(args.address, tls.client_tls_from_args(args, "lac health"), args.timeout)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except grpc.RpcError as e:
        print(f"{args.address}: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    print(f"{args.address}: {'SERVING' if ok else 'NOT SERVING'}")
    return 0 if ok else 1
