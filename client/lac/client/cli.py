"""``lac client privatize|submit``: the SDK from the command line.

Input files hold one message per line (a user's text). Randomness comes from the OS
CSPRNG; no noise vectors or noisy embeddings are ever printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser("client", help="the localizer SDK: privatize text, submit reports")
    sub = p.add_subparsers(dest="client_command", metavar="ACTION", required=True)

    def common(q):
        q.add_argument("file", type=Path, help="text file, one message per line ('-' for stdin)")
        q.add_argument("--epsilon", type=float, default=15.0, help="metric-DP ε per word")
        q.add_argument("--vocab-size", type=int, default=50_000, help="GloVe vocabulary (most frequent words)")

    pr = sub.add_parser("privatize", help="print each line privatized (one output line per input line)",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common(pr)
    pr.add_argument("--json", action="store_true", help="one JSON report per line, with its guarantee")
    pr.set_defaults(func=_privatize)
    sm = sub.add_parser("submit", help="privatize each line and submit it as one report to a shuffler",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common(sm)
    sm.add_argument("--shuffler", default="127.0.0.1:50051", help="shuffler address host:port")
    sm.set_defaults(func=_submit)


def _lines(path: Path) -> list[str]:
    text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def _localize(args):
    from lac.client.embedding import glove_default
    from lac.client.localizer import Localizer
    from lac.client.mechanisms import MultivariateLaplace
    from lac.common.progress import Progress

    lines = _lines(args.file)
    localizer = Localizer(glove_default(args.vocab_size), MultivariateLaplace(args.epsilon))
    bar = Progress("privatizing", len(lines))
    reports = []
    for i in range(0, len(lines), 256):
        reports.extend(localizer.privatize_many(lines[i:i + 256]))
        bar.update(min(256, len(lines) - i))
    bar.close()
    return reports


def _privatize(args) -> int:
    for r in _localize(args):
        if args.json:
            print(json.dumps({"sentences": r.sentences, "n_words": r.n_words,
                              "n_out_of_vocabulary": r.n_out_of_vocabulary, "mechanism": r.mechanism,
                              "epsilon_per_word": r.epsilon_per_word, "embedding": r.embedding,
                              "statement": r.statement}))
        else:
            print(" ".join(" ".join(s) for s in r.sentences))
    return 0


def _submit(args) -> int:
    from lac.client.submit import ShufflerClient
    from lac.common.v1 import shuffler_pb2

    reports = _localize(args)
    with ShufflerClient(args.shuffler) as client:
        acks = client.submit(reports)
    stored = sum(a.status == shuffler_pb2.ACK_STATUS_STORED for a in acks)
    print(f"submitted {len(acks)} reports: {stored} stored, {len(acks) - stored} already stored")
    return 0
