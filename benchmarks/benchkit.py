"""What several benchmarks share (imported by the ``bench_*.py`` scripts next to it; not a benchmark).

* ``reports``: real texts cut into reports of at most L words, as clients split longer texts;
* ``real_reports``: the same from the simulated users' texts or the fortunes;
* ``sealed_payloads``: reports HPKE-sealed to a curator key (on every core), serialized;
* ``cpu_seconds``: CPU time of processes, from Linux /proc;
* ``load``: the load average, for the line every benchmark prints with its numbers.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor

from lac.common import envelope
from lac.common.deployment import Deployment
from lac.common.serde import mechanism_id
from lac.common.text import sentences
from lac.common.v1 import reports_pb2


def reports(texts: list[str], n: int, max_words: int) -> list[list[list[str]]]:
    """``n`` reports of at most ``max_words`` words from ``texts``, in order (repeated as needed)."""
    out: list[list[list[str]]] = []
    while True:
        for text in texts:
            report: list[list[str]] = []
            words = 0
            for s in sentences(text):
                while s:
                    take = s[: max_words - words]
                    report.append(take)
                    words += len(take)
                    s = s[len(take) :]
                    if words == max_words:
                        out.append(report)
                        report, words = [], 0
                        if len(out) == n:
                            return out
            if report:
                out.append(report)
                if len(out) == n:
                    return out


def real_reports(n: int, kind: str = "users") -> list[list[list[str]]]:
    """``n`` reports of real text, words NOT perturbed: the simulated users' texts (``lac.suite.data.user_texts``,
    ~390k, one per user) or the BSD fortunes (``kind="fortunes"``), mixed in a fixed random order and cut at
    the default deployment's L words (repeated in order when more are asked for than there are)."""
    import numpy as np

    from lac.suite.data import load_users, user_texts

    source = user_texts(0) if kind == "users" else load_users()
    source = [source[i] for i in np.random.default_rng(0).permutation(len(source))]  # the sources mixed
    return reports(source, n, Deployment().max_report_words)


_KEY: list[envelope.CuratorPublicKey] = []  # the key a sealing worker seals to (set before it forks)


def _seal_part(part: list[list[list[str]]]) -> list[bytes]:
    d = Deployment()
    lp = reports_pb2.LocalPrivacy(
        mechanism=mechanism_id(d.mechanism), epsilon_per_word=d.epsilon_per_word, embedding=d.embedding
    )
    return [
        envelope.seal(
            reports_pb2.ReportContent(
                report_id=os.urandom(envelope.REPORT_ID_BYTES),
                local_privacy=lp,
                sentences=[reports_pb2.Sentence(tokens=s) for s in r],
            ),
            _KEY[0],
        ).SerializeToString()
        for r in part
    ]


def sealed_payloads(texts: list[list[list[str]]], key: envelope.CuratorPublicKey, workers: int = 1) -> list[bytes]:
    """Each report (its sentences) sealed to ``key`` as the SDK seals it (fresh report id, the default
    deployment's local parameters), serialized ``SealedPayload`` bytes, in order; on ``workers`` forked
    processes (call it before any gRPC channel or server exists in this process)."""
    _KEY[:] = [key]
    if workers <= 1:
        return _seal_part(texts)
    step = -(-len(texts) // (4 * workers))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        parts = pool.map(_seal_part, [texts[i : i + step] for i in range(0, len(texts), step)])
        return [p for part in parts for p in part]


def cpu_seconds(pids: list[int], own: bool = True) -> float:
    """CPU time (user + system) of ``pids`` (Linux /proc; they need not be our children), plus this
    process's with ``own``."""
    total = time.process_time() if own else 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def load() -> str:
    """The load average (1, 5, 15 min) as printed with the numbers."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())
