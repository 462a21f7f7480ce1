"""Where a release's aggregations run: over the stored reports one segment at a time on this
machine (``LocalEngine``, the default) or on Apache Spark (``lac.curator.engines.spark``, optional).

Every aggregation a release needs is a fold over segments: a module-level function of one
segment's ``ReportItems`` (picklable, so an executor can run it) gives a partial result, and
partial results are combined *in segment order* on the driver. Sums of integer counts are exact
in any order; the posterior's real-valued weights are summed in the same order by every engine,
so all engines give bit-identical releases. Memory on the driver is a few partial results plus
the accumulator; the segments themselves are never all in memory.

The folds (``lac.curator.release.building``; a release runs them through ``lac.curator.runner.run.run``):

* posterior: ``WeightedTotals`` (one pass);
* BayesianDP and the Laplace baselines: ``CountStats`` of the W-capped, C-clamped counts over
  the vocabulary (one pass), and for the brute-force sensitivity the largest
  ``bruteforce_sq_dists`` over all reports (a second pass, with the first pass's totals).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Protocol, TypeVar

from lac.common.checks import check_int
from lac.curator.base.lifeline import die_with
from lac.curator.base.ngrams import ReportItems

__all__ = ["Engine", "LocalEngine", "LOCAL", "Parts", "ENGINES", "create_engine"]

T = TypeVar("T")
P = TypeVar("P")


class Parts(Protocol):
    """A source of reports in parts (segments): picklable handles, loaded one at a time."""

    def parts(self) -> Sequence[Any]:
        """The parts, in a fixed order."""

    def load(self, part: Any) -> ReportItems:
        """The reports of one part."""


class Engine(Protocol):
    """Runs folds over the parts of a release."""

    name: str

    def fold(self, reports: Parts, fn: Callable[[ReportItems], P], combine: Callable[[T, P], T], initial: T) -> T:
        """``combine(... combine(combine(initial, fn(b₁)), fn(b₂)) ..., fn(bₖ))`` over the parts in order."""


_TASK: tuple[Callable, Callable] | None = None


def _install(payload: bytes, owner: int) -> None:
    global _TASK
    die_with(owner)
    _TASK = pickle.loads(payload)


def _apply(part: Any) -> Any:
    if _TASK is None:
        raise RuntimeError("the engine worker was not initialised")
    fn, load = _TASK
    return fn(load(part))


class LocalEngine:
    """This machine. ``workers`` = 1: this process, one part at a time (bounded memory); more:
    a pool of that many worker processes (forkserver: safe next to gRPC's threads; each ends with
    this process, ``lac.curator.base.lifeline``) each loading and mapping whole parts, the results
    combined here in part order."""

    name = "local"

    def __init__(self, workers: int = 1):
        check_int(workers, "workers")
        self.workers = workers

    def fold(self, reports: Parts, fn: Callable[[ReportItems], P], combine: Callable[[T, P], T], initial: T) -> T:
        parts = list(reports.parts())
        acc = initial
        if self.workers == 1 or len(parts) < 2:
            for part in parts:
                acc = combine(acc, fn(reports.load(part)))
            return acc
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["lac.curator.release.building"])
        payload = pickle.dumps((fn, reports.load), protocol=pickle.HIGHEST_PROTOCOL)
        with ProcessPoolExecutor(
            min(self.workers, len(parts)), mp_context=ctx, initializer=_install, initargs=(payload, os.getpid())
        ) as pool:
            for result in pool.map(_apply, parts):  # results in part order
                acc = combine(acc, result)
        return acc

    def __repr__(self) -> str:
        return f"LocalEngine(workers={self.workers})"


LOCAL = LocalEngine()


ENGINES = ("local", "spark")


def create_engine(kind: str = "local", spark_master: str = "", workers: int = 1) -> Engine:
    """The engine an operator selected: ``local`` (``workers`` processes) or ``spark`` on
    ``spark_master`` (``lac.curator.engines.spark``; needs the ``spark`` extra)."""
    if kind == "local":
        return LOCAL if workers == 1 else LocalEngine(workers)
    if kind == "spark":
        if not spark_master:
            raise ValueError(
                "the spark engine needs a master: local[N], spark://host:port, yarn, ... or "
                "sc://host:port (Spark Connect)"
            )
        from lac.curator.engines.spark import SparkEngine

        return SparkEngine.start(spark_master)
    raise ValueError(f"unknown engine {kind!r}; available: {', '.join(ENGINES)}")
