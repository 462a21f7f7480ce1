"""``lac client privatize|submit``: the SDK from the command line.

Input files hold one message per line (a user's text). Randomness comes from the OS
CSPRNG; no noise vectors or noisy embeddings are ever printed.

``lac client submit`` says how many lines were stored and why any others were not; it exits 0 when
every line with a word to privatize was stored, ``PARTLY_STORED`` (3) when the shuffler's quota left
some unstored (they are named, with when to submit them again), and 2 on any error.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lac.client.errors import LacClientError, PartlyUnsupportedText, QuotaExceeded, UnsupportedText
from lac.client.mechanisms import LOCAL_KINDS, local_kinds_help
from lac.client.presets import DEFAULT_PRESET, PRESETS
from lac.common.cli import positive

if TYPE_CHECKING:
    import numpy as np

    from lac.client.acks import ReportAck
    from lac.client.embedding import Embedding
    from lac.client.localizer import PrivatizedReport
    from lac.client.submit import ShufflerClient
    from lac.common.deployment import Deployment

Command = Callable[[argparse.Namespace], int]
PARTLY_STORED = 3  # `lac client submit`'s exit status when the quota left lines unstored


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``lac client`` (privatize, submit, calibrate, embedding-info) to the ``lac`` command."""
    p = subparsers.add_parser("client", help="the localizer SDK: privatize text, submit reports")
    sub = p.add_subparsers(dest="client_command", metavar="ACTION", required=True)

    def common(q: argparse.ArgumentParser, epsilon_help: str = "metric-DP ε per word", preset_help: str = "") -> None:
        q.add_argument("file", type=Path, help="text file, one message per line ('-' for stdin)")
        q.add_argument("--epsilon", type=positive(float), default=None, help=epsilon_help)
        q.add_argument("--preset", choices=sorted(PRESETS), default=None, help=preset_help)
        q.add_argument("--vocab-size", type=positive(int), default=50_000, help="vocabulary size (most frequent words)")
        q.add_argument(
            "--embedding",
            default="default",
            help="'default' (GloVe 6B 50d), a cached embedding directory or a GloVe/word2vec/fastText file",
        )
        q.add_argument(
            "--mechanism",
            default="laplace",
            choices=list(LOCAL_KINDS),
            help=local_kinds_help(),
        )
        q.add_argument(
            "--tau",
            type=positive(float),
            default=None,
            help="truncated: admissible radius τ (default: median 10-NN distance)",
        )
        q.add_argument("--k", type=positive(int), default=20, help="knn: number of nearest words kept")

    pr = sub.add_parser(
        "privatize",
        help="print each line privatized (one output line per input line)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    common(
        pr,
        f"metric-DP ε per word [default: the preset's, {PRESETS[DEFAULT_PRESET].epsilon:g}]",
        f"a measured ε (private {PRESETS['private'].epsilon:g}, balanced {PRESETS['balanced'].epsilon:g}, "
        f"utility {PRESETS['utility'].epsilon:g}; see `lac client calibrate`) [default: {DEFAULT_PRESET}]",
    )
    pr.add_argument(
        "--max-words",
        type=positive(int),
        default=None,
        help="L: most words per report (longer texts are truncated, or split with --long-text split)",
    )
    pr.add_argument(
        "--long-text",
        choices=["truncate", "split"],
        default="truncate",
        help="a text longer than L words: keep its first L words, or split it into several reports",
    )
    pr.add_argument(
        "--json",
        action="store_true",
        help="one JSON report per line, with its guarantees and embedding facts (metadata)",
    )
    pr.set_defaults(func=_reported(_privatize))
    sm = sub.add_parser(
        "submit",
        help="privatize each line and submit it as one report to a shuffler",
        description="Privatize each line of FILE and submit it to the shuffler as one report of this client "
        "(the deployment's quota allows a few per accounting window), then say how many lines were stored and why "
        "any others were not: a line with no word to privatize is skipped, lines past the quota are named with "
        "when the next window opens. Exit status: 0 when every line with a word was stored, "
        f"{PARTLY_STORED} when the quota left some unstored, 2 on an error.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    common(
        sm,
        "metric-DP ε per word [default: the deployment's; a deployment that takes exactly its ε refuses another]",
        "use the smaller of the deployment's ε and this preset's (a deployment that takes exactly its ε refuses a "
        "smaller one) [default: the deployment's ε]",
    )
    sm.add_argument(
        "--long-text",
        choices=["truncate", "split"],
        default="truncate",
        help="a text longer than the deployment's L words: keep its first L words, or split it into "
        "several reports (each one report of this client's quota per accounting window)",
    )
    sm.add_argument(
        "--server",
        action=_Repeated,
        default="127.0.0.1:50051",
        help="shuffler address host:port; repeat it for each replica of one shuffler (a call that one replica cannot "
        "take, down or draining, goes to the next)",
    )
    sm.add_argument("--timeout", type=positive(float), default=30.0, help="seconds each call to the shuffler may take")
    sm.add_argument(
        "--connect-timeout",
        type=positive(float),
        default=10.0,
        help="seconds to wait for a shuffler that does not answer before giving up, naming it and why (a refused "
        "connection fails at once)",
    )
    sm.add_argument(
        "--attempts",
        type=positive(int),
        default=5,
        help="calls per request before giving up on a transient failure (UNAVAILABLE, DEADLINE_EXCEEDED)",
    )
    sm.add_argument("--curator-key", type=Path, help="the curator's public key (curator.pub from `lac keys curator`)")
    sm.add_argument("--ca", default="", help="CA certificate that signed the shuffler's TLS certificate")
    sm.add_argument("--cert", default="", help="client certificate (mTLS identity), optional")
    sm.add_argument("--key", default="", help="client certificate's key")
    who = sm.add_mutually_exclusive_group()
    who.add_argument(
        "--token-file", type=Path, help="file holding this client's bearer token (or set LAC_CLIENT_TOKEN)"
    )
    who.add_argument(
        "--tokens",
        type=Path,
        metavar="FILE",
        help='several clients\' tokens, as JSON lines with a "token" (what `lac shuffler add-clients` and `lac dev '
        "up --clients N` in DIR/clients.jsonl write): the lines are dealt to these clients in turn, as if each "
        "were another user's (to try a stack out; one person's lines sent as several clients are not protected "
        "as one person's)",
    )
    sm.add_argument("--insecure", action="store_true", help="plaintext payloads and channel, no TLS: local demos only")
    sm.set_defaults(func=_reported(_submit))

    ca = sub.add_parser(
        "calibrate",
        help="audit plausible deniability (N_w, S_w) over ε and recommend ε",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ca.add_argument("--epsilons", default="5,10,15,20,25,30", help="comma-separated ε grid (per word)")
    ca.add_argument("--draws", type=positive(int), default=100, help="perturbations per audited word (K)")
    ca.add_argument(
        "--words", default=None, help="comma-separated words to audit (default: a uniform sample per frequency band)"
    )
    ca.add_argument("--per-band", type=positive(int), default=25, help="words sampled per frequency band")
    ca.add_argument(
        "--embedding",
        default="default",
        help="'default' (GloVe 6B 50d), a cached embedding directory or a GloVe/word2vec/fastText file",
    )
    ca.add_argument("--vocab-size", type=positive(int), default=50_000, help="vocabulary size (most frequent words)")
    ca.add_argument(
        "--mechanism",
        default="laplace",
        choices=list(LOCAL_KINDS),
        help=f"perturbation mechanism to calibrate ({local_kinds_help()})",
    )
    ca.add_argument(
        "--tau",
        type=positive(float),
        default=None,
        help="truncated: admissible radius τ (default: median 10-NN distance)",
    )
    ca.add_argument("--k", type=positive(int), default=20, help="knn: number of nearest words kept")
    ca.add_argument("--target", type=float, default=0.5, help="recommend the largest ε with median N_w ≤ target")
    ca.add_argument("--seed", type=int, default=None, help="seed (for reproducible audits only; default OS CSPRNG)")
    ca.add_argument("--json", action="store_true", help="print the table as one JSON object")
    ca.set_defaults(func=_reported(_calibrate))

    info = sub.add_parser(
        "embedding-info",
        help="an embedding's id and exact diameter (what the curator publishes as embedding and word_distance_bound)",
    )
    info.add_argument(
        "--embedding",
        default="default",
        help="'default' (GloVe 6B 50d), a cached embedding directory or a GloVe/word2vec/fastText file",
    )
    info.add_argument("--vocab-size", type=positive(int), default=50_000, help="vocabulary size (most frequent words)")
    info.set_defaults(func=_reported(_embedding_info))


class _Repeated(argparse.Action):
    """An option that may be given several times: the list of its values (its default until it is given)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        given = getattr(namespace, self.dest)
        setattr(namespace, self.dest, [*given, values] if isinstance(given, list) else [values])


def _reported(command: Command) -> Command:
    """``command`` with the SDK's errors as one line on stderr and exit code 2 (``lac.common.cli``)."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except LacClientError as e:
            raise SystemExit(f"error: {type(e).__name__}: {e}") from None

    return run


def _lines(path: Path) -> list[tuple[int, str]]:
    """The non-blank lines of ``path`` ("-": stdin) with their line numbers."""
    text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    return [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def _describe(emb: Embedding) -> str:
    return f"embedding {emb.name}: {emb.size} words, d={emb.dim}, diameter {emb.diameter():.6g}"


def _line_list(numbers: Iterable[int]) -> str:
    """``[2, 3, 4, 7]`` as "lines 2-4, 7" ("line 7" for one)."""
    ns = sorted(set(numbers))
    runs: list[list[int]] = []
    for n in ns:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    spans = [f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs]
    return ("line " if len(ns) == 1 else "lines ") + ", ".join(spans)


def _localize(
    args: argparse.Namespace, deployment: Deployment | None = None, on_unsupported: Literal["raise", "skip"] = "raise"
) -> list[tuple[int, PrivatizedReport | None]]:
    """The file's lines privatized, with their line numbers: one report per line (several for a long line
    split), or None for a line with no word with ``on_unsupported="skip"`` ("raise": UnsupportedText naming
    it). Lines with other letters besides words are named on stderr."""
    from lac.client.calibrate import mechanism_factory
    from lac.client.formats import open_embedding
    from lac.client.localizer import Localizer
    from lac.common.deployment import Deployment
    from lac.common.progress import Progress

    numbered = _lines(args.file)
    lines = [line for _, line in numbered]
    emb = open_embedding(args.embedding, args.vocab_size)
    print(_describe(emb), file=sys.stderr)
    preset = PRESETS[args.preset or DEFAULT_PRESET]
    if args.epsilon is not None:
        epsilon = args.epsilon
    elif deployment is None:
        epsilon = preset.epsilon
    else:
        epsilon = min(deployment.epsilon_per_word, preset.epsilon) if args.preset else deployment.epsilon_per_word
    calibrated = args.epsilon is None and epsilon == preset.epsilon
    mech = mechanism_factory(args.mechanism, emb, tau=args.tau, k=args.k)(epsilon)
    if deployment is None and getattr(args, "max_words", None):
        deployment = Deployment(
            mechanism=mech.name,
            epsilon_per_word=epsilon,
            embedding=emb.name,
            word_distance_bound=mech.local_epsilon(1, emb.diameter()) / epsilon,
            max_report_words=args.max_words,
        )
    localizer = Localizer(emb, mech, deployment=deployment, long_text=args.long_text, calibrated=calibrated)
    print(f"nearest-word search: exact, {localizer.search_backend} backend", file=sys.stderr)
    bar = Progress("privatizing", len(lines))
    out: list[tuple[int, PrivatizedReport | None]] = []
    partly: list[int] = []
    for i in range(0, len(lines), 256):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", PartlyUnsupportedText)
            try:
                chunk = localizer.privatize_many(lines[i : i + 256], on_unsupported=on_unsupported)
            except UnsupportedText as e:
                raise UnsupportedText(f"line {numbered[i + e.index][0]} of {args.file}") from None
        for w in caught:
            if isinstance(w.message, PartlyUnsupportedText):
                partly.extend(numbered[i + j][0] for j in w.message.indexes)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        after = i  # entries are in line order: a skipped line's None stands for the line after the last seen
        for r in chunk:
            text = i + r.text_index if r is not None else after
            out.append((numbered[text][0], r))
            after = text + 1
        bar.update(min(256, len(lines) - i))
    bar.close()
    if partly:
        one = len(set(partly)) == 1
        print(
            f"warning: {_line_list(partly)} of {args.file} {'has' if one else 'have'} letters or digits outside a-z "
            f"and 0-9 (another script, or accented letters such as é): only {'its' if one else 'their'} words of a-z "
            "and 0-9 were privatized",
            file=sys.stderr,
        )
    return out


def _privatize(args: argparse.Namespace) -> int:
    for _, r in _localize(args):
        assert r is not None  # (unsupported lines raised)
        if args.json:
            print(
                json.dumps(
                    {
                        "sentences": r.sentences,
                        "n_words": r.n_words,
                        "mechanism": r.mechanism,
                        "epsilon_per_word": r.epsilon_per_word,
                        "embedding": r.embedding,
                        "statement": r.statement,
                        "metadata": r.metadata,
                    },
                    ensure_ascii=False,
                )
            )
        else:
            print(" ".join(" ".join(s) for s in r.sentences))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from lac.client import calibrate as cal
    from lac.client.formats import open_embedding
    from lac.common.rng import generator

    try:
        epsilons = cal.parse_floats(args.epsilons)
    except ValueError as e:
        raise SystemExit(f"error: --epsilons: {e}") from None
    emb = open_embedding(args.embedding, args.vocab_size)
    rng = generator(args.seed)
    bands = band_of = None
    ids: list[int] | np.ndarray
    if args.words:
        words = [w.strip() for w in args.words.split(",") if w.strip()]
        missing = [w for w in words if w not in emb.index]
        if missing:
            raise SystemExit(f"error: not in the vocabulary of {emb.name}: {', '.join(missing)}")
        ids = [emb.index[w] for w in words]
    else:
        bands = cal.default_bands(emb.size)
        ids, band_of = cal.choose_words(emb, args.per_band, rng, bands)
    factory = cal.mechanism_factory(args.mechanism, emb, tau=args.tau, k=args.k)
    rows = cal.calibrate(
        emb, factory, epsilons, ids, args.draws, rng, bands=bands, band_of=band_of, report_words=bool(args.words)
    )
    rec = cal.recommend(rows, args.target)
    if args.json:
        print(
            cal.to_json(
                rows, embedding=emb, mechanism=args.mechanism, draws=args.draws, target=args.target, recommended=rec
            )
        )
        return 0
    print(f"{_describe(emb)}; mechanism {args.mechanism}; {len(ids)} words x {args.draws} draws")
    print(cal.format_table(rows, args.draws))
    if rec is None:
        print(f"no ε in the grid has median N_w <= {args.target:g}; try smaller values")
    else:
        print(f"recommended ε = {rec:g} (largest in the grid with median N_w <= {args.target:g})")
    return 0


def _embedding_info(args: argparse.Namespace) -> int:
    from lac.client.formats import open_embedding

    emb = open_embedding(args.embedding, args.vocab_size)
    print(json.dumps({"embedding": emb.name, "size": emb.size, "dim": emb.dim, "diameter": emb.diameter()}))
    return 0


def _tokens(args: argparse.Namespace) -> list[str | None]:
    """The clients' bearer tokens: ``--tokens`` (JSON lines), ``--token-file`` or ``$LAC_CLIENT_TOKEN``."""
    import os

    if args.tokens is None:
        return [args.token_file.read_text().strip() if args.token_file else os.environ.get("LAC_CLIENT_TOKEN")]
    tokens: list[str | None] = []
    for n, line in enumerate(args.tokens.read_text(encoding="utf-8").splitlines(), 1):
        try:
            entry = json.loads(line) if line.strip() else {}
            if entry and entry.get("role", "client") == "client":  # (an operator's token cannot submit)
                tokens.append(str(entry["token"]))
        except (ValueError, AttributeError, KeyError):
            raise SystemExit(f'error: --tokens {args.tokens}: line {n} is not a JSON object with a "token"') from None
    if not tokens:
        raise SystemExit(f'error: --tokens {args.tokens}: no client\'s "token" in it')
    return tokens


def _submit(args: argparse.Namespace) -> int:
    from lac.client.submit import ShufflerClient
    from lac.common import tls
    from lac.common.envelope import CuratorPublicKey

    if str(args.file) != "-" and not args.file.is_file():
        raise SystemExit(f"error: {args.file}: no such file")  # before dialling the shuffler
    try:
        channel_tls = tls.client_tls(args.ca, args.cert, args.key, insecure=args.insecure, name="lac client submit")
        if args.curator_key is None and not args.insecure:
            raise ValueError("--curator-key is required (or --insecure for a local demo)")
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    key = CuratorPublicKey.load(args.curator_key) if args.curator_key else None
    tokens = _tokens(args)
    with ShufflerClient(
        args.server,
        key,
        channel_tls,
        token=tokens[0],
        insecure=args.insecure,
        timeout=args.timeout,
        attempts=args.attempts,
        connect_timeout=args.connect_timeout,
    ) as client:
        deployment = client.deployment()
        if args.insecure:  # once the shuffler answered, so that a failure to reach it stays one line
            print("WARNING: --insecure: reports travel in plaintext without TLS; local demos only", file=sys.stderr)
        print(f"deployment: {deployment.report_guarantee().statement()}", file=sys.stderr)
        try:
            entries = _localize(args, deployment, on_unsupported="skip")
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
        acked, refusal = _send(client, [(n, r) for n, r in entries if r is not None], tokens)
    return _summary(args, entries, acked, refusal, several=len(tokens) > 1)


def _send(
    client: ShufflerClient, reports: list[tuple[int, PrivatizedReport]], tokens: list[str | None]
) -> tuple[list[tuple[int, ReportAck | None]], QuotaExceeded | None]:
    """Submit ``reports`` (line number, report), the lines dealt to ``tokens`` in turn (a line's reports to one
    client): each with its ack, None where the quota refused it, and the last quota refusal."""
    order = {n: k for k, n in enumerate(dict.fromkeys(n for n, _ in reports))}
    acked: list[tuple[int, ReportAck | None]] = []
    refusal = None
    for j, token in enumerate(tokens):
        mine = [(n, r) for n, r in reports if order[n] % len(tokens) == j]
        if not mine:
            continue
        try:
            acks = list(client.submit([r for _, r in mine], token=token))
        except QuotaExceeded as e:
            acks, refusal = list(e.acks), e
        acked += [(n, acks[k] if k < len(acks) else None) for k, (n, _) in enumerate(mine)]
    return acked, refusal


def _summary(
    args: argparse.Namespace,
    entries: list[tuple[int, PrivatizedReport | None]],
    acked: list[tuple[int, ReportAck | None]],
    refusal: QuotaExceeded | None,
    several: bool,
) -> int:
    """Print what was stored and why the rest was not; the exit status (0, or ``PARTLY_STORED``)."""
    from lac.client.acks import AckStatus

    skipped = [n for n, r in entries if r is None]
    refused = sorted({n for n, a in acked if a is None})
    stored = sorted({n for n, _ in acked} - set(refused))
    duplicates = sum(a is not None and a.status == AckStatus.DUPLICATE for _, a in acked)
    reports = sum(a is not None for _, a in acked)
    again = f" ({duplicates} of them already stored by an earlier attempt of this run)" if duplicates else ""
    lines = len({n for n, _ in entries})
    print(f"stored {len(stored)} of {lines} line{'s' * (lines != 1)} ({reports} report{'s' * (reports != 1)}){again}")
    if refusal is not None:
        wait = refusal.retry_after or 0.0
        opens = datetime.fromtimestamp(time.time() + wait, UTC).strftime("%Y-%m-%d %H:%M UTC")
        partly = sorted({n for n, a in acked if a is not None} & set(refused))
        part = f" ({_line_list(partly)} only in part)" if partly else ""
        others = (
            "more clients in the --tokens file"
            if several
            else "other clients with --tokens FILE (`lac dev up --clients N` writes N clients' tokens to "
            "DIR/clients.jsonl on its first start; `lac shuffler add-clients --count N --state-dir DIR/shuffler --out "
            "FILE` registers more)"
        )
        print(
            f"not stored: {_line_list(refused)}{part}: refused by the shuffler ({refusal.status_details}). Submit "
            f"these lines again after {opens} (not the lines stored: each submission is a new report), or as "
            f"{others}"
        )
    if skipped:
        print(
            f"skipped: {_line_list(skipped)} of {args.file}: no word to privatize (words are made of the letters "
            "a-z and digits 0-9): nothing to submit"
        )
    return PARTLY_STORED if refused else 0
