"""Membership inference (Ramadan et al. §5, Fig. 6) and the empirical ε lower bound it implies.

Adjacent data sets: D (all training users) and D₋ᵤ (the user with the largest total count in
the release vocabulary removed). The library releases once on each (``bayesian_dp`` / ``laplace_dp``) to obtain the
mechanism's parameters for that data set — the pre-noise vector and the noise scale, exactly
what the library then samples from; the N repeated releases are redrawn from those parameters
in vectorised batches (same distribution; BayesianDP's Λ-grid snapping, a floating-point
mitigation, is skipped). The attack (the paper's): success when
KL(p_u ‖ θ) < KL(p_u ‖ θ₋ᵤ), p_u = the removed user's normalised counts; ties (e.g. when
the user's items all underflow to the smoothing floor) are broken by a fair coin.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lac.common.progress import Progress
from lac.curator.baselines import laplace_dp
from lac.curator.bayesian import bayesian_dp

from . import plots
from .data import EvalData
from .mechanisms import bayes_params
from .metrics import clopper_pearson, epsilon_lower_bound

MECHS = {
    "laplace": "Laplace (sound)",
    "bayes": "BayesianDP (brute-force γ, data-dependent)",
    "bayes-sound": "BayesianDP (sound γ)",
}
_BATCH = 64


def _cross_entropy_samples(kind: str, mean: np.ndarray, scale: float, pu: np.ndarray, n: int, lam: float,
                           rng: np.random.Generator) -> np.ndarray:
    """−Σ p_u log θ for n releases (KL up to the constant entropy of p_u)."""
    idx = np.flatnonzero(pu)
    w = pu[idx]
    out = np.empty(n)
    V = mean.size
    for s in range(0, n, _BATCH):
        b = min(_BATCH, n - s)
        if kind == "gauss":
            h = mean[None, :] + scale * rng.standard_normal((b, V))
            top = h.max(axis=1, keepdims=True)
            logz = top[:, 0] + np.log(np.exp(h - top).sum(axis=1))
            theta = np.exp(h[:, idx] - logz[:, None])
        else:
            noisy = np.maximum(mean[None, :] + rng.laplace(0.0, scale, size=(b, V)), 0.0)
            tot = noisy.sum(axis=1, keepdims=True)
            theta = np.where(tot > 0, noisy[:, idx] / np.where(tot > 0, tot, 1.0), 1.0 / V)
        theta = (1.0 - lam) * theta + lam / V  # as metrics.smooth, on the user's columns only
        out[s:s + b] = -(np.log(theta) @ w)
    return out


def _params(kind: str, counts, eps: float, cfg) -> tuple[str, np.ndarray, float]:
    if kind == "laplace":
        r = laplace_dp(counts.U, W=cfg.W, C=cfg.C, epsilon=eps, rng=np.random.default_rng(0))
        return "laplace", np.asarray(r.mean), r.scale
    r = bayesian_dp(counts.U, counts.alpha, bayes_params(cfg, eps, kind == "bayes-sound"),
                    rng=np.random.default_rng(0))
    return "gauss", np.asarray(r.mean), r.sigma


def run(data: EvalData, out: Path, rng) -> dict:
    cfg = data.config
    counts = data.counts
    totals = np.asarray(counts.raw.sum(axis=1)).ravel()  # the attacker knows the user's own text
    u = int(np.argmax(totals))
    pu_raw = counts.raw[u].toarray().ravel().astype(np.float64)
    pu = pu_raw / pu_raw.sum()
    minus = counts.without(u)
    n = cfg.mi_samples
    rows = []
    bar = Progress("fig6 membership inference", len(MECHS) * len(cfg.mi_epsilons))
    for kind in MECHS:
        for eps in cfg.mi_epsilons:
            k1, m1, s1 = _params(kind, counts, eps, cfg)
            _, m0, s0 = _params(kind, minus, eps, cfg)
            ce_in = _cross_entropy_samples(k1, m1, s1, pu, n, cfg.kl_smoothing, rng)
            ce_out = _cross_entropy_samples(k1, m0, s0, pu, n, cfg.kl_smoothing, rng)
            ties = ce_in == ce_out
            wins = int(np.sum(ce_in < ce_out)) + int(np.sum(rng.random(n)[ties] < 0.5))  # ties: coin flip
            delta = 0.0 if kind == "laplace" else cfg.delta
            lo_p, hi_p = clopper_pearson(wins, n, cfg.mi_confidence)
            eps_lb = epsilon_lower_bound(wins, n, delta, cfg.mi_confidence)
            rows.append({"mechanism": kind, "epsilon": eps, "success": wins / n, "success_ci": [lo_p, hi_p],
                         "ties": float(ties.mean()),
                         "eps_lower_bound": eps_lb, "sigma_D": s1, "sigma_D_minus_u": s0,
                         "exceeds_claim": eps_lb > eps})
            bar.update()
    bar.close()
    fig, (a1, a2) = plots.new(2, f"Fig. 6: membership inference on the top user ({int(totals[u])} occurrences), "
                                 f"{n} release pairs per ε")
    for kind, label in MECHS.items():
        rs = [r for r in rows if r["mechanism"] == kind]
        x = [r["epsilon"] for r in rs]
        y = np.array([r["success"] for r in rs])
        ci = np.array([r["success_ci"] for r in rs])
        a1.errorbar(x, y, yerr=[y - ci[:, 0], ci[:, 1] - y], marker="o", ms=4, capsize=2, label=label)
        a2.plot(x, [r["eps_lower_bound"] for r in rs], marker="o", ms=4, label=label)
    a1.axhline(0.5, color="k", lw=0.8, ls=":")
    xs = list(cfg.mi_epsilons)
    a2.plot(xs, xs, "k--", lw=1, label="claimed ε")
    a1.set_ylabel("attack success probability")
    a2.set_yscale("symlog", linthresh=0.1)
    a2.set_ylabel(f"empirical ε lower bound ({cfg.mi_confidence:.0%}, Clopper–Pearson)")
    path = plots.finish(fig, [a1, a2], out / "fig6_membership.png", xlabel="claimed ε", logx=True)
    sound_ok = not any(r["exceeds_claim"] for r in rows if r["mechanism"] in ("bayes-sound", "laplace"))
    return {"figure": path.name, "rows": rows, "user_items": int(totals[u]), "user_items_capped": int(counts.U[u].sum()),
            "samples": n,
            "sound_never_exceeded": sound_ok,
            "data_dependent_exceeded": [r["epsilon"] for r in rows if r["mechanism"] == "bayes" and r["exceeds_claim"]]}
