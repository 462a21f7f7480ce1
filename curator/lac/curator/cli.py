"""``lac curator serve|release|releases|top|status|query ...``."""

from __future__ import annotations

import asyncio
import json

from google.protobuf.json_format import MessageToDict

from lac.common import config as cfg
from lac.common import tls
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
        tls.add_client_flags(q)
        q.set_defaults(func=func)
        return q

    r = client_parser("release", "release the n-gram distribution of all stored reports (spends the privacy "
                      "budget); with --counts, run offline on files instead (see lac.curator.offline)", _release)
    r.add_argument("--epsilon", type=float, default=None, help="ε of this release (not for kanon)")
    r.add_argument("--delta", type=float, default=0.0, help="δ of this release (bayesian, endtoend)")
    r.add_argument("--mechanism", choices=["bayesian", "endtoend", "laplace", "laplace-public", "kanon"],
                   default="bayesian", help="kanon is NOT differentially private (over RPC only if the "
                                            "curator allows non-DP releases; it spends no budget)")
    r.add_argument("--S", dest="s", type=float, default=0.0, help="decay slope S (default: library default)")
    r.add_argument("--C", dest="c", type=int, default=0, help="per-item count clamp C (default: library default)")
    r.add_argument("--rho", type=float, default=0.0, help="private/public weight ρ (default: library default)")
    r.add_argument("--sensitivity", choices=["bruteforce", "claim1", "sound"], default="bruteforce",
                   help="γ method; 'sound' (data-independent worst case) needs W and n_max (over RPC: W and "
                        "n_max from the curator's config, or --n-max)")
    r.add_argument("--calibration", choices=["auto", "classic", "analytic"], default="auto")
    r.add_argument("--n-max", dest="n_max", type=int, default=None, help="public cap on the number of users")
    r.add_argument("--K", dest="k", type=int, default=50, help="k-anonymity threshold (mechanism kanon)")
    r.add_argument("--public-sensitivity", choices=["sound", "observed"], default="sound",
                   help="ℓ1 sensitivity of laplace-public: sound (2) or observed (data-dependent)")
    off = r.add_argument_group("offline mode (only with --counts; no server is contacted)")
    off.add_argument("--counts", default=None,
                     help="per-user counts: scipy.sparse.save_npz .npz, rows = users, columns = vocabulary")
    off.add_argument("--vocab", default=None,
                     help="vocabulary file, one n-gram per line aligned with the columns "
                          "(default: COUNTS with .npz replaced by .vocab.txt)")
    off.add_argument("--public", default=None,
                     help="public counts: 'item<TAB>count' lines, or an NgramVocabulary .npz")
    off.add_argument("--W", dest="w", type=int, default=None, help="public cap on items per user")
    off.add_argument("--out", default=None,
                     help="where to write the released distribution (.npz; default next to COUNTS)")
    client_parser("releases", "list releases (same as `query releases`)", _releases)
    t = client_parser("top", "top n-grams of a release (same as `query top`)", _top)
    t.add_argument("release_id")
    t.add_argument("-k", type=int, default=20)
    t.add_argument("--order", type=int, default=0, help="only n-grams of this n (0 = all)")
    client_parser("status", "stored batches, reports, quarantine, privacy budget", _status)

    q = sub.add_parser("query", help="queries on existing releases (post-processing: no budget is spent)")
    qsub = q.add_subparsers(dest="query_command", metavar="QUERY", required=True)

    def query_parser(name, helptext, func, release=True):
        qp = qsub.add_parser(name, help=helptext)
        qp.add_argument("--server", default="127.0.0.1:50052", help="curator address host:port")
        qp.add_argument("--json", action="store_true", help="print JSON")
        tls.add_client_flags(qp)
        if release:
            qp.add_argument("release_id")
        qp.set_defaults(func=func)
        return qp

    query_parser("releases", "list releases", _releases, release=False)
    qt = query_parser("top", "top-k n-grams (joint within the order)", _top)
    qt.add_argument("-k", type=int, default=20)
    qt.add_argument("--order", type=int, default=0, help="only n-grams of this n (0 = all)")
    qp = query_parser("prob", "probability of n-grams (joint within their order; 0 outside the vocabulary)", _prob)
    qp.add_argument("ngrams", nargs="+", help="n-grams, tokens separated by spaces, e.g. 'the dog'")
    qn = query_parser("next", "next-word distribution given a context (conditional from the joint, backing "
                              "off to shorter contexts)", _next)
    qn.add_argument("context", help="preceding words, e.g. 'the dog' ('<s>' = sentence start)")
    qn.add_argument("-k", type=int, default=10)
    qx = query_parser("perplexity", "perplexity of a text under the smoothed back-off model", _perplexity)
    qx.add_argument("text", help="the text, or @FILE to read it from a file")
    qa = query_parser("arpa", "export the release as an ARPA back-off language model", _arpa)
    qa.add_argument("--out", required=True, help="file to write ('-' = standard output)")


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
    """The query service, over mTLS (--ca/--cert/--key) or, for demos, --insecure."""
    try:
        channel_tls = tls.client_tls_from_args(args, "lac curator")
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    return curator_pb2_grpc.CuratorStub(tls.channel(args.server, channel_tls))


def _print(args, message, text: str) -> None:
    print(json.dumps(MessageToDict(message, preserving_proto_field_name=True), indent=2) if args.json else text)


def describe(r: curator_pb2.ReleaseRecord) -> str:
    dp = "" if r.differentially_private else "  NOT DIFFERENTIALLY PRIVATE (no budget spent)\n"
    return (f"release {r.release_id} ({r.created_at})\n{dp}"
            f"  mechanism {r.mechanism}, sensitivity {r.sensitivity_method}"
            f"{' (data-dependent)' if r.data_dependent else ''}, calibration {r.calibration}\n"
            f"  (ε, δ) = ({r.epsilon:g}, {r.delta:g}); γ = {r.gamma:.6g}; σ = {r.sigma:.6g}; "
            f"ledger spent ({r.ledger_epsilon:g}, {r.ledger_delta:g})\n"
            f"  {r.n_reports} reports, {r.vocab_size} n-grams (n ≤ {r.max_n})\n"
            f"  {r.statement}")


def _release(args) -> int:
    if args.counts is not None:
        return _release_offline(args)
    if args.epsilon is None and args.mechanism != "kanon":
        raise SystemExit("lac curator release: --epsilon is required")
    req = curator_pb2.ReleaseRequest(mechanism=args.mechanism, epsilon=args.epsilon or 0.0, delta=args.delta,
                                     s=args.s, c=args.c, rho=args.rho, sensitivity=args.sensitivity,
                                     calibration=args.calibration, n_max=args.n_max or 0, k=args.k,
                                     public_sensitivity=args.public_sensitivity)
    record = _stub(args).Release(req, timeout=600)
    _print(args, record, describe(record))
    return 0


def _release_offline(args) -> int:
    from lac.curator.offline import release_offline

    if args.public is None:
        raise SystemExit("lac curator release: --counts needs --public")
    if args.epsilon is None and args.mechanism != "kanon":
        raise SystemExit("lac curator release: --epsilon is required")
    rec = release_offline(args.counts, args.public, args.mechanism, args.epsilon or 1.0, args.delta, vocab=args.vocab,
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
    _print(args, s, f"batches {s.batches}, reports {s.reports}, releases {s.releases}, quarantined "
                    f"{s.quarantined}, rejects: {rejects}\n"
                    f"privacy budget (ε, δ) = ({s.budget_epsilon:g}, {s.budget_delta:g}); spent "
                    f"({s.spent_epsilon:g}, {s.spent_delta:g}); remaining ({s.remaining_epsilon:g}, "
                    f"{s.remaining_delta:g})\nreplay window {s.replay_window_days:g} days")
    return 0


def _prob(args) -> int:
    reply = _stub(args).NgramProbabilities(curator_pb2.NgramProbabilitiesRequest(
        release_id=args.release_id, ngrams=args.ngrams), timeout=60)
    _print(args, reply, "\n".join(f"{g.probability:.6g}\t{g.ngram}" for g in reply.ngrams))
    return 0


def _next(args) -> int:
    reply = _stub(args).NextWord(curator_pb2.NextWordRequest(release_id=args.release_id, context=args.context,
                                                             k=args.k), timeout=60)
    _print(args, reply, f"context used: {reply.context_used or '(none: unigrams)'}\n"
                        + "\n".join(f"{w.probability:10.6f}  {w.ngram}" for w in reply.words))
    return 0


def _perplexity(args) -> int:
    text = args.text
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    reply = _stub(args).Perplexity(curator_pb2.PerplexityRequest(release_id=args.release_id, text=text),
                                   timeout=600)
    _print(args, reply, f"perplexity {reply.perplexity:.6g} over {reply.n_tokens} tokens in {reply.n_sentences} "
                        f"sentences ({reply.n_out_of_vocabulary} out of vocabulary)")
    return 0


def _arpa(args) -> int:
    import sys

    from lac.common.files import atomic_file

    chunks = _stub(args).ExportArpa(curator_pb2.ExportArpaRequest(release_id=args.release_id), timeout=600)
    if args.out == "-":
        for c in chunks:
            sys.stdout.write(c.text)
        return 0
    with atomic_file(args.out) as f:
        n = 0
        for c in chunks:
            data = c.text.encode("utf-8")
            f.write(data)
            n += len(data)
    print(json.dumps({"out": args.out, "bytes": n}) if args.json else f"wrote {args.out} ({n} bytes)")
    return 0
