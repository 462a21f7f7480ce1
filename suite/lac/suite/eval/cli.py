"""``lac eval``: command-line entry (registered in the ``lac.commands`` entry-point group)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .config import PRESETS
from .runner import SECTIONS


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval",
        help="reproduce the BayesianDP paper's results on real text and evaluate the pipeline",
        description="Writes PNG plots, results.json and report.md into --out. The defaults (200k and 1.02M users) "
        "take hours; --quick is a smaller configuration (about 5 minutes on 2 cores the first time, which prepares "
        "the user corpus and samples the default deployment's local channel; about 4 minutes after that).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="output folder (created)")
    p.add_argument("--quick", action="store_true", help="the 'quick' preset: fewer points, runs and samples")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="start from this preset (overrides --quick)")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    p.add_argument("--seed", type=int, default=None, help="evaluation seed (simulation only)")
    p.add_argument("--runs", type=int, default=None, help="independent releases per point")
    p.add_argument("--users", dest="max_users", type=int, default=None, help="use at most this many users")
    p.add_argument("--vocab-size", type=int, default=None, help="public trigrams in the release vocabulary")
    p.add_argument("--lm-vocab-size", type=int, default=None, help="public n-grams (orders 1-3) for Table 1")
    p.add_argument("--item-cap", dest="W", type=int, default=None, help="W: per-user item cap (figures 1-6)")
    p.add_argument("--decay-slope", dest="S", type=float, default=None, help="BayesianDP decay slope S")
    p.add_argument("--rho", type=float, default=None, help="BayesianDP weight ρ")
    p.add_argument("--delta", type=float, default=None, help="δ of (ε, δ) mechanisms")
    p.add_argument("--epsilons", type=_floats, default=None, help="ε grid of figure 1 (comma-separated)")
    p.add_argument("--mi-epsilons", type=_floats, default=None, help="ε grid of the membership attack")
    p.add_argument("--mi-samples", type=int, default=None, help="release pairs per ε in the attack")
    p.add_argument("--local-epsilons", type=_floats, default=None, help="per-word local ε grid")
    p.add_argument("--local-users", type=int, default=None, help="users privatized (items 4 and 5)")
    p.add_argument("--central-epsilons", type=_floats, default=None, help="target central ε* grid (item 5)")
    p.add_argument("--user-counts", type=_ints, default=None, help="user counts of figure 2")
    p.add_argument("--vocab-sizes", type=_ints, default=None, help="vocabulary sizes of figure 3")
    p.add_argument("--embedding-vocab", type=int, default=None, help="GloVe words for the localizer")
    p.set_defaults(func=run)


def run(args) -> int:
    from .runner import run as run_eval

    preset = args.preset or ("quick" if args.quick else "default")
    overrides = {
        k: getattr(args, k)
        for k in (
            "seed",
            "runs",
            "max_users",
            "vocab_size",
            "lm_vocab_size",
            "W",
            "S",
            "rho",
            "delta",
            "epsilons",
            "mi_epsilons",
            "mi_samples",
            "local_epsilons",
            "local_users",
            "central_epsilons",
            "user_counts",
            "vocab_sizes",
            "embedding_vocab",
        )
    }
    cfg = PRESETS[preset].with_overrides(**overrides)
    sections = tuple(s.strip() for s in args.only.split(",") if s.strip())
    bad = set(sections) - set(SECTIONS)
    if bad:
        raise SystemExit(f"lac eval: unknown section(s) {sorted(bad)}; choose from {', '.join(SECTIONS)}")
    run_eval(cfg, args.out, preset, sections)
    return 0
