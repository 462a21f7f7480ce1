"""Runs the selected experiments, writes ``results.json``, the plots and ``report.md``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from . import (
    authorship,
    downstream,
    e2e,
    language_model,
    localizer,
    membership,
    paper_figures,
    pipeline,
    report,
    targets,
)
from . import data as eval_data
from .config import EvalConfig

SECTIONS = ("figures", "table1", "membership", "localizer", "pipeline", "targets", "e2e", "authorship", "downstream")


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(type(o).__name__)


def run(cfg: EvalConfig, out: Path, preset: str = "custom", sections=SECTIONS) -> dict:
    """Run the data step and the selected ``sections`` into ``out``; returns the results written to results.json."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    seeds = np.random.SeedSequence(cfg.seed).spawn(len(SECTIONS) + 1)
    rngs = {name: np.random.default_rng(s) for name, s in zip(("data",) + SECTIONS, seeds)}
    steps = ["data", *[s for s in SECTIONS if s in sections]]
    res: dict = {"preset": preset, "config": cfg.as_dict(), "timings": timings}

    def step(name: str, fn):
        i = steps.index(name) + 1
        _say(f"[{i}/{len(steps)}] {name}")
        t = time.perf_counter()
        value = fn()
        timings[name] = time.perf_counter() - t
        return value

    data = step("data", lambda: eval_data.load(cfg, rngs["data"]))
    res["data"] = data.sizes
    _say(
        f"  {data.sizes['train_users']:,} training users, {data.sizes['heldout_users']:,} held out; "
        f"release vocabulary {data.sizes['vocab_size']:,} public trigrams"
    )
    if "figures" in sections:

        def figures():
            r = rngs["figures"]
            f1 = paper_figures.figure1(data, out, r)
            return {
                "fig1": f1,
                "fig2": paper_figures.figure2(data, out, r),
                "fig3": paper_figures.figure3(data, out, r),
                "fig4": paper_figures.figure4(data, out, r),
                "fig5": paper_figures.figure5(data, out, r, f1),
            }

        res["figures"] = step("figures", figures)
    if "table1" in sections:
        res["table1"] = step("table1", lambda: language_model.run(data))
    if "membership" in sections:
        res["membership"] = step("membership", lambda: membership.run(data, out, rngs["membership"]))
    if "localizer" in sections:
        res["localizer"] = step("localizer", lambda: localizer.run(data, out, rngs["localizer"]))
    if "pipeline" in sections:
        res["pipeline"] = step("pipeline", lambda: pipeline.run(data, out, rngs["pipeline"]))
    if "targets" in sections:
        res["targets"] = step("targets", lambda: targets.run(cfg, out, rngs["targets"]))
    if "e2e" in sections:
        res["e2e"] = step("e2e", lambda: e2e.run_e2e(cfg, out, rngs["e2e"]))
    if "authorship" in sections:
        res["authorship"] = step("authorship", lambda: authorship.run(cfg, out, rngs["authorship"]))
    if "downstream" in sections:
        res["downstream"] = step("downstream", lambda: downstream.run(cfg, out, rngs["downstream"]))
    res["wall_time_s"] = time.perf_counter() - t0
    (out / "results.json").write_text(json.dumps(res, indent=1, default=_json_default), encoding="utf-8")
    report.write(out / "report.md", res)
    print(report.summary(res))
    print(f"report: {out / 'report.md'}, plots and results.json in {out} ({res['wall_time_s']:.0f} s)")
    return res
