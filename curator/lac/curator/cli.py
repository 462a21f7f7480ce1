"""``lac curator serve|release|releases|top|status``."""

from __future__ import annotations

import argparse
import asyncio
import json

import grpc
from google.protobuf.json_format import MessageToDict

from lac.common import config as cfg
from lac.common.v1 import curator_pb2, curator_pb2_grpc
from lac.curator.config import ENV_PREFIX, CuratorConfig


def register(subparsers) -> None:
    p = subparsers.add_parser("curator", help="the analyser: ingest batches, release n-gram statistics with DP")
    sub = p.add_subparsers(dest="curator_command", metavar="ACTION", required=True)
    serve = sub.add_parser("serve", help="run the curator gRPC server")
    cfg.add_flags(serve, CuratorConfig, ENV_PREFIX)
    serve.set_defaults(func=_serve)

    def client_parser(name, helptext, func):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("--server", default="127.0.0.1:50052", help="curator address host:port")
        q.add_argument("--json", action="store_true", help="print JSON")
        q.set_defaults(func=func)
        return q

    r = client_parser("release", "release the n-gram distribution of all stored reports (BayesianDP)", _release)
    r.add_argument("--epsilon", type=float, required=True, help="ε of this release")
    r.add_argument("--delta", type=float, required=True, help="δ of this release")
    r.add_argument("--S", dest="s", type=float, default=0.0, help="decay slope S (default: library default)")
    r.add_argument("--C", dest="c", type=int, default=0, help="per-item count clamp C (default: library default)")
    r.add_argument("--rho", type=float, default=0.0, help="private/public weight ρ (default: library default)")
    r.add_argument("--sensitivity", choices=["bruteforce", "claim1"], default="bruteforce")
    r.add_argument("--calibration", choices=["auto", "classic", "analytic"], default="auto")
    client_parser("releases", "list releases", _releases)
    t = client_parser("top", "top n-grams of a release", _top)
    t.add_argument("release_id")
    t.add_argument("-k", type=int, default=20)
    t.add_argument("--order", type=int, default=0, help="only n-grams of this n (0 = all)")
    client_parser("status", "stored batches, reports, rejects", _status)


def _serve(args) -> int:
    from lac.common.server import run_until_signalled
    from lac.curator.prior import public_vocabulary
    from lac.curator.server import create_server
    from lac.curator.service import Curator

    config = cfg.from_args(CuratorConfig, ENV_PREFIX, args)
    vocab = public_vocabulary(config.public_corpus, config.max_n, config.vocab_min_count, config.vocab_max_items,
                              config.state_dir / "prior")

    async def main():
        curator = Curator(config, vocab)
        server, port = create_server(curator)
        await run_until_signalled(server, port, config.port_file, "curator", on_stop=curator.stop)

    asyncio.run(main())
    return 0


def _stub(args):
    return curator_pb2_grpc.CuratorStub(grpc.insecure_channel(args.server))


def _print(args, message, text: str) -> None:
    print(json.dumps(MessageToDict(message, preserving_proto_field_name=True), indent=2) if args.json else text)


def describe(r: curator_pb2.ReleaseRecord) -> str:
    return (f"release {r.release_id} ({r.created_at})\n"
            f"  mechanism {r.mechanism}, sensitivity {r.sensitivity_method}"
            f"{' (data-dependent)' if r.data_dependent else ''}, calibration {r.calibration}\n"
            f"  (ε, δ) = ({r.epsilon:g}, {r.delta:g}); γ = {r.gamma:.6g}; σ = {r.sigma:.6g}\n"
            f"  {r.n_reports} reports, {r.vocab_size} n-grams (n ≤ {r.max_n})\n"
            f"  {r.statement}")


def _release(args) -> int:
    req = curator_pb2.ReleaseRequest(mechanism="bayesian", epsilon=args.epsilon, delta=args.delta, s=args.s,
                                     c=args.c, rho=args.rho, sensitivity=args.sensitivity,
                                     calibration=args.calibration)
    record = _stub(args).Release(req, timeout=600)
    _print(args, record, describe(record))
    return 0


def _releases(args) -> int:
    reply = _stub(args).ListReleases(curator_pb2.ListReleasesRequest(), timeout=30)
    _print(args, reply, "\n".join(describe(r) for r in reply.releases) or "no releases")
    return 0


def _top(args) -> int:
    reply = _stub(args).TopNgrams(curator_pb2.TopNgramsRequest(release_id=args.release_id, k=args.k,
                                                               order=args.order), timeout=30)
    _print(args, reply, "\n".join(f"{g.probability:10.6f}  {g.ngram}" for g in reply.ngrams))
    return 0


def _status(args) -> int:
    s = _stub(args).GetStatus(curator_pb2.CuratorStatusRequest(), timeout=30)
    rejects = ", ".join(f"{k}={v}" for k, v in sorted(s.rejects.items())) or "none"
    _print(args, s, f"batches {s.batches}, reports {s.reports}, releases {s.releases}, rejects: {rejects}")
    return 0
