"""``lac shuffler serve|status|flush``."""

from __future__ import annotations

import asyncio

import grpc

from lac.common import config as cfg
from lac.common.v1 import shuffler_pb2, shuffler_pb2_grpc
from lac.shuffler.config import ENV_PREFIX, ShufflerConfig


def register(subparsers) -> None:
    p = subparsers.add_parser("shuffler", help="the amplifier: batch, anonymise and shuffle reports")
    sub = p.add_subparsers(dest="shuffler_command", metavar="ACTION", required=True)
    serve = sub.add_parser("serve", help="run the shuffler gRPC server")
    cfg.add_flags(serve, ShufflerConfig, ENV_PREFIX)
    serve.set_defaults(func=_serve)
    for name, helptext, func in (("status", "print the shuffler's status", _status),
                                 ("flush", "release a batch now if at least min_batch reports are buffered", _flush)):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("--server", default="127.0.0.1:50051", help="shuffler address host:port")
        q.set_defaults(func=func)


def _serve(args) -> int:
    from lac.common.server import run_until_signalled
    from lac.shuffler.server import create_server
    from lac.shuffler.service import Shuffler

    config = cfg.from_args(ShufflerConfig, ENV_PREFIX, args)

    async def main():
        shuffler = Shuffler(config)
        server, port = create_server(shuffler)
        shuffler.start()
        await run_until_signalled(server, port, config.port_file, "shuffler", on_stop=shuffler.stop)

    asyncio.run(main())
    return 0


def _call(args, method: str, request):
    with grpc.insecure_channel(args.server) as channel:
        return getattr(shuffler_pb2_grpc.ShufflerStub(channel), method)(request, timeout=30)


def _status(args) -> int:
    s = _call(args, "GetStatus", shuffler_pb2.ShufflerStatusRequest())
    print(f"buffered reports:   {s.buffered_reports} (min_batch {s.min_batch})")
    print(f"batches forwarded:  {s.batches_forwarded} ({s.reports_forwarded} reports)")
    print(f"batches pending:    {s.batches_pending}")
    print("rejects:            " + (", ".join(f"{k}={v}" for k, v in sorted(s.rejects.items())) or "none"))
    if s.note:
        print(f"note:               {s.note}")
    return 0


def _flush(args) -> int:
    r = _call(args, "Flush", shuffler_pb2.FlushRequest())
    print(f"released batch {r.batch_id} of {r.batch_size} reports" if r.released else r.note)
    return 0
