"""``lac curator serve|channel build|release|status|budget|deployment|export|query|backup|restore ...``."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from lac.analyst.client import CuratorClient, new_request_id, read_export
from lac.common import config as cfg
from lac.common import tls, tracing
from lac.common.cli import message_json, positive
from lac.common.v1 import curator_pb2, reports_pb2
from lac.curator import mechanisms
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.release.core import PublicCaps
from lac.curator.service.config import ENV_PREFIX, CuratorConfig


def register(subparsers) -> None:
    p = subparsers.add_parser("curator", help="the analyser: ingest batches, release n-gram statistics with DP")
    sub = p.add_subparsers(dest="curator_command", metavar="ACTION", required=True)
    serve = sub.add_parser("serve", help="run the curator gRPC server")
    cfg.add_flags(serve, CuratorConfig, ENV_PREFIX)
    serve.set_defaults(func=_serve)

    chan = sub.add_parser("channel", help="the deployment's local channel (what the default release deconvolves with)")
    build = chan.add_subparsers(dest="channel_command", metavar="ACTION", required=True).add_parser(
        "build",
        help="sample the local channel ahead of time into channel_cache_dir (every curator pointed at it reuses it)",
        description="Sample the deployment's local channel and build its n-gram products into channel_cache_dir "
        "(default: state_dir/prior), exactly as `lac curator serve` with the same settings would at its start, "
        "printing the progress. A curator (or every replica) pointed at that directory then reads it and never "
        "samples: its first release does not wait. Public data only. Takes the settings of `serve`; those that "
        "matter are the public corpus and vocabulary, the embedding, the local mechanism, ε per word and "
        "channel_cache_dir.",
    )
    cfg.add_flags(build, CuratorConfig, ENV_PREFIX)
    build.set_defaults(func=_build_channel)

    mig = sub.add_parser(
        "migrate-segments",
        help="convert the .npz segments of earlier versions to Parquet (run with the curator stopped)",
    )
    mig.add_argument(
        "--state-dir",
        type=Path,
        default=CuratorConfig.state_dir,
        help=f"the curator's state directory [default: {CuratorConfig.state_dir}]",
    )
    mig.set_defaults(func=_migrate_segments)

    bak = sub.add_parser(
        "backup",
        help="copy the curator's database, segments and release files (online, consistent) into DIR",
        description="Copy the curator's database with SQLite's online backup API (one consistent "
        "snapshot, while the curator keeps serving) and the segment and release files "
        "it names into DIR, with a manifest naming every file's SHA-256. DIR is "
        "created private (0700). The key ring is not copied: back it up separately.",
    )
    bak.add_argument("dir", type=Path, help="new directory for the backup")
    res = sub.add_parser(
        "restore",
        help="install a backup made with `backup` as a state directory",
        description="Verify a backup (manifest, SHA-256, quick_check) and install it into "
        "--state-dir, whose curator must be stopped (refused while one holds its lock). "
        "The restored state does not know what happened after the backup: batches ingested since are missing (a "
        "shuffler still holding them delivers them again), and so are the records of releases made since. Their "
        "privacy spending is kept: the state directory's ledger journal (ledger.journal), which restore does not "
        "replace, puts it back into the ledger at the next start.",
    )
    res.add_argument("dir", type=Path, help="directory written by `lac curator backup`")
    res.add_argument(
        "--carry-journal",
        type=Path,
        metavar="FILE",
        help="also keep the charges of this ledger journal (the old state directory's ledger.journal, when "
        "restoring on another machine), so budget spent after the backup stays spent",
    )
    res.add_argument(
        "--force", action="store_true", help="replace an existing curator database (not while a curator runs on it)"
    )
    for q in (bak, res):
        q.add_argument(
            "--state-dir",
            type=Path,
            default=CuratorConfig.state_dir,
            help=f"the curator's state directory [default: {CuratorConfig.state_dir}]",
        )
    bak.set_defaults(func=_backup)
    res.set_defaults(func=_restore)

    def client_parser(name, helptext, func):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("--server", default="127.0.0.1:50052", help="curator address host:port")
        q.add_argument("--json", action="store_true", help="print JSON")
        tls.add_client_flags(q)
        q.set_defaults(func=func)
        return q

    r = client_parser(
        "release",
        "release the n-gram distribution of the stored reports (spends the privacy "
        "budget of every window it covers); with --counts, run offline on files instead",
        _release,
    )
    no_epsilon = [n for n in mechanisms.names() if not mechanisms.get(n).takes_epsilon]
    with_delta = [n for n in mechanisms.names() if mechanisms.get(n).with_delta]
    pure = [n for n in mechanisms.over_rpc() if not mechanisms.get(n).with_delta]
    r.add_argument("--epsilon", type=float, default=None, help=f"ε of this release (not for {', '.join(no_epsilon)})")
    r.add_argument(
        "--delta",
        type=float,
        default=None,
        help=f"δ of this release ({', '.join(with_delta)}; > 0) [default: {ReleaseSpec.delta:g}]; "
        f"{' and '.join(pure)} are pure ε-DP: δ = 0",
    )
    r.add_argument(
        "--mechanism",
        choices=mechanisms.names(),
        default=ReleaseSpec.mechanism,
        help=f"{', '.join(mechanisms.offline_only())} is NOT differentially private and runs offline only (--counts)",
    )
    r.add_argument(
        "--decay-slope",
        dest="s",
        type=float,
        default=None,
        help=f"BayesianDP's decay slope S [default: {ReleaseSpec.S:g}]",
    )
    r.add_argument("--rho", type=float, default=None, help=f"private/public weight ρ [default: {ReleaseSpec.rho:g}]")
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
        help="posterior: release the public vocabulary only (no DP discovery of other n-grams; "
        "always so with --counts, whose matrix holds no other n-gram)",
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
    off = r.add_argument_group("offline mode (only with --counts; no server is contacted)")
    off.add_argument(
        "--counts",
        default=None,
        help="per-report counts: scipy.sparse.save_npz .npz, rows = reports, columns = vocabulary",
    )
    off.add_argument(
        "--vocab",
        default=None,
        help="vocabulary file, one n-gram per line aligned with the columns "
        "(default: COUNTS with .npz replaced by .vocab.txt)",
    )
    off.add_argument("--public", default=None, help="public counts: 'item<TAB>count' lines, or an NgramVocabulary .npz")
    off.add_argument(
        "--max-items-per-report", dest="w", type=int, default=PublicCaps.W, help="W: public cap on items per report"
    )
    off.add_argument("--item-clamp", dest="c", type=int, default=PublicCaps.C, help="C: per-report, per-item clamp")
    off.add_argument(
        "--count-clip",
        type=int,
        default=PublicCaps.count_clip,
        help="item totals are clipped here before BayesianDP's log",
    )
    off.add_argument(
        "--reports-per-user",
        type=int,
        default=1,
        help="most reports (rows) one user contributes; the sensitivity covers all of them",
    )
    off.add_argument(
        "--k-anonymity", dest="k", type=int, default=ReleaseSpec.K, help="K: k-anonymity threshold (kanon)"
    )
    off.add_argument(
        "--out", default=None, help="where to write the released distribution (.npz; default next to COUNTS)"
    )
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
    qt.add_argument("-k", type=positive(int), default=20, help="how many n-grams to list (>= 1) [default: 20]")
    qt.add_argument("--order", type=_order, default=0, help="only n-grams of this n (0 = all)")
    qt.add_argument(
        "--no-special",
        dest="exclude_special",
        action="store_true",
        help="leave out n-grams with <unk>, <s> or </s> (the others keep their probabilities)",
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


def _serve(args) -> int:
    from lac.common.logs import configure as configure_logging
    from lac.common.server import PortUnavailable, run_until_signalled
    from lac.common.statelock import StateDirLocked
    from lac.curator.base.prior import public_vocabulary
    from lac.curator.service.server import create_server
    from lac.curator.service.service import Curator

    config = cfg.from_args(CuratorConfig, ENV_PREFIX, args)
    if config.key_dir is None and not (config.insecure or config.allow_plaintext_payloads):
        raise SystemExit(  # it could open no sealed report: every one would be quarantined
            "error: no key ring (--key-dir): this curator could open no report sealed to it and would quarantine "
            "every one; create one with `lac keys curator --dir DIR` and pass --key-dir DIR"
        )
    configure_logging(config.log_format, getattr(args, "verbose", False))
    tracing.configure_service(config, "curator")
    vocab = public_vocabulary(
        config.public_corpus, config.max_n, config.vocab_min_count, config.vocab_max_items, config.state_dir / "prior"
    )

    async def main():
        curator = Curator(config, vocab)
        server, port = create_server(curator)
        curator.start()
        await run_until_signalled(server, port, config.port_file, "curator", on_stop=curator.stop)

    try:
        asyncio.run(main())
    except (PortUnavailable, StateDirLocked) as exc:  # another server has the port or the state directory
        raise SystemExit(f"error: {exc}") from None
    return 0


def _build_channel(args) -> int:
    import time

    from lac.curator.base.prior import public_vocabulary
    from lac.curator.service.channel import ChannelProgress, load_channel

    config = cfg.from_args(CuratorConfig, ENV_PREFIX, args)
    vocab = public_vocabulary(
        config.public_corpus, config.max_n, config.vocab_min_count, config.vocab_max_items, config.state_dir / "prior"
    )
    progress = ChannelProgress()
    shown = [0.0]

    def update(done: int, total: int) -> None:
        progress.update(done, total)
        if time.monotonic() - shown[0] >= 5 or done >= total:
            shown[0] = time.monotonic()
            print(progress.describe().replace("the curator is ", ""), flush=True)

    try:
        channel = load_channel(config, vocab, update)
    except ImportError as exc:
        raise SystemExit(f"error: the local channel needs lac-client and lac-curator[channel] ({exc})") from None
    except (LookupError, ValueError, OSError) as exc:
        raise SystemExit(f"error: no local channel for this deployment: {exc}") from None
    how = "sampled" if progress.sampled else "already built there (nothing sampled)"
    print(
        f"local channel in {config.channel_dir}: {how}, ready after {time.monotonic() - progress.started:.1f} s "
        f"({channel.word.deployment_key}; {channel.word.describe()}); a curator with --channel-cache-dir "
        f"{config.channel_dir} (and the same deployment) reads it at its start"
    )
    return 0


def _migrate_segments(args) -> int:
    from lac.common.statelock import StateDirLock, StateDirLocked
    from lac.curator.store.store import CuratorStore

    if not (args.state_dir / "curator.sqlite").is_file():
        raise SystemExit(f"error: {args.state_dir} holds no curator store (curator.sqlite); check --state-dir")
    try:
        lock = StateDirLock(args.state_dir, "lac curator migrate-segments")
    except StateDirLocked as exc:
        raise SystemExit(f"error: {exc}") from None
    with lock:
        store = CuratorStore(args.state_dir)
        try:
            n = store.migrate_npz()
        finally:
            store.close()
    print(f"migrated {n} segment(s) in {args.state_dir} to Parquet")
    return 0


def _backup(args) -> int:
    from lac.curator.service.backup import backup

    try:
        m = backup(args.state_dir, args.dir)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    print(
        f"backed up {m['source']} to {args.dir}: {m['batches']} batches ({m['reports']} reports), "
        f"{m['releases']} releases, {m['ledger_rows']} ledger rows, {len(m['files'])} files"
    )
    return 0


def _restore(args) -> int:
    from lac.curator.service.backup import restore

    try:
        m = restore(args.dir, args.state_dir, force=args.force, carry_journal=args.carry_journal)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    kept = m["kept_charges"]
    if kept:
        ledger = f"the ledger journal keeps the {kept} charge(s) made after it (budget stays spent)."
    elif args.carry_journal:
        ledger = "the ledger journal holds no charge made after it."
    else:
        ledger = (
            "the ledger journal holds no charge made after it. Restoring on another machine? Pass the old "
            "state directory's ledger.journal with --carry-journal, or budget spent after the backup is handed back."
        )
    print(
        f"restored the backup of {m['source']} into {args.state_dir}: {m['batches']} batches, {m['releases']} "
        f"releases. Batches and releases made after the backup are not in it; {ledger}"
    )
    return 0


def _client(args) -> CuratorClient:
    """The analyst's client of the curator service (``lac.analyst``: its errors typed by status code), over mTLS
    (--ca/--cert/--key) or, for demos, --insecure."""
    try:
        channel_tls = tls.client_tls_from_args(args, "lac curator")
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    return CuratorClient.with_tls(args.server, channel_tls)


def _print(args, message, text: str) -> None:
    """``text``, or with ``--json`` the reply (``lac.common.cli.message_json``: 64-bit integers as numbers)."""
    print(message_json(message) if args.json else text)


def describe(r: curator_pb2.ReleaseRecord) -> str:
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


def _release(args) -> int:
    if args.counts is not None:
        return _release_offline(args)
    if not mechanisms.get(args.mechanism).over_rpc:
        raise SystemExit(
            f"lac curator release: {args.mechanism} is NOT differentially private and runs offline only (--counts)"
        )
    if args.epsilon is None:
        raise SystemExit("lac curator release: --epsilon is required")
    if (args.first_window is None) != (args.last_window is None):
        raise SystemExit("lac curator release: give both --first-window and --last-window, or neither")
    req = curator_pb2.ReleaseRequest(
        mechanism=args.mechanism,
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


def _release_offline(args) -> int:
    from lac.curator.runner.offline import preview_offline, release_offline

    if args.public is None:
        raise SystemExit("lac curator release: --counts needs --public")
    if args.epsilon is None and mechanisms.get(args.mechanism).takes_epsilon:
        raise SystemExit("lac curator release: --epsilon is required")
    if args.expected_reports is not None and args.expected_reports < 1:
        raise SystemExit("lac curator release: --expected-reports must be >= 1")
    given = {
        k: v
        for k, v in dict(
            delta=args.delta,
            S=args.s,
            rho=args.rho,
            sensitivity=args.sensitivity,
            calibration=args.calibration,
            public_sensitivity=args.public_sensitivity,
            expected_reports=args.expected_reports,
        ).items()
        if v is not None
    }
    files = dict(reports_per_user=args.reports_per_user, vocab=args.vocab)
    try:
        # offline the posterior never runs discovery (offline_spec), so --no-discovery holds either way
        spec = ReleaseSpec(
            epsilon=args.epsilon or 1.0, mechanism=args.mechanism, K=args.k, discovery=False, force=args.force, **given
        )
        caps = PublicCaps(W=args.w, C=args.c, count_clip=args.count_clip)
        if args.dry_run:
            preview = preview_offline(args.counts, args.public, spec, caps, **files)
            text = preview.statement() if preview is not None else "data-dependent: nothing to predict"
            print(json.dumps({"statement": text}) if args.json else f"dry run (nothing released): {text}")
            return 0
        rec = release_offline(args.counts, args.public, spec, caps, out=args.out, **files)
    except (ValueError, OSError, ArithmeticError) as exc:
        raise SystemExit(f"lac curator release: {exc}") from None
    if args.json:
        print(json.dumps(rec, indent=2, ensure_ascii=False))
    else:
        eps = "n/a (not DP)" if rec["epsilon"] is None else f"{rec['epsilon']:g}"
        print(
            f"offline release ({rec['mechanism']}): (ε, δ) = ({eps}, {rec['delta']:g}); "
            f"{rec['n_users']} reports, {rec['vocab_size']} items; written to {rec['out']}\n  {rec['statement']}"
        )
    return 0


def _releases(args) -> int:
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


def _top(args) -> int:
    request = curator_pb2.TopNgramsRequest(
        release_id=args.release_id, k=min(args.k, 2**32 - 1), order=args.order, exclude_special=args.exclude_special
    )
    reply = _client(args).call("TopNgrams", request, timeout=30)
    _print(args, reply, "\n".join(f"{g.probability:10.6f}  {g.ngram}" for g in reply.ngrams))
    return 0


def _windows(ws) -> str:
    return (
        "\n".join(
            f"  window {w.window}: spent ({w.spent_epsilon:g}, {w.spent_delta:g}), remaining "
            f"({w.remaining_epsilon:g}, {w.remaining_delta:g})"
            + (f"; exported {w.exports}x (not charged)" if w.exports else "")
            for w in ws
        )
        or "  no windows yet"
    )


def _status(args) -> int:
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


def _exports(exports) -> str:
    """The ledger's exports of privatized reports (listed, never charged), or nothing when there are none."""
    if not exports:
        return ""
    lines = [
        f"  {e.exported_at}: {e.identity or '(no identity: insecure curator)'} exported windows "
        f"{e.first_window}..{e.last_window}, {e.rows} rows (export {e.export_id})"
        for e in exports
    ]
    return "\nexports of privatized reports (local DP only, not charged):\n" + "\n".join(lines)


def _budget(args) -> int:
    b = _client(args).call("GetBudget", curator_pb2.BudgetRequest(), timeout=30)
    _print(
        args,
        b,
        f"privacy budget per accounting window of {b.window_seconds:g} s (ε, δ) = "
        f"({b.budget_epsilon:g}, {b.budget_delta:g}); privacy unit: one client over a window, at most "
        f"{b.reports_per_window} report(s) per window\n{_windows(b.windows)}" + _exports(b.exports),
    )
    return 0


def _export(args) -> int:
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


def _deployment(args) -> int:
    from lac.common.serde import deployment_from_proto

    m = _client(args).call("GetDeployment", reports_pb2.DeploymentRequest(), timeout=30)
    served_by = f"\nserved by {m.server_version}" if m.server_version else ""  # empty from older curators
    keys = f"\nreports are sealed to key id {', '.join(m.key_ids)}" if m.key_ids else ""
    _print(args, m, deployment_from_proto(m).report_guarantee().statement() + keys + served_by)
    return 0


def _prob(args) -> int:
    reply = _client(args).call(
        "NgramProbabilities",
        curator_pb2.NgramProbabilitiesRequest(release_id=args.release_id, ngrams=args.ngrams),
        timeout=60,
    )
    _print(args, reply, "\n".join(f"{g.probability:.6g}\t{g.ngram}" for g in reply.ngrams))
    return 0


def _next(args) -> int:
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


def _perplexity(args) -> int:
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


def _arpa(args) -> int:
    import sys

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
