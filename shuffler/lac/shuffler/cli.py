"""``lac shuffler serve|status|flush|dead-letter|add-client|add-clients|rotate-client|backup|restore|amplification``."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lac.common import config as cfg
from lac.common import tls, tracing
from lac.common.cli import message_json, positive
from lac.common.errors import LacError
from lac.common.profiles import add_connection_flags
from lac.common.v1 import shuffler_pb2, shuffler_pb2_grpc
from lac.shuffler.config import ENV_PREFIX, ShufflerConfig


def register(subparsers) -> None:
    p = subparsers.add_parser("shuffler", help="the amplifier: batch, anonymise and shuffle reports")
    sub = p.add_subparsers(dest="shuffler_command", metavar="ACTION", required=True)
    serve = sub.add_parser("serve", help="run the shuffler gRPC server")
    cfg.add_flags(serve, ShufflerConfig, ENV_PREFIX)
    serve.set_defaults(func=_serve)
    dead = sub.add_parser(
        "dead-letter",
        help="list, retry or drop the batches the curator refused for good (operator)",
        description="A batch the curator refuses for good (INVALID_ARGUMENT, FAILED_PRECONDITION, "
        "RESOURCE_EXHAUSTED: its statement, windows or size are not what the curator accepts) is set aside as a "
        "dead letter, so newer batches are delivered. `list` shows each with the curator's refusal; `retry` sends "
        "them again as they were released (once the cause is fixed: the curator's configuration, the clock); "
        "`drop` deletes them and their reports, which are then never delivered.",
    )
    dead_sub = dead.add_subparsers(dest="dead_letter_command", metavar="ACTION", required=True)
    operator_commands = [
        (sub, "status", "print the shuffler's status (operator certificate)", _status),
        (sub, "flush", "release a batch now if the release threshold is reached (operator certificate)", _flush),
        (dead_sub, "list", "the dead letters, oldest first, with the curator's refusal", _dead_list),
        (dead_sub, "retry", "send dead letters again as they were released", _dead_retry),
        (dead_sub, "drop", "delete dead letters and their reports (never delivered)", _dead_drop),
    ]
    for parent, name, helptext, func in operator_commands:
        q = parent.add_parser(name, help=helptext)
        if func in (_dead_retry, _dead_drop):
            q.add_argument("batch_ids", nargs="*", metavar="BATCH_ID", help="the dead letters (see `list`)")
            q.add_argument("--all", action="store_true", help="every dead letter")
        add_connection_flags(q, "shuffler", "127.0.0.1:50051")
        q.add_argument(
            "--token-file",
            type=Path,
            default=None,
            help="file holding an operator token (`add-client NAME --role operator`) [default: the token in "
            "$LAC_OPERATOR_TOKEN, else the profile's token-file]",
        )
        q.add_argument("--json", action="store_true", help="print the reply as one JSON object")
        q.set_defaults(func=func)
    add = sub.add_parser(
        "add-client",
        help="register a client (or operator) and print its new bearer token (shown once)",
        description="Append '<sha256 of token> <id> <role>' to the tokens file (a running "
        "shuffler re-reads it) and print the token. Give the token to the client; "
        "it sends 'authorization: Bearer <token>'.",
    )
    add.add_argument("client_id", help="id (1-128 of A-Z a-z 0-9 . _ : @ -); a client's never leaves the shuffler")
    add.add_argument(
        "--role",
        choices=["client", "operator"],
        default="client",
        help="client: may submit reports (quota per window); operator: may read status and flush",
    )
    bulk = sub.add_parser(
        "add-clients",
        help="register many clients at once; write their tokens as JSON lines (shown once)",
        description="Register --count new clients (ids PREFIX1, PREFIX2, ... numbered on from the largest "
        "existing one) or the ids in --from-file (one per line), in one locked append to the tokens file, and "
        'write one JSON object per client, {"id", "role", "token", "expires"}, to --out (created 0600) or '
        "stdout. Ids already registered are refused: `rotate-client` replaces a client's token.",
    )
    which = bulk.add_mutually_exclusive_group()  # one of them: checked by the command, after the flags
    which.add_argument(
        "--count", type=positive(int), help="number of new clients, with generated ids (this or --from-file)"
    )
    which.add_argument("--from-file", type=Path, help="file of ids to register, one per line")
    bulk.add_argument("--prefix", default="client-", help="id prefix of --count [default: client-]")
    bulk.add_argument(
        "--out", type=Path, default=None, help="write the tokens here (a new file, 0600) instead of stdout"
    )
    rot = sub.add_parser(
        "rotate-client",
        help="issue a client a new token; its old one keeps working for --grace, then stops",
        description="Append the client's new token to the tokens file and give its current tokens an expiry "
        "of now + --grace (or their own, if sooner): the client switches to the new token within the grace "
        "period, after which the old one is refused as expired. Prints the new token (shown once).",
    )
    rot.add_argument("client_id", help="the id given to add-client")
    rot.add_argument(
        "--grace",
        type=_duration,
        default=86400.0,
        metavar="DURATION",
        help="how long the old token keeps working (0: it stops now) [default: 1d]",
    )
    rot.add_argument(
        "--role",
        choices=["client", "operator"],
        default=None,
        help="which token to rotate when the id has both a client and an operator token",
    )
    bulk.add_argument(
        "--role",
        choices=["client", "operator"],
        default="client",
        help="client: may submit reports (quota per window); operator: may read status and flush",
    )
    for q in (add, bulk, rot):
        q.add_argument(
            "--expires-in",
            type=_duration,
            default=None,
            metavar="DURATION",
            help="the new token expires after this long (e.g. 90d, 12h; units s m h d w); "
            "then it is refused as expired [default: never]",
        )
        q.add_argument("--tokens-file", type=Path, default=None, help="tokens file (default: STATE_DIR/clients.tokens)")
        q.add_argument(
            "--state-dir",
            type=Path,
            default=ShufflerConfig.state_dir,
            help=f"shuffler state directory [default: {ShufflerConfig.state_dir}]",
        )
    add.set_defaults(func=_add_client)
    bulk.set_defaults(func=_add_clients)
    rot.set_defaults(func=_rotate_client)
    bak = sub.add_parser(
        "backup",
        help="copy the report log (online, consistent) and tokens file into DIR",
        description="Copy the report log with SQLite's online backup API (one consistent "
        "snapshot, while the shuffler keeps serving) and the tokens file into DIR, "
        "with a manifest naming their SHA-256. DIR is created private (0700). The key of the log's client "
        "hashes (STATE_DIR/client.key) is left out: keep a copy of it apart from the backups.",
    )
    bak.add_argument("dir", type=Path, help="new directory for the backup")
    res = sub.add_parser(
        "restore",
        help="install a backup made with `backup` as a state directory",
        description="Verify a backup (manifest, SHA-256, quick_check) and install it into "
        "--state-dir, whose shuffler must be stopped (refused while one holds its lock). The restored log does not "
        "know what happened after the backup: reports acknowledged since then are "
        "missing, and idempotency ids and quota use recorded since are forgotten. Backups leave out the key of "
        "the log's client hashes (client.key): restore where it is, or pass --client-key or --new-client-key.",
    )
    res.add_argument("dir", type=Path, help="directory written by `lac shuffler backup`")
    res.add_argument(
        "--force",
        action="store_true",
        help="replace an existing report log / tokens file (not while a shuffler runs on it)",
    )
    res.add_argument(
        "--client-key",
        type=Path,
        default=None,
        metavar="FILE",
        help="the key of the report log's client hashes (the old state directory's client.key, which backups "
        "leave out); without it the state directory's own client.key must be that key",
    )
    res.add_argument(
        "--new-client-key",
        action="store_true",
        help="restore without the old client key: the shuffler makes a new one, and every client's quota and "
        "period-cap use is forgotten (a client may store its quota again in the current window)",
    )
    to_pg = sub.add_parser(
        "migrate",
        help="copy a stopped shuffler's SQLite report log into an empty PostgreSQL database (then serve with "
        "--store URL)",
        description="Copy every row of the report log (buffered reports, released batches awaiting delivery and "
        "dead letters, idempotency ids, quota and period-cap use, counters, the client key's id and the cached "
        "deployment) into an empty PostgreSQL database, in one transaction that commits only when every table's "
        "row count and checksum read back equal the source's. A target that holds any state is refused. The "
        "shuffler must be stopped (refused while one holds the state directory). The tokens file and the client "
        "key (client.key) stay in --state-dir: start the shuffler with --store URL and the same --state-dir, and "
        "give every other replica over that database a copy of both. shuffler.sqlite is kept, marked as copied: "
        "a shuffler started on it refuses.",
    )
    to_pg.add_argument(
        "--to",
        required=True,
        metavar="URL",
        help="postgresql://USER@HOST:PORT/DB (needs lac-shuffler[postgresql]; the password from PGPASSWORD or "
        "~/.pgpass)",
    )
    to_pg.set_defaults(func=_migrate)
    for q in (bak, res, to_pg):
        q.add_argument(
            "--state-dir",
            type=Path,
            default=ShufflerConfig.state_dir,
            help=f"shuffler state directory [default: {ShufflerConfig.state_dir}]",
        )
        if q is not to_pg:
            q.add_argument(
                "--tokens-file", type=Path, default=None, help="tokens file (default: STATE_DIR/clients.tokens)"
            )
    bak.set_defaults(func=_backup)
    res.set_defaults(func=_restore)
    amp = sub.add_parser(
        "amplification",
        help="privacy accountant: central (eps, delta) of a shuffled batch of eps0-LDP reports",
        description="Central (epsilon, delta)-DP of one uniformly shuffled batch of n reports, each from a "
        "distinct user and eps0-LDP: the numerical bound used everywhere in LAC (the stronger-clone "
        "pair of Feldman-McMillan-Talwar 2023 / Wang et al. 2024 with its mixing step, proved for "
        "every eps0-LDP randomizer in lac.shuffler.amplification) beside the closed form of "
        "Feldman-McMillan-Talwar 2021 (Thm 3.1), reporting 'no amplification' where nothing is "
        "gained. Offline: needs no running shuffler.",
    )
    amp.add_argument(
        "--eps0",
        type=float,
        required=True,
        help="local pure DP level of one report (> 0); for LAC's metric-DP reports this is the "
        "deployment's report_epsilon0 = max_report_words * epsilon_per_word * diameter",
    )
    amp.add_argument(
        "--n", type=int, required=True, help="number of reports in the shuffled batch, each from a distinct user (>= 1)"
    )
    amp.add_argument("--delta", type=float, required=True, help="target central delta, in (0, 1)")
    amp.add_argument(
        "--subsample-q",
        type=float,
        default=None,
        metavar="Q",
        help="also report amplification by Poisson sub-sampling at rate Q in [0, 1] "
        "(eps = log(1 + Q(e^eps0 - 1)), delta scales by Q)",
    )
    amp.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    amp.set_defaults(func=_amplification)


def _serve(args) -> int:
    from lac.common.logs import configure as configure_logging
    from lac.common.server import PortUnavailable, run_until_signalled
    from lac.common.statelock import StateDirLocked
    from lac.shuffler import lifecycle
    from lac.shuffler.reportlog import ClientKeyError
    from lac.shuffler.server import create_server

    config = cfg.from_args(ShufflerConfig, ENV_PREFIX, args)
    configure_logging(config.log_format, getattr(args, "verbose", False))
    tracing.configure_service(config, "shuffler")

    async def main():
        state = lifecycle.open_state(config)
        server, port = create_server(state)
        lifecycle.start(state)
        await run_until_signalled(server, port, config.port_file, "shuffler", on_stop=lambda: lifecycle.stop(state))

    try:
        asyncio.run(main())
    except (PortUnavailable, StateDirLocked, ClientKeyError) as exc:  # the port or state directory, the client key
        raise SystemExit(f"error: {exc}") from None
    return 0


def _duration(text: str) -> float:
    """An argparse ``type``: a duration such as 90d, 12h, 30m, 45s or 0, in seconds."""
    import argparse

    from lac.shuffler.auth import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _expiry(args) -> float | None:
    import time

    return None if args.expires_in is None else time.time() + args.expires_in


def _tokens_path(args) -> Path:
    return args.tokens_file or args.state_dir / "clients.tokens"


def _add_client(args) -> int:
    from lac.shuffler.auth import add_client, format_time

    path = _tokens_path(args)
    expires = _expiry(args)
    try:
        token = add_client(path, args.client_id, args.role, expires)
    except LacError as exc:
        raise SystemExit(f"error: {exc}") from None
    until = f", expires {format_time(expires)}" if expires is not None else ""
    print(f"# {args.role} {args.client_id} added to {path}{until}; its token (not stored anywhere, shown once):")
    print(token)
    return 0


def _add_clients(args) -> int:
    import contextlib
    import json
    import os
    import sys

    from lac.shuffler.auth import add_clients, format_time, next_ids

    path = _tokens_path(args)
    if args.from_file is None and args.count is None:
        raise SystemExit("error: say which clients: --count N (new ids) or --from-file FILE (one id per line)")
    if args.from_file is not None:
        ids = [line.strip() for line in args.from_file.read_text().splitlines() if line.strip()]
        if not ids:
            raise SystemExit(f"error: no ids in {args.from_file}")
    else:
        ids = next_ids(path, args.prefix, int(args.count))
    out = None
    if args.out is not None:  # created first and private, so no token is ever written where others can read it
        try:
            out = os.fdopen(os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w")
        except FileExistsError:
            raise SystemExit(f"error: {args.out} exists; tokens are written only to a new file") from None
    expires = _expiry(args)
    try:
        tokens = add_clients(path, ids, args.role, expires, new_ids_only=True)
    except BaseException as exc:
        if out is not None:
            out.close()
            args.out.unlink()
        if isinstance(exc, LacError):
            raise SystemExit(f"error: {exc}") from None
        raise
    until = format_time(expires) if expires is not None else None
    with out if out is not None else contextlib.nullcontext(sys.stdout) as f:
        for client_id, token in zip(ids, tokens):
            f.write(json.dumps({"id": client_id, "role": args.role, "token": token, "expires": until}) + "\n")
    where = f"; tokens in {args.out}" if args.out is not None else ""
    print(f"# {len(ids)} {args.role}(s) added to {path}{where} (shown once, stored nowhere)", file=sys.stderr)
    return 0


def _rotate_client(args) -> int:
    from lac.shuffler.auth import format_time, rotate_client

    path = _tokens_path(args)
    try:
        r = rotate_client(path, args.client_id, args.grace, _expiry(args), args.role)
    except LacError as exc:
        raise SystemExit(f"error: {exc}") from None
    until = f", expires {format_time(r.expires)}" if r.expires is not None else ""
    print(
        f"# {r.role} {args.client_id}: new token{until}; its {r.old_tokens} previous token(s) work until "
        f"{format_time(r.old_until)} (not stored anywhere, shown once):"
    )
    print(r.token)
    return 0


def _migrate(args) -> int:
    from lac.common.backup import migrate_command
    from lac.shuffler.reportlog import copy_to_postgres

    print(
        migrate_command(
            "shuffler", args.state_dir, args.to, "shuffler.sqlite", copy_to_postgres, "its tokens file and client.key"
        )
    )
    return 0


def _backup(args) -> int:
    from lac.shuffler.backup import backup

    try:
        m = backup(args.state_dir, args.dir, args.tokens_file)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    print(
        f"backed up {m['source']} to {args.dir}: {m['buffered_reports']} buffered reports, "
        f"{m['batches_pending']} undelivered batches, {m['database_bytes']} bytes"
        f"{', tokens file' if m['tokens'] else ', no tokens file'}"
    )
    return 0


def _restore(args) -> int:
    from lac.shuffler.backup import restore

    try:
        m = restore(
            args.dir,
            args.state_dir,
            args.tokens_file,
            force=args.force,
            client_key=args.client_key,
            new_client_key=args.new_client_key,
        )
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    print(
        f"restored the backup of {m['source']} into {args.state_dir}: {m['buffered_reports']} buffered reports, "
        f"{m['batches_pending']} undelivered batches. Reports acknowledged after the backup are not in it."
    )
    return 0


def _call(args, method: str, request):
    import os

    try:
        channel_tls = tls.client_tls_from_args(args, "lac shuffler")
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    token = args.token_file.read_text().strip() if args.token_file else os.environ.get("LAC_OPERATOR_TOKEN")
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with tls.channel(args.server, channel_tls) as channel:
        return getattr(shuffler_pb2_grpc.ShufflerStub(channel), method)(request, timeout=30, metadata=metadata)


def _status(args) -> int:
    s = _call(args, "GetStatus", shuffler_pb2.ShufflerStatusRequest())
    if args.json:
        print(message_json(s))
        return 0
    print(f"authentication:     {s.auth}")
    print(f"release lease:      {'held: this replica releases and forwards' if s.release_lease else 'not held'}")
    print(f"window:             {s.window} (next in {s.seconds_to_next_window:.0f}s)")
    print(
        f"buffered reports:   {s.buffered_reports} of {s.buffered_clients} distinct clients (min_batch {s.min_batch})"
    )
    print(f"batches forwarded:  {s.batches_forwarded} ({s.reports_forwarded} reports)")
    print(f"batches pending:    {s.batches_pending}")
    print(
        f"dead letters:       {s.batches_dead_letter}"
        + (" (lac shuffler dead-letter list)" if s.batches_dead_letter else "")
    )
    if s.deployment_mismatch:
        print(f"MISCONFIGURED:      {s.deployment_mismatch}")
    print(f"report log:         {s.log_bytes} of {s.max_log_bytes} bytes")
    print("counters:           " + (", ".join(f"{k}={v}" for k, v in sorted(s.counters.items())) or "none"))
    print("rejects:            " + (", ".join(f"{k}={v}" for k, v in sorted(s.rejects.items())) or "none"))
    if s.note:
        print(f"note:               {s.note}")
    for b in s.recent_batches:
        state = "delivered" if b.delivered else f"dead letter ({b.refusal})" if b.refusal else "pending"
        print(
            f"batch {b.batch_id}: {b.size} reports, {state}; "
            f"{b.privacy.statement or 'amplification statement not computed yet'}"
        )
    return 0


def _dead_list(args) -> int:
    from lac.shuffler.auth import format_time

    r = _call(args, "ListDeadLetters", shuffler_pb2.ListDeadLettersRequest())
    if args.json:
        print(message_json(r))
        return 0
    if not r.batches:
        print("no dead letters")
    for b in r.batches:
        print(f"batch {b.batch_id}: {b.size} reports, refused {format_time(b.dead_since_unix)}: {b.refusal}")
    return 0


def _settle_dead(args, method: str, done: str) -> int:
    if bool(args.batch_ids) == args.all:
        raise SystemExit(
            "error: the dead letters' batch ids are required (`lac shuffler dead-letter list` shows them), or --all "
            "for every one, not both"
        )
    r = _call(args, method, shuffler_pb2.DeadLetterSelection(batch_ids=args.batch_ids, all=args.all))
    if args.json:
        print(message_json(r))
        return 0
    print(f"{done} {len(r.batch_ids)} batch(es) of {r.reports} report(s)" + "".join(f"\n  {b}" for b in r.batch_ids))
    return 0


def _dead_retry(args) -> int:
    return _settle_dead(args, "RetryDeadLetters", "sending again")


def _dead_drop(args) -> int:
    return _settle_dead(args, "DropDeadLetters", "dropped")


def _flush(args) -> int:
    r = _call(args, "Flush", shuffler_pb2.FlushRequest())
    if args.json:
        print(message_json(r))
        return 0
    print(f"released batch {r.batch_id} of {r.batch_size} reports" if r.released else r.note)
    return 0


def _amplification(args) -> int:
    import json

    from lac.shuffler.amplification import shuffle_epsilon, subsampling_epsilon, subsampling_statement

    try:
        results = [shuffle_epsilon(args.eps0, args.n, args.delta, method=m) for m in ("numerical", "closed_form")]
        sub = None
        if args.subsample_q is not None:
            sub = {
                "q": args.subsample_q,
                "epsilon": subsampling_epsilon(args.eps0, args.subsample_q),
                "delta_scale": args.subsample_q,
                "statement": subsampling_statement(args.eps0, args.subsample_q),
            }
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.json:
        out = {
            "eps0": args.eps0,
            "n": args.n,
            "delta": args.delta,
            "numerical": results[0].to_dict(),
            "closed_form": results[1].to_dict(),
        }
        if sub is not None:
            out["subsampling"] = sub
        print(json.dumps(out, indent=2))
        return 0
    print(f"eps0 = {args.eps0:g}   n = {args.n}   delta = {args.delta:g}")
    print(f"{'method':<13} {'epsilon':>12}  result")
    for r in results:
        verdict = "amplified" if r.amplified else "no amplification (eps = eps0)"
        print(f"{r.method:<13} {r.epsilon:>12.6g}  {verdict}")
    if sub is not None:
        print(
            f"{'subsample':<13} {sub['epsilon']:>12.6g}  Poisson sub-sampling at q = {sub['q']:g} (delta scales by q)"
        )
    print()
    for r in results:
        print(f"[{r.method}] {r.statement}")
    if sub is not None:
        print(f"[subsample] {sub['statement']}")
    return 0
