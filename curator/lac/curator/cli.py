"""``lac curator serve|release|releases|top|status``."""

from __future__ import annotations

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

    r = client_parser("release", "release the n-gram distribution of all stored reports (BayesianDP); "
                      "with --counts, run offline on files instead (see lac.curator.offline)", _release)
    r.add_argument("--epsilon", type=float, required=True, help="ε of this release")
    r.add_argument("--delta", type=float, required=True, help="δ of this release")
    r.add_argument("--S", dest="s", type=float, default=0.0, help="decay slope S (default: library default)")
    r.add_argument("--C", dest="c", type=int, default=0, help="per-item count clamp C (default: library default)")
    r.add_argument("--rho", type=float, default=0.0, help="private/public weight ρ (default: library default)")
    r.add_argument("--sensitivity", choices=["bruteforce", "claim1", "sound"], default="bruteforce",
                   help="γ method; 'sound' (data-independent worst case) needs --W and --n-max")
    r.add_argument("--calibration", choices=["auto", "classic", "analytic"], default="auto")
    off = r.add_argument_group("offline mode (only with --counts; no server is contacted)")
    off.add_argument("--counts", default=None,
                     help="per-user counts: scipy.sparse.save_npz .npz, rows = users, columns = vocabulary")
    off.add_argument("--vocab", default=None,
                     help="vocabulary file, one n-gram per line aligned with the columns "
                          "(default: COUNTS with .npz replaced by .vocab.txt)")
    off.add_argument("--public", default=None,
                     help="public counts: 'item<TAB>count' lines, or an NgramVocabulary .npz")
    off.add_argument("--mechanism", choices=["bayesian", "endtoend", "laplace", "laplace-public", "kanon"],
                     default="bayesian")
    off.add_argument("--W", dest="w", type=int, default=None, help="public cap on items per user")
    off.add_argument("--n-max", dest="n_max", type=int, default=None, help="public cap on the number of users")
    off.add_argument("--K", dest="k", type=int, default=50, help="k-anonymity threshold (mechanism kanon)")
    off.add_argument("--public-sensitivity", choices=["sound", "observed"], default="sound",
                     help="ℓ1 sensitivity of laplace-public: sound (2) or observed (data-dependent)")
    off.add_argument("--out", default=None,
                     help="where to write the released distribution (.npz; default next to COUNTS)")
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
    if args.counts is not None:
        return _release_offline(args)
    req = curator_pb2.ReleaseRequest(mechanism="bayesian", epsilon=args.epsilon, delta=args.delta, s=args.s,
                                     c=args.c, rho=args.rho, sensitivity=args.sensitivity,
                                     calibration=args.calibration)
    record = _stub(args).Release(req, timeout=600)
    _print(args, record, describe(record))
    return 0


def _release_offline(args) -> int:
    from lac.curator.offline import release_offline

    if args.public is None:
        raise SystemExit("lac curator release: --counts needs --public")
    rec = release_offline(args.counts, args.public, args.mechanism, args.epsilon, args.delta, vocab=args.vocab,
                          S=args.s or None, C=args.c or None, rho=args.rho or None, sensitivity=args.sensitivity,
                          calibration=args.calibration, W=args.w, n_max=args.n_max, K=args.k,
                          public_sensitivity=args.public_sensitivity, out=args.out)
    if args.json:
        print(json.dumps(rec, indent=2, ensure_ascii=False))
    else:
        eps = "n/a (not DP)" if rec["epsilon"] is None else f"{rec['epsilon']:g}"
        print(f"offline release ({rec['mechanism']}): (ε, δ) = ({eps}, {rec['delta']:g}); "
              f"{rec['n_users']} users, {rec['vocab_size']} items; written to {rec['out']}\n  {rec['statement']}")
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
