"""Item 5: the whole pipeline for a target central guarantee (ε*, δ).

(a) curator-only DP: the LAC default release (``posterior``, sound) at ε* on clean text (trusted curator);
(b) local noise only: per-report ε0 = ε* (ε0-LDP implies central ε*), no curator noise;
(c) local noise sized so that shuffling n reports gives (ε*, δ) on the shuffled batch
    (``lac.shuffler.amplification.shuffle_epsilon``), then the default release at ε* at the curator;
(c0) as (c) without curator noise (the shuffled batch alone is (ε*, δ)-DP).
A report of ℓ words under per-word metric DP ε_w is ε0 = ℓ·ε_w·diam-LDP in the worst case
(``MultivariateLaplace.local_epsilon``, the mechanism's privacy map); reports are truncated to
ℓ = ``report_words`` words so that one ε0 covers every report.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lac.client.localizer import Localizer
from lac.client.mechanisms import MultivariateLaplace
from lac.common.progress import Progress
from lac.common.rng import RandomSource
from lac.shuffler.amplification import shuffle_epsilon

from . import plots
from .data import EvalData
from .localizer import embedding, privatize_reports
from .mechanisms import release
from .metrics import kl


def truncate(report: list[list[str]], n_words: int) -> list[list[str]]:
    """The first ``n_words`` words of a report, sentence boundaries kept."""
    out, left = [], n_words
    for s in report:
        if left <= 0:
            break
        out.append(s[:left])
        left -= len(out[-1])
    return out


def max_local_epsilon(target: float, n: int, delta: float, points: int) -> tuple[float, list[dict]]:
    """Largest ε0 on a geometric grid whose shuffled central ε is ≤ target (≥ target itself:
    without amplification ε0 = target still gives central ε* by post-processing)."""
    hi = max(2.0 * target, np.log(max(n, 2)) + 2.0)
    grid = np.geomspace(target, max(hi, target), points)
    curve, best = [], target
    for e0 in grid:
        r = _shuffled(float(e0), n, delta)
        curve.append({"eps0": float(e0), "central": r["central"], "amplified": r["amplified"]})
        if r["central"] <= target:
            best = max(best, float(e0))
    return best, curve


def _shuffled(eps0: float, n: int, delta: float) -> dict:
    """Central ε of a shuffled batch of n ε0-LDP reports (``shuffle_epsilon``'s numerical bound)."""
    r = shuffle_epsilon(eps0, n, delta)
    return {"central": r.epsilon, "amplified": r.amplified, "statement": r.statement}


def run(data: EvalData, out: Path, rng: RandomSource) -> dict:
    """Item 5: utility of curator-only, local-only and shuffled local noise for each target central ε."""
    cfg = data.config
    lcfg = cfg.with_overrides(W=cfg.lm_W)
    emb = embedding(data)
    diam = emb.diameter()
    ell = cfg.report_words
    n = min(cfg.local_users, len(data.train_reports))
    pick = np.sort(rng.choice(len(data.train_reports), size=n, replace=False))
    reports = [truncate(data.train_reports[i], ell) for i in pick]
    vocab = data.lm_vocab
    clean = data.counts_for_config(vocab, lcfg, reports)
    p = clean.private_distribution
    lam = cfg.kl_smoothing
    rows = []
    bar = Progress("end-to-end pipeline", len(cfg.central_epsilons))
    for target in cfg.central_epsilons:
        eps0_shuffle, curve = max_local_epsilon(target, n, cfg.delta, cfg.eps0_grid_points)
        row = {
            "target": target,
            "eps0_local_only": target,
            "eps0_shuffle": eps0_shuffle,
            "eps_w_local_only": target / (ell * diam),
            "eps_w_shuffle": eps0_shuffle / (ell * diam),
            "curve": curve,
        }
        row["a_curator_only"] = kl(p, release("posterior", clean.U, clean.alpha, target, lcfg, rng, vocab=vocab), lam)
        for key, e0 in (("b_local_only", target), ("c0_shuffle_only", eps0_shuffle)):
            mechanism = MultivariateLaplace(e0 / (ell * diam))
            loc = Localizer(emb, mechanism, rng)
            assert abs(mechanism.local_epsilon(ell, diam) - e0) < 1e-9 * max(1.0, e0)
            pc = data.counts_for_config(vocab, lcfg, privatize_reports(loc, reports))
            row[key] = kl(p, pc.private_distribution, lam)
            if key == "c0_shuffle_only":
                released = release("posterior", pc.U, pc.alpha, target, lcfg, rng, vocab=vocab)
                row["c_shuffle_curator"] = kl(p, released, lam)
        rows.append(row)
        bar.update()
    bar.close()
    public_kl = kl(p, release("public", None, clean.alpha, 1, cfg, rng), lam)
    practical = []
    for eps_w in (1.0, 5.0, 15.0):
        e0 = MultivariateLaplace(eps_w).local_epsilon(ell, diam)
        practical.append({"eps_w": eps_w, "eps0": e0, **_shuffled(e0, n, cfg.delta)})
    xs = list(cfg.central_epsilons)
    fig, (a1, a2) = plots.new(2, f"End to end: n = {n} reports of ≤ {ell} words, δ = {cfg.delta:g}, {emb.name}")
    a1.plot(xs, [r["a_curator_only"] for r in rows], marker="o", label="(a) curator-only DP release, clean text")
    a1.plot(xs, [r["b_local_only"] for r in rows], marker="s", label="(b) local noise only (ε0 = ε*)")
    a1.plot(xs, [r["c_shuffle_curator"] for r in rows], marker="^", label="(c) local + shuffle + DP release")
    a1.plot(
        xs, [r["c0_shuffle_only"] for r in rows], marker="v", ls=":", label="(c0) local + shuffle, no curator noise"
    )
    a1.axhline(public_kl, color="k", ls="--", lw=1, label="public baseline")
    a1.set_ylabel("KL(clean n-grams ‖ release), nats")
    a1.set_yscale("log")
    a2.plot(xs, [r["eps0_local_only"] for r in rows], marker="s", label="local ε0 allowed without shuffling")
    a2.plot(xs, [r["eps0_shuffle"] for r in rows], marker="^", label="local ε0 allowed with shuffling")
    a2.set_ylabel("report-level local ε0")
    a2.set_yscale("log")
    path = plots.finish(fig, [a1, a2], out / "pipeline_end_to_end.png", xlabel="target central ε*", logx=True)
    return {
        "figure": path.name,
        "n": n,
        "report_words": ell,
        "diameter": diam,
        "embedding": emb.name,
        "rows": rows,
        "public_kl": public_kl,
        "practical": practical,
        "vocab_size": len(vocab),
    }
