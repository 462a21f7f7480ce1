"""``lac curator serve|channel build|migrate-segments|backup|restore`` and offline releases (``release --counts``), on
top of the client commands of the analyst's distribution (``lac.analyst.cli``: release, status, budget, deployment,
export, query ...), whose ``release --help`` this fills in from the curator's mechanism registry."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from lac.analyst import cli as client_commands
from lac.common import config as cfg
from lac.common import tracing
from lac.curator import mechanisms
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.release.building import PublicCaps
from lac.curator.service.config import ENV_PREFIX, CuratorConfig


def register(subparsers) -> None:
    sub = client_commands.curator_parser(subparsers)
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
        help="convert the .npz segments of earlier versions to Parquet and remove the reports' words that "
        "earlier versions kept in their Parquet segments (run with the curator stopped)",
    )
    mig.set_defaults(func=_migrate_segments)

    to_pg = sub.add_parser(
        "migrate",
        help="copy a stopped curator's SQLite state into an empty PostgreSQL database (then serve with --store URL)",
        description="Copy every row of the curator's SQLite database (batches, report ids of the replay window, "
        "quarantine, releases and their request ids, the ledger, noisy counts, exports, counters, the recorded "
        "privacy unit) into an empty PostgreSQL database, in one transaction that commits only when every table's "
        "row count and checksum read back equal the source's. A target that holds any state is refused. The "
        "curator must be stopped (refused while one holds the state directory). The files stay in --state-dir: "
        "start the curator with --store URL and the same --state-dir. curator.sqlite is kept, marked as copied: a "
        "curator started on it refuses.",
    )
    to_pg.add_argument(
        "--to",
        required=True,
        metavar="URL",
        help="postgresql://USER@HOST:PORT/DB (needs lac-curator[postgresql]; the password from PGPASSWORD or "
        "~/.pgpass)",
    )
    to_pg.set_defaults(func=_migrate)

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
    for q in (mig, to_pg, bak, res):
        q.add_argument(
            "--state-dir",
            type=Path,
            default=CuratorConfig.state_dir,
            help=f"the curator's state directory [default: {CuratorConfig.state_dir}]",
        )
    bak.set_defaults(func=_backup)
    res.set_defaults(func=_restore)

    r = client_commands.add_client_commands(
        sub,
        client_commands.Mechanisms(
            names=mechanisms.names(),
            default=ReleaseSpec.mechanism,
            no_epsilon=[n for n in mechanisms.names() if not mechanisms.get(n).takes_epsilon],
            with_delta=[n for n in mechanisms.names() if mechanisms.get(n).with_delta],
            pure=[n for n in mechanisms.over_rpc() if not mechanisms.get(n).with_delta],
            offline_only=mechanisms.offline_only(),
            delta=ReleaseSpec.delta,
            decay_slope=ReleaseSpec.S,
            rho=ReleaseSpec.rho,
        ),
    )
    r.set_defaults(func=_release)
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


def _serve(args) -> int:
    from functools import partial

    from lac.common.logs import configure as configure_logging
    from lac.common.server import PortUnavailable, run_until_signalled
    from lac.common.statelock import StateDirLocked
    from lac.curator.base.prior import public_vocabulary
    from lac.curator.service import lifecycle
    from lac.curator.service.server import create_server
    from lac.curator.store.store import FilesElsewhere, PrivacyUnitChanged

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
        state = lifecycle.open_state(config, vocab)
        server, port = create_server(state)
        lifecycle.start(state)
        await run_until_signalled(server, port, config.port_file, "curator", on_stop=partial(lifecycle.stop, state))

    try:
        asyncio.run(main())
    except (PortUnavailable, StateDirLocked, PrivacyUnitChanged, FilesElsewhere) as exc:  # port or state taken, ...
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
            stripped = store.strip_segment_words()
        finally:
            store.close()
    print(
        f"migrated {n} segment(s) in {args.state_dir} to Parquet; removed the reports' words from {stripped} segment(s)"
    )
    return 0


def _migrate(args) -> int:
    from lac.common.backup import migrate_command
    from lac.curator.store.store import copy_to_postgres

    stays = "its segments, releases and ledger journal"
    print(migrate_command("curator", args.state_dir, args.to, "curator.sqlite", copy_to_postgres, stays))
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


def _release(args) -> int:
    """Offline on files with ``--counts``, else against the curator (``lac.analyst.cli.release``)."""
    if args.counts is not None:
        return _release_offline(args)
    if not mechanisms.get(args.mechanism).over_rpc:
        raise SystemExit(
            f"lac curator release: {args.mechanism} is NOT differentially private and runs offline only (--counts)"
        )
    return client_commands.release(args)


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
