"""``lac curator release|status|budget|deployment|export|query ...``: the curator's client commands, which an
analyst's install (``lac-analyst``) has on its own. Where lac-curator is installed its ``lac curator`` adds the
server's commands (serve, backups) and offline releases to these (``lac.curator.service.cli``).

Each command reaches the curator by ``--server``, ``--ca``, ``--cert``, ``--key``, their environment variables or
a ``--profile`` (``lac.common.profiles``), through ``CuratorClient`` (errors typed by status code).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lac.analyst.client import CuratorClient, new_request_id, read_export
from lac.common import tls
from lac.common.cli import message_json, positive
from lac.common.privacy import ERROR_BAR_LEVEL, ExportedWindows
from lac.common.profiles import add_connection_flags
from lac.common.v1 import curator_pb2, reports_pb2

DEFAULT_SERVER = "127.0.0.1:50052"
Command = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Mechanisms:
    """What ``lac curator release --help`` says of the release mechanisms and their defaults: the curator's
    registry where lac-curator is installed; without it the curator decides (and refuses an unknown name)."""

    names: Sequence[str]
    default: str
    no_epsilon: Sequence[str]  # take no ε
    with_delta: Sequence[str]  # need δ > 0
    pure: Sequence[str]  # pure ε-DP over RPC: δ = 0
    offline_only: Sequence[str]  # NOT differentially private: offline only
    delta: float
    decay_slope: float
    rho: float


def register(subparsers: Any) -> None:
    """Add ``lac curator`` with the client commands only (the analyst's install)."""
    add_client_commands(curator_parser(subparsers))


def curator_parser(subparsers: Any) -> Any:
    """``lac curator``'s subcommand group."""
    p = subparsers.add_parser("curator", help="the analyser: ingest batches, release n-gram statistics with DP")
    return p.add_subparsers(dest="curator_command", metavar="ACTION", required=True)


def add_client_commands(sub: Any, mechanisms: Mechanisms | None = None) -> argparse.ArgumentParser:
    """The commands that call a curator (release, status, budget, deployment, export, query ...) under ``sub``;
    returns the ``release`` parser (lac-curator adds its offline mode)."""

    def client_parser(name: str, helptext: str, func: Command, parent: Any = sub) -> argparse.ArgumentParser:
        q: argparse.ArgumentParser = parent.add_parser(name, help=helptext)
        add_connection_flags(q, "curator", DEFAULT_SERVER)
        q.add_argument("--json", action="store_true", help="print the reply as one JSON object")
        q.set_defaults(func=func)
        return q

    r = client_parser(
        "release",
        "release the n-gram distribution of the stored reports (spends the privacy budget of every window it "
        "covers)" + ("; with --counts, run offline on files instead" if mechanisms else ""),
        release,
    )
    _release_flags(r, mechanisms)
    client_parser("status", "operator: stored batches, reports per window, quarantine, the ledger", _status)
    client_parser("budget", "the privacy budget per accounting window (spent, remaining)", _budget)
    client_parser("deployment", "the local-privacy configuration published to clients", _deployment)
    ex = client_parser(
        "export",
        "exporter: write the privatized reports of closed windows to a Parquet file (one row per report, its "
        "words only, shuffled); needs the operator's grant (export_identities); local DP only, not charged",
        _export,
    )
    ex.add_argument("--window", type=int, default=None, help="the closed accounting window to export")
    ex.add_argument("--first-window", type=int, default=None, help="first window of a range (with --last-window)")
    ex.add_argument("--last-window", type=int, default=None, help="last window of a range (with --first-window)")
    ex.add_argument("--out", required=True, help="the Parquet file to write (atomically)")

    q = sub.add_parser("query", help="queries on existing releases (post-processing: no budget is spent)")
    qsub = q.add_subparsers(dest="query_command", metavar="QUERY", required=True)

    def query_parser(name: str, helptext: str, func: Command, release: bool = True) -> argparse.ArgumentParser:
        qp = client_parser(name, helptext, func, qsub)
        if release:
            qp.add_argument("release_id")
        return qp

    query_parser("releases", "list releases", _releases, release=False)
    qt = query_parser("top", "top-k n-grams (joint within the order)", _top)
    qt.add_argument("-k", type=positive(int), default=20, help="how many n-grams to list (>= 1) [default: 20]")
    qt.add_argument("--order", type=_order, default=0, help="only n-grams of this n (0 = all)")
    qt.add_argument(
        "--no-special",
        dest="exclude_special",
        action="store_true",
        help="leave out n-grams with <unk>, <s> or </s> (the others keep their probabilities)",
    )
    qt.add_argument(
        "--level",
        type=_level,
        default=ERROR_BAR_LEVEL,
        help=f"coverage of each n-gram's interval due to the DP noise, in (0, 1) [default: {ERROR_BAR_LEVEL:g}]",
    )
    qp = query_parser("prob", "probability of n-grams (joint within their order; 0 outside the vocabulary)", _prob)
    qp.add_argument("ngrams", nargs="+", help="n-grams, tokens separated by spaces, e.g. 'the dog'")
    qn = query_parser(
        "next",
        "next-word distribution given a context (conditional from the joint, backing off to shorter contexts)",
        _next,
    )
    qn.add_argument("context", help="preceding words, e.g. 'the dog' ('<s>' = sentence start)")
    qn.add_argument("-k", type=int, default=10)
    qx = query_parser("perplexity", "perplexity of a text under the smoothed back-off model", _perplexity)
    qx.add_argument("text", help="the text, or @FILE to read it from a file")
    qa = query_parser("arpa", "export the release as an ARPA back-off language model", _arpa)
    qa.add_argument("--out", required=True, help="file to write ('-' = standard output)")
    return r


def _release_flags(r: argparse.ArgumentParser, m: Mechanisms | None) -> None:
    """The release's parameters; their defaults are the curator's (a flag not given is not sent)."""
    curators = "the curator's"
    r.add_argument(
        "--epsilon",
        type=float,
        default=None,
        help=f"ε of this release (not for {', '.join(m.no_epsilon)})" if m else "ε of this release",
    )
    r.add_argument(
        "--delta",
        type=float,
        default=None,
        help=(
            f"δ of this release ({', '.join(m.with_delta)}; > 0) [default: {m.delta:g}]; {' and '.join(m.pure)} are "
            "pure ε-DP: δ = 0"
            if m
            else f"δ of this release (> 0; 0 for the pure ε-DP mechanisms) [default: {curators}]"
        ),
    )
    r.add_argument(
        "--mechanism",
        choices=list(m.names) if m else None,
        default=m.default if m else None,
        help=(
            f"{', '.join(m.offline_only)} is NOT differentially private and runs offline only (--counts)"
            if m
            else f"the release mechanism, e.g. posterior or laplace [default: {curators}; an unknown one is refused]"
        ),
    )
    r.add_argument(
        "--decay-slope",
        dest="s",
        type=float,
        default=None,
        help=f"BayesianDP's decay slope S [default: {f'{m.decay_slope:g}' if m else curators}]",
    )
    r.add_argument(
        "--rho", type=float, default=None, help=f"private/public weight ρ [default: {f'{m.rho:g}' if m else curators}]"
    )
    r.add_argument(
        "--sensitivity",
        choices=["sound", "bruteforce", "claim1"],
        default=None,
        help="γ method: 'sound' (default; data-independent worst case from the public caps) or the "
        "paper's data-dependent 'bruteforce'/'claim1' (NOT differentially private; over RPC only "
        "if the curator allows data-dependent releases)",
    )
    r.add_argument("--calibration", choices=["auto", "classic", "analytic"], default=None)
    r.add_argument(
        "--public-sensitivity",
        choices=["sound", "observed"],
        default=None,
        help="ℓ1 sensitivity of laplace-public: sound (2) or observed (data-dependent, NOT DP)",
    )
    r.add_argument(
        "--first-window", type=int, default=None, help="first accounting window covered (with --last-window)"
    )
    r.add_argument("--last-window", type=int, default=None, help="last accounting window covered (default: all)")
    r.add_argument(
        "--no-discovery",
        action="store_true",
        help="posterior: release the public vocabulary only (no DP discovery of other n-grams"
        + ("; always so with --counts, whose matrix holds no other n-gram)" if m else ")"),
    )
    r.add_argument(
        "--dry-run",
        action="store_true",
        help="predict the release's noise and utility from public information and spend nothing",
    )
    r.add_argument(
        "--force",
        action="store_true",
        help="release even if the accuracy check predicts that the noise would swamp the signal",
    )
    r.add_argument(
        "--request-id",
        default=None,
        metavar="ID",
        help="id of this release request (1..128 characters; default: a fresh random one). The "
        "request is resent with it after UNAVAILABLE or a timeout, and running the command again "
        "with the same id returns the release already made instead of spending twice",
    )
    r.add_argument(
        "--expected-reports",
        type=int,
        default=None,
        metavar="N",
        help="number of reports the preview and the accuracy check assume (default: the curator's DP "
        "count for an analyst, charged once; the exact count for an operator)",
    )


def _client(args: argparse.Namespace) -> CuratorClient:
    """The analyst's client of the curator service (errors typed by status code), over mTLS (--ca/--cert/--key)
    or, for demos, --insecure."""
    try:
        channel_tls = tls.client_tls_from_args(args, "lac curator")
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    return CuratorClient.with_tls(args.server, channel_tls)


def _print(args: argparse.Namespace, message: Any, text: str) -> None:
    """``text``, or with ``--json`` the reply (``lac.common.cli.message_json``: 64-bit integers as numbers)."""
    print(message_json(message) if args.json else text)


def describe(r: curator_pb2.ReleaseRecord) -> str:
    """A release record as ``lac curator release`` and ``query releases`` print it."""
    dp = "" if r.differentially_private else "  NOT DIFFERENTIALLY PRIVATE (no budget spent)\n"
    noise = f"γ = {r.gamma:.6g}; σ = {r.sigma:.6g}; " if r.gamma or r.sigma else ""
    count = f"{r.n_reports} reports, " if r.n_reports else ""
    return (
        f"release {r.release_id} ({r.created_at})\n{dp}"
        f"  mechanism {r.mechanism}, sensitivity {r.sensitivity_method}"
        f"{' (data-dependent)' if r.data_dependent else ''}, calibration {r.calibration or '-'}\n"
        f"  (ε, δ) = ({r.epsilon:g}, {r.delta:g}); {noise}spent ({r.ledger_epsilon:g}, {r.ledger_delta:g}) "
        f"from each of windows {r.first_window}..{r.last_window}\n"
        f"  {count}{r.vocab_size} n-grams (n ≤ {r.max_n}); privacy unit: {r.privacy_unit}\n"
        f"  {r.statement}"
    )


def release(args: argparse.Namespace) -> int:
    """``lac curator release`` against a curator (or its preview, with ``--dry-run``)."""
    if args.epsilon is None:
        raise SystemExit("lac curator release: --epsilon is required")
    if (args.first_window is None) != (args.last_window is None):
        raise SystemExit("lac curator release: give both --first-window and --last-window, or neither")
    req = curator_pb2.ReleaseRequest(
        mechanism=args.mechanism or "",
        epsilon=args.epsilon,
        s=args.s or 0.0,
        rho=args.rho or 0.0,
        sensitivity=args.sensitivity or "",
        calibration=args.calibration or "",
        public_sensitivity=args.public_sensitivity or "",
    )
    if args.delta is not None:  # --delta 0 is δ = 0 (pure ε-DP mechanisms only), not the default
        req.delta = args.delta
    if args.first_window is not None:
        req.first_window, req.last_window = args.first_window, args.last_window
    if args.no_discovery:
        req.discovery = False
    if args.expected_reports is not None:
        if args.expected_reports < 1:
            raise SystemExit("lac curator release: --expected-reports must be >= 1")
        req.expected_reports = args.expected_reports
    req.force = args.force
    if args.dry_run:
        preview = _client(args).call("PreviewRelease", req, timeout=60)
        _print(args, preview, f"dry run (nothing spent): {preview.statement}")
        return 0
    req.request_id = args.request_id or new_request_id()
    record = _client(args).send_release(req, timeout=600)
    _print(args, record, describe(record))
    return 0


def _releases(args: argparse.Namespace) -> int:
    reply = _client(args).call("ListReleases", curator_pb2.ListReleasesRequest(), timeout=30)
    _print(args, reply, "\n".join(describe(r) for r in reply.releases) or "no releases")
    return 0


def _order(text: str) -> int:
    """An argparse ``type``: an n-gram order, 0 (any) or n >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be 0 (any order) or an n >= 1, got {text!r}")
    return value


def _level(text: str) -> float:
    """An argparse ``type``: an interval's coverage, in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), e.g. 0.9, got {text!r}")
    return value


def _top(args: argparse.Namespace) -> int:
    request = curator_pb2.TopNgramsRequest(
        release_id=args.release_id,
        k=min(args.k, 2**32 - 1),
        order=args.order,
        exclude_special=args.exclude_special,
        level=args.level,
    )
    reply = _client(args).call("TopNgrams", request, timeout=30)
    header = f"{'probability':>11}  {'sd':>10}  {f'{reply.level:.0%} interval':^23}  n-gram"
    rows = []
    for g in reply.ngrams:
        bar = (
            f"{g.noise_sd:10.6f}  [{g.noise_low:9.6f}, {g.noise_high:9.6f}]"
            if g.HasField("noise_sd")
            else f"{'-':>10}  {'-':^23}"
        )
        rows.append(f"{g.probability:11.6f}  {bar}  {g.ngram}")
    footer = reply.error_bars or "Error bars: none (a release made before releases had them)."
    _print(args, reply, "\n".join([header, *rows, footer]))
    return 0


def _windows(ws: Sequence[Any]) -> str:
    return (
        "\n".join(
            f"  window {w.window}: spent ({w.spent_epsilon:g}, {w.spent_delta:g}), remaining "
            f"({w.remaining_epsilon:g}, {w.remaining_delta:g})"
            + (
                f"; exported {w.exports}x (not charged): the remaining budget bounds central releases only"
                if w.exports
                else ""
            )
            for w in ws
        )
        or "  no windows yet"
    )


def _status(args: argparse.Namespace) -> int:
    s = _client(args).call("GetStatus", curator_pb2.CuratorStatusRequest(), timeout=30)
    rejects = ", ".join(f"{k}={v}" for k, v in sorted(s.rejects.items())) or "none"
    by_window = ", ".join(f"{w}: {n}" for w, n in sorted(s.reports_by_window.items())) or "none"
    _print(
        args,
        s,
        f"batches {s.batches}, reports {s.reports} (by window: {by_window}), releases {s.releases}, "
        f"quarantined {s.quarantined}, rejects: {rejects}\n"
        f"privacy budget per window (ε, δ) = ({s.budget_epsilon:g}, {s.budget_delta:g}):\n"
        f"{_windows(s.windows)}\nreplay window {s.replay_window_days:g} days",
    )
    return 0


def _exports(exports: Sequence[Any]) -> str:
    """The ledger's exports of privatized reports (listed, never charged), or nothing when there are none."""
    if not exports:
        return ""
    lines = [
        f"  {e.exported_at}: {e.identity or '(no identity: insecure curator)'} exported windows "
        f"{e.first_window}..{e.last_window}, "
        + (f"{e.rows} rows" if e.HasField("rows") else "rows shown to operators and the exporter only")
        + f" (export {e.export_id})"
        for e in exports
    ]
    return "\nexports of privatized reports (local DP only, not charged):\n" + "\n".join(lines)


def _budget(args: argparse.Namespace) -> int:
    b = _client(args).call("GetBudget", curator_pb2.BudgetRequest(), timeout=30)
    exported = ExportedWindows.of(w.window for w in b.windows if w.exports)
    _print(
        args,
        b,
        f"privacy budget per accounting window of {b.window_seconds:g} s (ε, δ) = "
        f"({b.budget_epsilon:g}, {b.budget_delta:g}); privacy unit: one client over a window, at most "
        f"{b.reports_per_window} report(s) per window\n{_windows(b.windows)}"
        + _exports(b.exports)
        + ("" if exported is None else "\n" + exported.budget_note()),
    )
    return 0


def _export(args: argparse.Namespace) -> int:
    if args.window is not None and (args.first_window is not None or args.last_window is not None):
        raise SystemExit("lac curator export: give --window, or --first-window and --last-window, not both")
    if args.window is not None:
        first = last = args.window
    elif args.first_window is not None and args.last_window is not None:
        first, last = args.first_window, args.last_window
    else:
        raise SystemExit("lac curator export: give --window W, or --first-window A and --last-window B")
    request = curator_pb2.ExportReportsRequest(first_window=first, last_window=last)
    got = read_export(_client(args).stream("ExportReports", request, timeout=3600), args.out)
    if args.json:
        print(
            json.dumps({"out": str(got.path), "export_id": got.export_id, "rows": got.rows, **got.guarantee.to_dict()})
        )
    else:
        print(f"wrote {got.path}: {got.rows} privatized reports (export {got.export_id})\n{got.statement}")
    return 0


def _deployment(args: argparse.Namespace) -> int:
    from lac.common.serde import deployment_from_proto

    m = _client(args).call("GetDeployment", reports_pb2.DeploymentRequest(), timeout=30)
    served_by = f"\nserved by {m.server_version}" if m.server_version else ""  # empty from older curators
    keys = f"\nreports are sealed to key id {', '.join(m.key_ids)}" if m.key_ids else ""
    d = deployment_from_proto(m)
    rule = f"\nreports are made at ε per word {d.epsilon_rule()}"
    _print(args, m, d.report_guarantee().statement() + rule + keys + served_by)
    return 0


def _prob(args: argparse.Namespace) -> int:
    reply = _client(args).call(
        "NgramProbabilities",
        curator_pb2.NgramProbabilitiesRequest(release_id=args.release_id, ngrams=args.ngrams),
        timeout=60,
    )
    _print(args, reply, "\n".join(f"{g.probability:.6g}\t{g.ngram}" for g in reply.ngrams))
    return 0


def _next(args: argparse.Namespace) -> int:
    reply = _client(args).call(
        "NextWord", curator_pb2.NextWordRequest(release_id=args.release_id, context=args.context, k=args.k), timeout=60
    )
    _print(
        args,
        reply,
        f"context used: {reply.context_used or '(none: unigrams)'}\n"
        + "\n".join(f"{w.probability:10.6f}  {w.ngram}" for w in reply.words),
    )
    return 0


def _perplexity(args: argparse.Namespace) -> int:
    text = args.text
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    reply = _client(args).call(
        "Perplexity", curator_pb2.PerplexityRequest(release_id=args.release_id, text=text), timeout=600
    )
    _print(
        args,
        reply,
        f"perplexity {reply.perplexity:.6g} over {reply.n_tokens} tokens in {reply.n_sentences} "
        f"sentences ({reply.n_out_of_vocabulary} out of vocabulary)",
    )
    return 0


def _arpa(args: argparse.Namespace) -> int:
    from lac.common.files import atomic_file

    chunks = _client(args).stream("ExportArpa", curator_pb2.ExportArpaRequest(release_id=args.release_id), timeout=600)
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
