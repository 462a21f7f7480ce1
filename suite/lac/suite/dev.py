"""``lac dev up|down``: a local TLS stack in one command, for development and trying LAC out.

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


def register(subparsers: Any) -> None:
    """Add ``lac dev up|down`` to the ``lac`` command."""
    p = subparsers.add_parser("dev", help="a local TLS shuffler + curator with keys and tokens, in one command")
    sub = p.add_subparsers(dest="dev_command", metavar="ACTION", required=True)
    up = sub.add_parser(
        "up",
        help="create keys, certificates and tokens (once), start a TLS curator and shuffler, stay until Ctrl-C",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    up.add_argument("--dir", type=Path, default=Path("lac-dev"), help="keys, tokens, state and logs [default: lac-dev]")
    up.add_argument("--shuffler-port", type=int, default=0, help="shuffler port on 127.0.0.1 [default: any free]")
    up.add_argument("--curator-port", type=int, default=0, help="curator port on 127.0.0.1 [default: any free]")
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
        "stopped both servers.",
    )
    down.add_argument("--dir", type=Path, default=Path("lac-dev"), help="the directory of `lac dev up`")
    down.add_argument("--timeout", type=positive(float), default=60.0, help="seconds to wait for it to stop")
    down.set_defaults(func=_down)


def _private_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (tokens)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _tokens(root: Path, clients: int) -> tuple[str, str]:
    """(the first client's token, the operator's token): registered with the shuffler on the first start and
    kept in ``root`` (0600), read back later."""
    from lac.shuffler.auth import add_clients

    client_file, operator_file = root / "client.token", root / "operator.token"
    if client_file.exists() and operator_file.exists():
        return client_file.read_text().strip(), operator_file.read_text().strip()
    tokens_file = root / "shuffler" / "clients.tokens"
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
    from lac.common.paths import data_dir
    from lac.suite import procs

    root: Path = args.dir.resolve()
    if (other := _running(root)) is not None:
        raise SystemExit(
            f"error: a `lac dev up` (pid {other['pid']}) already runs on {root}; `lac dev down --dir {args.dir}`"
        )
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    (root / STATE).unlink(missing_ok=True)
    keys = root / "keys"
    if (keys / "tls" / "ca.pem").exists() and (keys / "curator-keys").exists():
        pki = procs.LocalDeployment(keys)
        made = "reused"
    else:
        pki = procs.LocalDeployment.create(keys)
        made = "created"
    client_token, operator_token = _tokens(root, args.clients)

    stopping: list[int] = []

    def stop_on(signum: int, frame: object) -> None:
        stopping.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop_on)
    services: list[procs.Service] = []
    try:
        curator_args = ["--state-dir", str(root / "curator"), "--channel-cache-dir", str(data_dir() / "channels")]
        if args.public_corpus is not None:
            curator_args += ["--public-corpus", str(args.public_corpus.resolve())]
        print(f"keys and certificates {made} in {keys}; starting the curator (mutual TLS)...", flush=True)
        curator = procs.start(
            "curator",
            [*curator_args, *pki.curator_args()],
            root,
            timeout=args.timeout,
            tls=pki.client_tls("analyst"),
            port=args.curator_port,
        )
        services.append(curator)
        print("starting the shuffler (TLS; mutual TLS to the curator)...", flush=True)
        shuffler = procs.start(
            "shuffler",
            [
                "--state-dir",
                str(root / "shuffler"),
                "--curator",
                curator.address,
                "--min-batch",
                str(args.min_batch),
                *pki.shuffler_args(),
            ],
            root,
            timeout=args.timeout,
            tls=pki.client_tls(),
            port=args.shuffler_port,
        )
        services.insert(0, shuffler)  # stopped first, so it never forwards to a stopped curator
        info = _describe(root, pki, shuffler, curator, client_token, operator_token)
        _private_text(root / "env.sh", "".join(f"export {k}={shlex.quote(v)}\n" for k, v in info["env"].items()))
        info["profiles"] = _write_profiles(info)
        _private_text(root / STATE, json.dumps(info, indent=2) + "\n")
        _print(args.dir, info)
        watch = procs.ChannelWatch(curator.address, pki.client_tls("analyst"))
        while True:
            for service in services:
                if service.process.poll() is not None:
                    raise SystemExit(
                        f"error: the {service.name} exited with {service.process.returncode}; its log: "
                        f"{service.log_path}"
                    )
            watch.poll()
            time.sleep(0.5)
    except KeyboardInterrupt:
        print(f"\nstopping ({'SIGTERM' if stopping else 'Ctrl-C'}): the shuffler, then the curator...", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the graceful stop short
        try:
            codes = {s.name: s.stop() for s in services}
            (root / STATE).unlink(missing_ok=True)
            if codes:
                print("stopped: " + ", ".join(f"{n} (exit {c})" for n, c in codes.items()), flush=True)
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, previous)


def _describe(root: Path, pki: Any, shuffler: Any, curator: Any, client: str, operator: str) -> dict[str, Any]:
    """What DIR/dev.json records: addresses, files, tokens' files and process ids, and the environment of env.sh."""
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
    return {
        "pid": os.getpid(),
        "shuffler": {"address": shuffler.address, "pid": shuffler.process.pid, "log": str(shuffler.log_path)},
        "curator": {"address": curator.address, "pid": curator.process.pid, "log": str(curator.log_path)},
        "state_dirs": {"shuffler": str(root / "shuffler"), "curator": str(root / "curator")},
        "files": files,
        "env": {
            "LAC_DEV_SHUFFLER": shuffler.address,
            "LAC_DEV_CURATOR": curator.address,
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


def _write_profiles(info: dict[str, Any]) -> dict[str, Any]:
    """The connection profiles ``dev`` (curator: the operator's certificate, which may do all an analyst may;
    shuffler: the operator's token) and ``dev-analyst`` (curator: the analyst's certificate); where they went,
    or why they could not be written (env.sh holds the same)."""
    from lac.common.profiles import ProfileError, write_profile

    f = info["files"]
    curator = {"server": info["curator"]["address"], "ca": f["ca"]}
    profiles = {
        "dev": {
            "curator": {**curator, "cert": f["operator_cert"], "key": f["operator_key"]},
            "shuffler": {"server": info["shuffler"]["address"], "ca": f["ca"], "token-file": f["operator_token"]},
        },
        "dev-analyst": {"curator": {**curator, "cert": f["analyst_cert"], "key": f["analyst_key"]}},
    }
    try:
        for name, tables in profiles.items():
            path = write_profile(name, tables)
    except (OSError, RuntimeError, ProfileError) as exc:  # no writable config directory: env.sh still works
        return {"error": f"the profiles dev and dev-analyst were not written: {exc}"}
    return {"file": str(path), "names": list(profiles)}


def _print(shown: Path, info: dict[str, Any]) -> None:
    env = info["env"]
    d = shlex.quote(str(shown))
    written = info["profiles"].get("file")
    profiles = (
        f"Profiles dev (the operator's certificate and token) and dev-analyst (the analyst's certificate) are in "
        f"{written}; every `lac curator|shuffler|health` command takes --profile NAME:"
        if written
        else f"({info['profiles']['error']}; pass --server, --ca, --cert and --key from env.sh instead)"
    )
    lines = [
        "",
        f"LAC dev stack up (state, keys, tokens and logs in {shown}; not for production):",
        f"  shuffler  {env['LAC_DEV_SHUFFLER']}  TLS, bearer tokens        log {info['shuffler']['log']}",
        f"  curator   {env['LAC_DEV_CURATOR']}  mutual TLS (certificates)  log {info['curator']['log']}",
        "",
        f"In another terminal: source {d}/env.sh   (addresses, CA, curator key, certificates, tokens), then:",
        '  lac client submit messages.txt --server "$LAC_DEV_SHUFFLER" --curator-key "$LAC_DEV_CURATOR_PUB" '
        '--ca "$LAC_DEV_CA"',
        profiles,
        "  lac shuffler status --profile dev",
        "  lac curator release --profile dev-analyst --epsilon 1 --dry-run",
        "  lac curator release --profile dev-analyst --epsilon 1",
        "  lac curator status --profile dev",
        "  lac health --profile dev.curator",
        "From Python: ShufflerClient.connect(address, curator_key=..., ca=..., token=...) and "
        "CuratorClient(address, ca=..., cert=..., key=...) with the values of env.sh.",
        "",
        f"Ctrl-C (or `lac dev down --dir {d}`) stops both; `lac dev up --dir {d}` starts them again on the same state.",
    ]
    print("\n".join(lines), flush=True)


def _down(args: argparse.Namespace) -> int:
    root: Path = args.dir.resolve()
    found = _running(root)
    if found is None:
        raise SystemExit(f"error: no `lac dev up` is running on {root} (no {STATE} naming a live process)")
    pid = int(found["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    while _alive(pid) and (root / STATE).exists():  # removed once both servers have stopped
        if time.monotonic() > deadline:
            raise SystemExit(f"error: `lac dev up` (pid {pid}) has not stopped within {args.timeout:g} s")
        time.sleep(0.2)
    print(f"stopped the dev stack on {root}", file=sys.stdout)
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
