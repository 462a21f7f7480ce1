"""``lac dev up|down|status``: a local TLS stack in one command, for development and trying LAC out.

``lac dev up --dir lac-dev`` does, once, what the operator guide's long form does by hand: the curator's
HPKE key ring and a private CA with certificates for the curator, the shuffler, an analyst and an operator
(``lac keys``; ``procs.LocalDeployment``), a client token and an operator token (``lac shuffler
add-clients``); then, every time, it starts a TLS curator (mutual TLS) and a TLS shuffler forwarding to it
over mutual TLS as separate processes (``lac curator serve``, ``lac shuffler serve``; ephemeral ports unless
given), waits until both report SERVING, writes ``DIR/env.sh`` and ``DIR/dev.json`` (addresses, files,
process ids) and the connection profiles ``dev`` (the operator's certificate and token) and ``dev-analyst``
(the analyst's certificate) to the profiles file (``$LAC_PROFILES``, else ``$XDG_CONFIG_HOME/lac/profiles.toml``,
i.e. ``~/.config/lac/profiles.toml``; ``lac.common.profiles``), prints what to run, and stays in the
foreground, printing the curator's local channel's progress until it is ready (a fresh deployment samples it
first; releases answer UNAVAILABLE until then). Ctrl-C (SIGINT) or SIGTERM, or ``lac dev down --dir DIR`` from
another terminal, stops the shuffler and then the curator gracefully. Everything lives
under DIR (keys, tokens, both state directories, logs), so the next ``up`` carries on with the same keys,
tokens, reports and releases. Not for production: one machine, min_batch 1 by default (a batch of one
report is not anonymous), tokens kept in files next to the state.

``lac dev up --ha`` starts the shape of the compose profile ``ha`` instead (docs/operator/ha.md): a private
PostgreSQL server kept in ``DIR/postgres`` (durable; ``lac.common.pgcluster``, Debian's postgresql package) with
one database per service, two curator replicas over one of them sharing ``DIR/curator-shared``, and two shuffler
replicas over the other sharing one tokens file and the key of their client hashes, each forwarding to its own
curator. The profile ``dev`` lists both shufflers (``replicas``, for the SDK's failover) and names curator-a, as do
env.sh's ``LAC_DEV_SHUFFLER``/``LAC_DEV_CURATOR`` (``..._B``: the other replicas). A replica that dies is reported
and the others carry on; ``lac dev status`` says which serve, ``lac dev down`` stops every replica and then
PostgreSQL. A directory holds one kind of stack: ``--ha`` refuses one with SQLite state, and ``up`` without it one
with PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

from lac.common.cli import positive

STATE = "dev.json"  # written once both servers serve; removed when they have stopped
REPLICAS = ("a", "b")  # of each service, with --ha
DATABASES = {"shuffler": "lac_shuffler", "curator": "lac_curator"}  # with --ha, on the one private server


def register(subparsers: Any) -> None:
    """Add ``lac dev up|down|status`` to the ``lac`` command."""
    p = subparsers.add_parser("dev", help="a local TLS shuffler + curator with keys and tokens, in one command")
    sub = p.add_subparsers(dest="dev_command", metavar="ACTION", required=True)
    up = sub.add_parser(
        "up",
        help="create keys, certificates and tokens (once), start a TLS curator and shuffler, stay until Ctrl-C",
        description="\n\n".join(__doc__.split("\n\n")[1:3]) if __doc__ else None,
    )
    up.add_argument(
        "--ha",
        action="store_true",
        help="high availability: a private PostgreSQL server in DIR/postgres, two shuffler and two curator replicas "
        "over it (needs Debian's postgresql package and the services' postgresql extras)",
    )
    up.add_argument("--dir", type=Path, default=Path("lac-dev"), help="keys, tokens, state and logs [default: lac-dev]")
    up.add_argument(
        "--shuffler-port", type=int, default=0, help="shuffler port on 127.0.0.1 (--ha: shuffler-a's) [default: any]"
    )
    up.add_argument(
        "--curator-port", type=int, default=0, help="curator port on 127.0.0.1 (--ha: curator-a's) [default: any]"
    )
    up.add_argument(
        "--public-corpus",
        type=Path,
        default=None,
        help="the curator's public text [default: the corpus `lac data` prepares]",
    )
    up.add_argument(
        "--min-batch",
        type=positive(int),
        default=1,
        help="the shuffler's release threshold in distinct clients [default: 1, so one report reaches the "
        "curator; a batch that small is not anonymous]",
    )
    up.add_argument(
        "--clients",
        type=positive(int),
        default=1,
        help="client tokens made on the first start (DIR/client.token, all in DIR/clients.jsonl) [default: 1]",
    )
    up.add_argument("--timeout", type=positive(float), default=120.0, help="seconds to wait for each server")
    up.set_defaults(func=_up)
    down = sub.add_parser(
        "down",
        help="stop the `lac dev up` running on --dir (as Ctrl-C in its terminal does)",
        description="Send SIGTERM to the `lac dev up` process named in DIR/dev.json and wait until it has "
        "stopped every server (with --ha: every replica, then PostgreSQL). When that process was killed, stop what "
        "it left running: its servers named in DIR/dev.json and the PostgreSQL server of DIR/postgres.",
    )
    down.add_argument("--dir", type=Path, default=Path("lac-dev"), help="the directory of `lac dev up`")
    down.add_argument("--timeout", type=positive(float), default=60.0, help="seconds to wait for it to stop")
    down.set_defaults(func=_down)
    status = sub.add_parser(
        "status",
        help="every process of the `lac dev up` running on --dir: its address and whether it serves",
        description="For each server DIR/dev.json names (with --ha: every replica and PostgreSQL), whether its "
        "process runs and, for the shufflers and curators, whether it answers its health check with SERVING. "
        "Exit status 0 when every one does, 1 when any does not, 2 when no `lac dev up` runs on DIR.",
    )
    status.add_argument("--dir", type=Path, default=Path("lac-dev"), help="the directory of `lac dev up`")
    status.set_defaults(func=_status)


def _private_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (tokens)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _tokens(root: Path, clients: int, tokens_file: Path) -> tuple[str, str]:
    """(the first client's token, the operator's token): registered in the shuffler's ``tokens_file`` on the first
    start and kept in ``root`` (0600), read back later."""
    from lac.shuffler.auth import add_clients

    client_file, operator_file = root / "client.token", root / "operator.token"
    if client_file.exists() and operator_file.exists():
        return client_file.read_text().strip(), operator_file.read_text().strip()
    ids = [f"dev-client-{i}" for i in range(1, clients + 1)]
    tokens = add_clients(tokens_file, ids)
    (operator,) = add_clients(tokens_file, ["dev-operator"], role="operator")
    _private_text(
        root / "clients.jsonl",
        "".join(json.dumps({"id": i, "role": "client", "token": t}) + "\n" for i, t in zip(ids, tokens)),
    )
    _private_text(client_file, tokens[0] + "\n")
    _private_text(operator_file, operator + "\n")
    return tokens[0], operator


def _running(root: Path) -> dict[str, Any] | None:
    """What DIR/dev.json says of a `lac dev up` still running, else None."""
    try:
        found: dict[str, Any] = json.loads((root / STATE).read_text())
        os.kill(int(found["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found


def _up(args: argparse.Namespace) -> int:
    from lac.suite import procs

    root: Path = args.dir.resolve()
    if (other := _running(root)) is not None:
        raise SystemExit(
            f"error: a `lac dev up` (pid {other['pid']}) already runs on {root}; `lac dev down --dir {args.dir}`"
        )
    _check_kind(root, args)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    (root / STATE).unlink(missing_ok=True)
    keys = root / "keys"
    if (keys / "tls" / "ca.pem").exists() and (keys / "curator-keys").exists():
        pki = procs.LocalDeployment(keys)
        made = "reused"
    else:
        pki = procs.LocalDeployment.create(keys)
        made = "created"
    tokens_file = root / ("tokens" if args.ha else "shuffler") / "clients.tokens"
    client_token, operator_token = _tokens(root, args.clients, tokens_file)

    stopping: list[int] = []

    def stop_on(signum: int, frame: object) -> None:
        stopping.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop_on)
    services: list[procs.Service] = []  # in the order they stop: shufflers first, never forwarding to a stopped curator
    clusters: list[Any] = []
    try:
        print(f"keys and certificates {made} in {keys}", flush=True)
        if args.ha:
            stores = _start_postgres(root, args, clusters)
            _start_replicas(root, args, pki, stores, services)
        else:
            _start_single(root, args, pki, services)
        info = _describe(root, services, clusters[0] if clusters else None, client_token, operator_token)
        _private_text(root / "env.sh", "".join(f"export {k}={shlex.quote(v)}\n" for k, v in info["env"].items()))
        info["profiles"] = _write_profiles(info)
        _private_text(root / STATE, json.dumps(info, indent=2) + "\n")
        _print(args.dir, info)
        curator = next(s for s in services if s.name.startswith("curator"))
        watch = procs.ChannelWatch(curator.address, pki.client_tls("analyst"))
        told: set[str] = set()
        while True:
            _watch(services, info.get("postgres"), told)
            watch.poll()
            time.sleep(0.5)
    except KeyboardInterrupt:
        order = "the shufflers, then the curators, then PostgreSQL" if args.ha else "the shuffler, then the curator"
        print(f"\nstopping ({'SIGTERM' if stopping else 'Ctrl-C'}): {order}...", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the graceful stop short
        try:
            codes = {s.name: s.stop() for s in services}
            for cluster in clusters:
                cluster.stop()
                codes["postgresql"] = 0
            (root / STATE).unlink(missing_ok=True)
            if codes:
                print("stopped: " + ", ".join(f"{n} (exit {c})" for n, c in codes.items()), flush=True)
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, previous)


def _check_kind(root: Path, args: argparse.Namespace) -> None:
    """A directory holds one kind of stack; with --ha, what PostgreSQL needs is here (SystemExit saying what is not)."""
    if args.ha:
        single = [d for d in ("shuffler", "curator") if (root / d).exists()]
        if single:
            raise SystemExit(
                f"error: {root} holds a dev stack of one shuffler and one curator on SQLite ({', '.join(single)}/); "
                f"--ha keeps the state in PostgreSQL: use another --dir, or `lac dev up` without --ha"
            )
        try:
            import psycopg  # noqa: F401  (the services' postgresql extra: psycopg[binary,pool])
            import psycopg_pool  # noqa: F401
        except ImportError:
            raise SystemExit(
                "error: --ha keeps the services' state in PostgreSQL, which needs psycopg: "
                "pip install './shuffler[postgresql]' './curator[postgresql]'"
            ) from None
        from lac.common.pgcluster import PostgresUnavailable, server_binaries

        try:
            server_binaries()
        except PostgresUnavailable as exc:
            raise SystemExit(f"error: --ha runs a private PostgreSQL server: {exc}") from None
    elif (root / "postgres").exists():
        raise SystemExit(
            f"error: {root} holds a high-availability dev stack (PostgreSQL in {root / 'postgres'}): "
            f"`lac dev up --ha --dir {args.dir}`, or another --dir"
        )


def _start_single(root: Path, args: argparse.Namespace, pki: Any, services: list[Any]) -> None:
    """One curator and one shuffler on SQLite in ``root``, appended to ``services`` as they start."""
    from lac.suite import procs

    print("starting the curator (mutual TLS)...", flush=True)
    curator = procs.start(
        "curator",
        [*_curator_args(root / "curator", args), *pki.curator_args()],
        root,
        timeout=args.timeout,
        tls=pki.client_tls("analyst"),
        port=args.curator_port,
    )
    services.append(curator)
    print("starting the shuffler (TLS; mutual TLS to the curator)...", flush=True)
    shuffler = procs.start(
        "shuffler",
        [*_shuffler_args(root / "shuffler", curator.address, args), *pki.shuffler_args()],
        root,
        timeout=args.timeout,
        tls=pki.client_tls(),
        port=args.shuffler_port,
    )
    services.insert(0, shuffler)


def _curator_args(state_dir: Path, args: argparse.Namespace) -> list[str]:
    from lac.common.paths import data_dir

    found = ["--state-dir", str(state_dir), "--channel-cache-dir", str(data_dir() / "channels")]
    if args.public_corpus is not None:
        found += ["--public-corpus", str(args.public_corpus.resolve())]
    return found


def _shuffler_args(state_dir: Path, curator: str, args: argparse.Namespace) -> list[str]:
    return ["--state-dir", str(state_dir), "--curator", curator, "--min-batch", str(args.min_batch)]


def _start_postgres(root: Path, args: argparse.Namespace, clusters: list[Any]) -> dict[str, str]:
    """Start (or make, the first time) the private PostgreSQL server of ``root/postgres``, appended to ``clusters``;
    returns each service's database URL."""
    from lac.common.pgcluster import ClusterRunning, PostgresCluster, PostgresUnavailable, server_account

    account = server_account()
    if account is not None:  # as root the server runs as postgres, which must get through root to root/postgres
        os.chown(root, -1, account.pw_gid)
        os.chmod(root, 0o710)
    print(f"starting PostgreSQL (kept in {root / 'postgres'})...", flush=True)
    try:
        cluster = PostgresCluster(directory=root / "postgres")
    except ClusterRunning as exc:
        raise SystemExit(
            f"error: {exc}, left by a `lac dev up --ha` that was killed: `lac dev down --dir {args.dir}` stops it"
        ) from None
    except PostgresUnavailable as exc:
        raise SystemExit(f"error: {exc}") from None
    clusters.append(cluster)
    return {service: cluster.create_database(name, exist_ok=True) for service, name in DATABASES.items()}


def _start_replicas(
    root: Path, args: argparse.Namespace, pki: Any, stores: dict[str, str], services: list[Any]
) -> None:
    """Two curators over ``stores["curator"]`` and one shared directory, then two shufflers over
    ``stores["shuffler"]`` holding one client key and one tokens file, each forwarding to its curator; appended to
    ``services`` (shufflers first) as they start."""
    from lac.shuffler.reportlog import KEY_FILE, write_key
    from lac.suite import procs

    curators = []
    for r, port in zip(REPLICAS, (args.curator_port, 0)):
        print(f"starting curator-{r} (mutual TLS; PostgreSQL, {root / 'curator-shared'})...", flush=True)
        extra = ["--store", stores["curator"], "--shared-dir", str(root / "curator-shared")]
        curators.append(
            procs.start(
                "curator",
                [*_curator_args(root / f"curator-{r}", args), *extra, *pki.curator_args()],
                root,
                timeout=args.timeout,
                tls=pki.client_tls("analyst"),
                port=port,
                label=f"curator-{r}",
            )
        )  # one after the other: the first records the shared directory in the database
        services.append(curators[-1])
    key = root / "keys" / "shuffler-client.key"  # the key of the client hashes, as compose's `keys` makes it
    if not key.exists():
        write_key(key, os.urandom(32))
    for i, (r, port) in enumerate(zip(REPLICAS, (args.shuffler_port, 0))):
        state = root / f"shuffler-{r}"
        state.mkdir(mode=0o700, exist_ok=True)
        if not (state / KEY_FILE).exists():
            write_key(state / KEY_FILE, key.read_bytes())
        print(f"starting shuffler-{r} (TLS; PostgreSQL; mutual TLS to curator-{r})...", flush=True)
        extra = ["--store", stores["shuffler"], "--tokens-file", str(root / "tokens" / "clients.tokens")]
        shuffler = procs.start(
            "shuffler",
            [*_shuffler_args(state, curators[i].address, args), *extra, *pki.shuffler_args()],
            root,
            timeout=args.timeout,
            tls=pki.client_tls(),
            port=port,
            label=f"shuffler-{r}",
        )
        services.insert(i, shuffler)


def _watch(services: list[Any], postgres: dict[str, Any] | None, told: set[str]) -> None:
    """Say once of each replica that exited; SystemExit when a service has none left, or PostgreSQL stopped."""
    for service in services:
        if service.name in told or service.process.poll() is None:
            continue
        kind = service.name.split("-")[0]
        left = [s.name for s in services if s.name.startswith(kind) and s.process.poll() is None]
        why = f"the {service.name} exited with {service.process.returncode}; its log: {service.log_path}"
        if not left:
            raise SystemExit(f"error: {why}")
        told.add(service.name)
        print(f"{why}; {', '.join(left)} still serves", flush=True)
    if postgres is not None and not _alive(postgres["pid"]):
        raise SystemExit(f"error: the PostgreSQL server stopped; its log: {postgres['log']}")


def _describe(root: Path, services: list[Any], cluster: Any, client: str, operator: str) -> dict[str, Any]:
    """What DIR/dev.json records: addresses, files, tokens' files and process ids (``shuffler`` and ``curator``: the
    ones the profiles name; ``processes``: every one), and the environment of env.sh."""
    tls_dir = root / "keys" / "tls"
    files = {
        "ca": str(tls_dir / "ca.pem"),
        "curator_key": str(root / "keys" / "curator-keys" / "curator.pub"),
        "analyst_cert": str(tls_dir / "analyst.pem"),
        "analyst_key": str(tls_dir / "analyst.key"),
        "operator_cert": str(tls_dir / "operator.pem"),
        "operator_key": str(tls_dir / "operator.key"),
        "client_token": str(root / "client.token"),
        "operator_token": str(root / "operator.token"),
    }
    processes = {s.name: {"address": s.address, "pid": s.process.pid, "log": str(s.log_path)} for s in services}
    first = {kind: next(p for n, p in processes.items() if n.startswith(kind)) for kind in ("shuffler", "curator")}
    info: dict[str, Any] = {
        "pid": os.getpid(),
        **first,
        "processes": processes,
        "state_dirs": {n: str(root / n) for n in processes},
        "files": files,
        "env": {
            "LAC_DEV_SHUFFLER": first["shuffler"]["address"],
            "LAC_DEV_CURATOR": first["curator"]["address"],
            "LAC_DEV_CA": files["ca"],
            "LAC_DEV_CURATOR_PUB": files["curator_key"],
            "LAC_DEV_ANALYST_CERT": files["analyst_cert"],
            "LAC_DEV_ANALYST_KEY": files["analyst_key"],
            "LAC_DEV_OPERATOR_CERT": files["operator_cert"],
            "LAC_DEV_OPERATOR_KEY": files["operator_key"],
            "LAC_CLIENT_TOKEN": client,
            "LAC_OPERATOR_TOKEN": operator,
        },
    }
    if cluster is not None:
        info["env"].update(
            LAC_DEV_SHUFFLER_B=processes["shuffler-b"]["address"], LAC_DEV_CURATOR_B=processes["curator-b"]["address"]
        )
        info["state_dirs"]["curator-shared"] = str(root / "curator-shared")
        info["postgres"] = {
            "address": f"127.0.0.1:{cluster.port}",
            "pid": cluster.running_pid(),
            "log": str(cluster.log),
            "data": str(cluster.data),
            "stores": {service: cluster.url(name) for service, name in DATABASES.items()},
        }
    return info


def _write_profiles(info: dict[str, Any]) -> dict[str, Any]:
    """The connection profiles ``dev`` (curator: the operator's certificate, which may do all an analyst may;
    shuffler: the operator's token, and with several replicas all their addresses) and ``dev-analyst`` (curator: the
    analyst's certificate); where they went, or why they could not be written (env.sh holds the same)."""
    from lac.common.profiles import ProfileError, write_profile

    f = info["files"]
    curator = {"server": info["curator"]["address"], "ca": f["ca"]}
    shuffler: dict[str, Any] = {"server": info["shuffler"]["address"], "ca": f["ca"], "token-file": f["operator_token"]}
    replicas = [p["address"] for n, p in info["processes"].items() if n.startswith("shuffler")]
    if len(replicas) > 1:
        shuffler["replicas"] = replicas
    profiles = {
        "dev": {"curator": {**curator, "cert": f["operator_cert"], "key": f["operator_key"]}, "shuffler": shuffler},
        "dev-analyst": {"curator": {**curator, "cert": f["analyst_cert"], "key": f["analyst_key"]}},
    }
    try:
        for name, tables in profiles.items():
            path = write_profile(name, tables)
    except (OSError, RuntimeError, ProfileError) as exc:  # no writable config directory: env.sh still works
        return {"error": f"the profiles dev and dev-analyst were not written: {exc}"}
    return {"file": str(path), "names": list(profiles)}


def _print(shown: Path, info: dict[str, Any]) -> None:
    d = shlex.quote(str(shown))
    written = info["profiles"].get("file")
    ha = "postgres" in info
    profiles = (
        f"Profiles dev (the operator's certificate and token) and dev-analyst (the analyst's certificate) are in "
        f"{written}; every `lac curator|shuffler|health` command takes --profile NAME"
        + (
            " (the curator's are curator-a's, the shuffler's go to shuffler-a and list both replicas for the SDK; "
            'for curator-b add --server "$LAC_DEV_CURATOR_B"):'
            if ha
            else ":"
        )
        if written
        else f"({info['profiles']['error']}; pass --server, --ca, --cert and --key from env.sh instead)"
    )
    how = {"shuffler": "TLS, bearer tokens       ", "curator": "mutual TLS (certificates)"}
    rows = [
        f"  {name:<10}  {p['address']}  {how[name.split('-')[0]]}  log {p['log']}"
        for name, p in info["processes"].items()
    ]
    if ha:
        pg = info["postgres"]
        databases = ", ".join(DATABASES.values())
        rows.insert(0, f"  {'postgresql':<10}  {pg['address']}  databases {databases}  log {pg['log']}")
    servers = '--server "$LAC_DEV_SHUFFLER"' + (' --server "$LAC_DEV_SHUFFLER_B"' if ha else "")
    lines = [
        "",
        f"LAC dev stack up{', high availability' if ha else ''} (state, keys, tokens and logs in {shown}; not for "
        f"production{': one PostgreSQL server for both services, one machine' if ha else ''}):",
        *rows,
        "",
        f"In another terminal: source {d}/env.sh   (addresses, CA, curator key, certificates, tokens), then:",
        f'  lac client submit messages.txt {servers} --curator-key "$LAC_DEV_CURATOR_PUB" --ca "$LAC_DEV_CA"',
        profiles,
        "  lac shuffler status --profile dev",
        "  lac curator release --profile dev-analyst --epsilon 1 --dry-run",
        "  lac curator release --profile dev-analyst --epsilon 1",
        "  lac curator status --profile dev",
        "  lac health --profile dev.curator",
        (
            "From Python: ShufflerClient.connect([address, ...], curator_key=..., ca=..., token=...) with both "
            "shuffler addresses (a replica that is down costs a retry), and CuratorClient(address, ca=..., cert=..., "
            "key=...) with either curator's, with the values of env.sh."
            if ha
            else "From Python: ShufflerClient.connect(address, curator_key=..., ca=..., token=...) and "
            "CuratorClient(address, ca=..., cert=..., key=...) with the values of env.sh."
        ),
        "",
        f"Ctrl-C (or `lac dev down --dir {d}`) stops {'every replica, then PostgreSQL' if ha else 'both'}; "
        f"`lac dev up{' --ha' if ha else ''} --dir {d}` starts them again on the same state.",
    ]
    print("\n".join(lines), flush=True)


def _down(args: argparse.Namespace) -> int:
    root: Path = args.dir.resolve()
    found = _running(root)
    if found is None:
        return _clean_up(root)
    pid = int(found["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    while _alive(pid) and (root / STATE).exists():  # removed once every server has stopped
        if time.monotonic() > deadline:
            raise SystemExit(f"error: `lac dev up` (pid {pid}) has not stopped within {args.timeout:g} s")
        time.sleep(0.2)
    print(f"stopped the dev stack on {root}", file=sys.stdout)
    return 0


def _status(args: argparse.Namespace) -> int:
    import grpc

    from lac.common import health, tls

    root: Path = args.dir.resolve()
    found = _running(root)
    if found is None:
        raise SystemExit(f"error: no `lac dev up` is running on {root} (no {STATE} naming a live process)")
    f = found["files"]
    reach = {
        "shuffler": tls.ClientTls(Path(f["ca"])),
        "curator": tls.ClientTls(Path(f["ca"]), Path(f["operator_cert"]), Path(f["operator_key"])),
    }
    rows = []
    for name, p in found["processes"].items():
        try:
            serving = _alive(p["pid"]) and health.check(p["address"], reach[name.split("-")[0]], timeout=5)
        except grpc.RpcError:  # refused, no answer in time: not serving
            serving = False
        state = "SERVING" if serving else ("not serving" if _alive(p["pid"]) else "exited")
        rows.append((name, p["address"], p["pid"], state))
    if (pg := found.get("postgres")) is not None:
        rows.append(("postgresql", pg["address"], pg["pid"], "running" if _alive(pg["pid"]) else "exited"))
    print(f"`lac dev up` (pid {found['pid']}) on {root}:")
    for name, address, pid, state in rows:
        print(f"  {name:<10}  {address}  pid {pid:<7}  {state}")
    return 0 if all(state in ("SERVING", "running") for *_, state in rows) else 1


def _clean_up(root: Path) -> int:
    """With no `lac dev up` alive on ``root``: stop the servers a killed one left (those of DIR/dev.json still running
    a command on ``root``, then PostgreSQL's), or SystemExit when there are none."""
    try:
        left: dict[str, Any] = json.loads((root / STATE).read_text()).get("processes", {})
    except (OSError, ValueError, AttributeError):
        left = {}
    stopped = []
    for name, p in left.items():
        if _serves_from(int(p["pid"]), root):
            os.kill(int(p["pid"]), signal.SIGTERM)
            stopped.append((name, int(p["pid"])))
    deadline = time.monotonic() + 30
    while any(_alive(pid) for _, pid in stopped) and time.monotonic() < deadline:
        time.sleep(0.2)
    for _, pid in stopped:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    if (root / "postgres").is_dir():
        from lac.common.pgcluster import PostgresUnavailable, stop_kept

        try:
            if stop_kept(root / "postgres") is not None:
                stopped.append(("postgresql", 0))
        except PostgresUnavailable as exc:
            raise SystemExit(f"error: {exc}") from None
    (root / STATE).unlink(missing_ok=True)
    if not stopped:
        raise SystemExit(f"error: no `lac dev up` is running on {root} (no {STATE} naming a live process)")
    print(f"no `lac dev up` was running on {root}; stopped what it left: {', '.join(n for n, _ in stopped)}")
    return 0


def _serves_from(pid: int, root: Path) -> bool:
    """Whether process ``pid`` is a `lac ... serve` on ``root`` (not another process that took its id since)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    inside = str(root).encode()
    return b"serve" in command and any(a == inside or a.startswith(inside + b"/") for a in command)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
