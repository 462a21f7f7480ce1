#!/usr/bin/env python3
"""Release at scale over stored Parquet segments: streaming (``lac.curator.engines.local``) vs the
in-memory path (every segment read into one counts matrix, then the mechanism) — SYNTHETIC Zipf
data, a speed and memory benchmark only, not language.

    python benchmarks/bench_release_scale.py --users 10000000 --items 50000 [--engines stream,stream:2,memory]

The data: each report holds ~Poisson(per_user) distinct items drawn Zipf(1.1)-like from a vocabulary
of ``--items`` unigram items, written as segments of ``--reports-per-segment`` reports (the
curator's format, ``lac.curator.store.segments``). Each engine runs in its own process; its peak memory
is the largest total RSS of that process and all its descendants (worker processes, Spark's JVM
and Python workers), sampled every 0.1 s (pages shared between processes count once per process, so
this is an upper bound): BayesianDP with the brute-force γ (two passes), BayesianDP sound (one pass) and the
default posterior (one pass). γ must be equal across engines (printed and checked).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

MECHANISMS = "bayesian-bruteforce,bayesian-sound,posterior"
ENGINES = ("stream", "stream:N (N worker processes)", "memory", "spark")


def vocabulary(n_items: int):
    from lac.curator.base.ngrams import NgramVocabulary

    rng = np.random.default_rng(7)
    return NgramVocabulary(tuple(f"w{j}" for j in range(n_items)), rng.poisson(5.0, n_items) + 1.0, 1)


def write_segments(root: Path, users: int, items: int, per_user: float, per_segment: int) -> list[Path]:
    """Synthetic segments (one file per ``per_segment`` reports), generated segment by segment."""
    from lac.curator.base.ngrams import ReportItems
    from lac.curator.store import segments

    rng = np.random.default_rng(1)
    p = 1.0 / np.arange(1, items + 1) ** 1.1
    cdf = np.cumsum(p / p.sum())
    names = tuple(f"w{j}" for j in range(items))
    paths = []
    for k, start in enumerate(range(0, users, per_segment)):
        n = min(per_segment, users - start)
        sizes = np.minimum(rng.poisson(per_user, n), items)
        cols = np.minimum(np.searchsorted(cdf, rng.random(int(sizes.sum()))), items - 1)
        rows = np.repeat(np.arange(n, dtype=np.int64), sizes)
        keys = np.unique(rows * items + cols)  # distinct items per report (order: by item id)
        rows, cols = keys // items, keys % items
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
        block = ReportItems(indptr, cols.astype(np.int32), np.ones(cols.size, dtype=np.int32), names)
        path = root / f"window={k // 10}" / f"bench-{k:05d}.parquet"
        segments.write(path, block, {"batch_id": f"bench-{k}", "synthetic": True})
        paths.append(path)
    return paths


def run_engine(engine: str, root: Path, items: int, master: str, mechanisms: str = MECHANISMS) -> dict:
    """One engine's releases over the segments under ``root`` (in this process)."""
    from lac.common.privacy import PrivacyUnit
    from lac.curator.engines.local import LOCAL
    from lac.curator.mechanisms import ReleaseSpec
    from lac.curator.release.building import PublicCaps, StoredReports
    from lac.curator.runner.run import run

    vocab = vocabulary(items)
    paths = sorted(root.rglob("*.parquet"))
    reports = StoredReports(paths, vocab)
    caps = PublicCaps(W=100, C=1, count_clip=10_000_000)
    specs = {
        "bayesian-bruteforce": ReleaseSpec(epsilon=1.0, mechanism="bayesian", sensitivity="bruteforce"),
        "bayesian-sound": ReleaseSpec(epsilon=1.0, mechanism="bayesian"),
        "posterior": ReleaseSpec(epsilon=1.0, discovery=False),
    }
    specs = {k: v for k, v in specs.items() if k in mechanisms.split(",")}
    out = {"engine": engine}
    eng = LOCAL
    if engine.startswith("stream:"):  # stream:N = N worker processes
        from lac.curator.engines.local import LocalEngine

        eng = LocalEngine(workers=int(engine.split(":")[1]))
    if engine == "spark":
        from lac.curator.engines.spark import SparkEngine

        eng = SparkEngine.start(master)
    for name, spec in specs.items():
        t = time.perf_counter()
        if engine == "memory":
            U = reports.vocab_counts(caps.C, caps.W)  # every segment into one matrix
            r = run(U, vocab, spec, caps, PrivacyUnit.report(), np.random.default_rng(0))
            del U
        else:
            r = run(reports, vocab, spec, caps, PrivacyUnit.report(), np.random.default_rng(0), engine=eng)
        out[name] = {
            "seconds": time.perf_counter() - t,
            "gamma": r.gamma,
            "sigma": r.sigma,
            "log_probs_sha": __import__("hashlib").sha256(r.log_probs.tobytes()).hexdigest()[:16],
        }
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out


class TreeRss:
    """Samples the total RSS of process ``pid`` and its descendants (from /proc) until ``stop``."""

    def __init__(self, pid: int, every: float = 0.1):
        self.pid, self.every, self.peak = pid, every, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> int:
        parent, rss = {}, {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/status") as f:
                    for line in f:
                        if line.startswith("PPid:"):
                            parent[int(d)] = int(line.split()[1])
                        elif line.startswith("VmRSS:"):
                            rss[int(d)] = int(line.split()[1]) * 1024
            except OSError:
                continue
        total = 0
        for p, r in rss.items():
            q = p
            while q and q != self.pid:
                q = parent.get(q, 0)
            total += r if q == self.pid else 0
        return total

    def _run(self) -> None:
        while not self._done.wait(self.every):
            self.peak = max(self.peak, self._sample())

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=1_000_000)
    ap.add_argument("--items", type=int, default=50_000)
    ap.add_argument("--per-user", type=float, default=25.0)
    ap.add_argument("--reports-per-segment", type=int, default=100_000)
    ap.add_argument("--engines", default="stream,memory", help=f"comma-separated, of {', '.join(ENGINES)}")
    ap.add_argument("--spark-master", default="local[2]")
    ap.add_argument("--mechanisms", default=MECHANISMS, help=f"comma-separated, of {MECHANISMS}")
    ap.add_argument("--dir", default=None, help="write the segments in a temporary directory under DIR")
    ap.add_argument(
        "--keep",
        default=None,
        metavar="DIR",
        help="write the segments into DIR and keep them; reused by a later run with the same data options",
    )
    ap.add_argument(
        "--memory-limit-gib",
        type=float,
        default=16.0,
        help="address-space limit of the in-memory engine's process: past it, it fails (reported)",
    )
    ap.add_argument("--run", default=None, help=argparse.SUPPRESS)  # internal: one engine, in a child process
    a = ap.parse_args()
    if a.run:
        print(json.dumps(run_engine(a.run, Path(a.dir), a.items, a.spark_master, a.mechanisms)))
        return
    with contextlib.ExitStack() as stack:
        root = Path(a.keep) if a.keep else Path(stack.enter_context(tempfile.TemporaryDirectory(dir=a.dir)))
        spec = json.dumps(
            {"users": a.users, "items": a.items, "per_user": a.per_user, "per_segment": a.reports_per_segment}
        )
        t = time.perf_counter()
        if a.keep and (root / "data.json").exists() and (root / "data.json").read_text() == spec:
            paths, how = sorted(root.rglob("*.parquet")), "reused"
        else:
            if a.keep:
                shutil.rmtree(root, ignore_errors=True)
                root.mkdir(parents=True)
            paths = write_segments(root, a.users, a.items, a.per_user, a.reports_per_segment)
            (root / "data.json").write_text(spec)
            how = f"written in {time.perf_counter() - t:.0f} s"
        size = sum(p.stat().st_size for p in paths)
        print(
            f"SYNTHETIC Zipf data: {a.users:,} reports x {a.items:,} items, ~{a.per_user:g} items per report, "
            f"{len(paths)} segments, {size / 2**20:,.0f} MiB on disk ({how})",
            flush=True,
        )
        results = []
        for engine in filter(None, a.engines.split(",")):
            cmd = [
                sys.executable,
                __file__,
                "--run",
                engine,
                "--dir",
                str(root),
                "--items",
                str(a.items),
                "--spark-master",
                a.spark_master,
                "--mechanisms",
                a.mechanisms,
            ]
            t = time.perf_counter()
            limit = int(a.memory_limit_gib * 2**30) if engine == "memory" else None
            proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONHASHSEED": "0"},
                preexec_fn=(lambda lim=limit: resource.setrlimit(resource.RLIMIT_AS, (lim, lim))) if limit else None,
            )
            sampler = TreeRss(proc.pid)
            stdout, stderr = proc.communicate()
            tree_peak = sampler.stop()
            p = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
            if p.returncode != 0:
                tail = (p.stderr.strip().splitlines() or ["?"])[-1]
                print(
                    f"{engine:>7}: FAILED after {time.perf_counter() - t:.0f} s (exit {p.returncode}): {tail}",
                    flush=True,
                )
                continue
            r = json.loads(p.stdout.strip().splitlines()[-1])
            r["peak_rss_gib"] = max(r["peak_rss_gib"], tree_peak / 2**30)
            results.append(r)
            print(
                f"{engine:>7}: "
                + "; ".join(
                    f"{k} {v['seconds']:.1f} s (γ={v['gamma']:.6g})" for k, v in r.items() if isinstance(v, dict)
                )
                + f"; peak RSS {r['peak_rss_gib']:.2f} GiB (process tree)",
                flush=True,
            )
        for name in a.mechanisms.split(",") if results else ():
            values = {(r[name]["gamma"], r[name]["sigma"], r[name]["log_probs_sha"]) for r in results}
            print(
                f"{name}: {'identical' if len(values) == 1 else 'DIFFERENT'} across {len(results)} engine(s) "
                f"(γ, σ, released log-probabilities)"
            )


if __name__ == "__main__":
    main()
