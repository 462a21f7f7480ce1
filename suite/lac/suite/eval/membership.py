"""Membership inference (Ramadan et al. §5, Fig. 6), the empirical ε lower bound it implies, and an audit verdict.

Adjacent data sets: D (all training users) and D₋ᵤ (the user with the largest total count in
the release vocabulary removed). The library releases once on each (``bayesian_dp`` / ``laplace_dp``; for
the LAC posterior, its weighted totals and σ: the Gaussian mechanism before the free posterior step) to obtain the
mechanism's parameters for that data set — the pre-noise vector and the noise scale, exactly
what the library then samples from; the N repeated releases are redrawn from those parameters
in vectorised batches (same distribution; BayesianDP's Λ-grid snapping, a floating-point
mitigation, is skipped). The attack (the paper's): success when
KL(p_u ‖ θ) < KL(p_u ‖ θ₋ᵤ), p_u = the removed user's normalised counts; ties (e.g. when
the user's items all underflow to the smoothing floor) are broken by a fair coin.

Each (mechanism, claimed ε) row gets a verdict (``metrics.audit_verdict``): ``violated`` (the ε
lower bound exceeds the claim), ``consistent`` (not violated, and the number of pairs could have
shown a violation) or ``inconclusive`` (even an attack winning every pair could not certify the
claimed ε). Every row of a run is tested at the Bonferroni-corrected confidence
1 − (1 − c)/R (R rows, c = ``mi_confidence``), so the chance that any row is flagged ``violated``
although its mechanism meets its claim is ≤ 1 − c. The check passes only if no sound row is
violated and at least one sound row is conclusive.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lac.common.privacy import PrivacyUnit
from lac.common.progress import Progress
from lac.common.rng import RandomSource
from lac.curator.mechanisms import bayesian as bayesian_mechanism
from lac.curator.release.baselines import laplace_dp
from lac.curator.release.bayesian import bayesian_dp
from lac.curator.release.building import MatrixReports
from lac.curator.release.posterior import PosteriorParams, weighted_totals

from . import plots
from .data import EvalData
from .mechanisms import caps, spec
from .metrics import audit_verdict, clopper_pearson

MECHS = {
    "posterior": "Gaussian posterior (LAC default)",
    "laplace": "Laplace (sound)",
    "bayes": "BayesianDP (brute-force γ, data-dependent)",
    "bayes-sound": "BayesianDP (sound γ)",
}
# Modes whose claimed ε is a real guarantee; only these decide the check.
SOUND = ("posterior", "laplace", "bayes-sound")
_BATCH = 64


def _cross_entropy_samples(
    kind: str, mean: np.ndarray, scale: float, pu: np.ndarray, n: int, lam: float, rng: RandomSource
) -> np.ndarray:
    """−Σ p_u log θ for n releases (KL up to the constant entropy of p_u).

    ``kind``: "gauss" — logits mean + N(0, scale²), softmax (BayesianDP); "laplace" / "counts-gauss" —
    counts mean + Laplace(scale) / N(0, scale²) noise, clamped at 0 and normalised (Laplace baseline /
    plain Gaussian mechanism).
    """
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
        elif kind in ("laplace", "counts-gauss"):
            noise = rng.laplace(0.0, scale, size=(b, V)) if kind == "laplace" else scale * rng.standard_normal((b, V))
            noisy = np.maximum(mean[None, :] + noise, 0.0)
            tot = noisy.sum(axis=1, keepdims=True)
            theta = np.where(tot > 0, noisy[:, idx] / np.where(tot > 0, tot, 1.0), 1.0 / V)
        else:
            raise ValueError(f"unknown release kind {kind!r}")
        theta = (1.0 - lam) * theta + lam / V  # as metrics.smooth, on the user's columns only
        out[s : s + b] = -(np.log(theta) @ w)
    return out


def attack(
    kind: str,
    d_in: tuple[np.ndarray, float],
    d_out: tuple[np.ndarray, float],
    pu: np.ndarray,
    n: int,
    lam: float,
    rng: RandomSource,
) -> tuple[int, float]:
    """n rounds of the paired game: (wins, fraction of ties).

    ``d_in`` / ``d_out`` are the (pre-noise vector, noise scale) of the mechanism on D and on D₋ᵤ;
    a round is won when the release of D is closer (KL) to p_u. The rule only compares the two
    releases, so it is symmetric, as ``metrics.epsilon_lower_bound`` requires.
    """
    ce_in = _cross_entropy_samples(kind, d_in[0], d_in[1], pu, n, lam, rng)
    ce_out = _cross_entropy_samples(kind, d_out[0], d_out[1], pu, n, lam, rng)
    ties = ce_in == ce_out
    wins = int(np.sum(ce_in < ce_out)) + int(np.sum(rng.random(n)[ties] < 0.5))  # ties: coin flip
    return wins, float(ties.mean())


def audit(
    kind: str,
    d_in: tuple[np.ndarray, float],
    d_out: tuple[np.ndarray, float],
    pu: np.ndarray,
    n: int,
    claimed_epsilon: float,
    delta: float,
    confidence: float,
    lam: float,
    rng: RandomSource,
) -> dict:
    """Run ``attack`` and judge the claimed (ε, δ) at ``confidence`` (``metrics.audit_verdict``): one row."""
    wins, ties = attack(kind, d_in, d_out, pu, n, lam, rng)
    lo_p, hi_p = clopper_pearson(wins, n, confidence)
    v = audit_verdict(wins, n, claimed_epsilon, delta, confidence)
    return {
        "epsilon": claimed_epsilon,
        "delta": delta,
        "wins": wins,
        "trials": n,
        "success": wins / n,
        "success_ci": [lo_p, hi_p],
        "ties": ties,
        **v,
        "exceeds_claim": v["verdict"] == "violated",
    }


def row_confidence(confidence: float, rows: int) -> float:
    """Bonferroni: per-row confidence so that all ``rows`` verdicts hold together with ``confidence``."""
    return 1.0 - (1.0 - confidence) / max(rows, 1)


def overall_check(rows: list[dict], sound=SOUND) -> dict:
    """PASS / FAIL / INCONCLUSIVE over the sound rows, with the ε range each applies to.

    FAIL: some sound row is violated. PASS: none is, and at least one is conclusive (``consistent``);
    rows above ``max_certifiable_eps`` stay inconclusive and are named (``inconclusive_from``).
    INCONCLUSIVE: every sound row is inconclusive — the run could not have failed.
    """
    srows = [r for r in rows if r["mechanism"] in sound]
    violated = sorted({r["epsilon"] for r in srows if r["verdict"] == "violated"})
    consistent = [r["epsilon"] for r in srows if r["verdict"] == "consistent"]
    inconclusive = [r for r in srows if r["verdict"] == "inconclusive"]
    first = min(inconclusive, key=lambda r: r["epsilon"]) if inconclusive else None
    check = "FAIL" if violated else ("PASS" if consistent else "INCONCLUSIVE")
    return {
        "check": check,
        "sound_never_exceeded": not violated,
        "sound_violated": violated,
        "conclusive_up_to": max(consistent) if consistent else None,
        "inconclusive_from": first["epsilon"] if first else None,
        "trials_needed_at_inconclusive_from": first["trials_needed"] if first else None,
        "max_certifiable_eps": min((r["max_certifiable_eps"] for r in srows), default=0.0),
    }


def _params(kind: str, counts, eps: float, cfg) -> tuple[str, np.ndarray, float]:
    """The mechanism's pre-noise vector and noise scale on ``counts`` (a white-box reading for the audit, which a
    release never publishes): the algorithms are called directly on purpose, not through the release path
    (``lac.curator.runner.run.run``), with the parameters the registry's mechanism derives from the same request
    (``lac.suite.eval.mechanisms.spec``/``caps``)."""
    if kind == "posterior":  # audited on the Gaussian mechanism's output, before the (free) posterior step
        p = PosteriorParams(epsilon=eps, delta=cfg.delta, W=cfg.W, C=cfg.C, discovery=False)
        totals = weighted_totals(
            MatrixReports(counts.U, counts.vocab).blocks(), counts.vocab, p.W, p.C, p.tau, candidates=False
        )
        return "counts-gauss", totals.public, p.sigma
    if kind == "laplace":
        r = laplace_dp(counts.U, W=cfg.W, C=cfg.C, epsilon=eps, rng=np.random.default_rng(0))
        return "laplace", np.asarray(r.mean), r.scale
    bp = bayesian_mechanism.params(spec(kind, eps, cfg), caps(cfg), PrivacyUnit.report())
    b = bayesian_dp(counts.U, counts.alpha, bp, rng=np.random.default_rng(0))
    return "gauss", np.asarray(b.mean), b.sigma


def run(data: EvalData, out: Path, rng: RandomSource) -> dict:
    """Figure 6: membership inference against the user with the most counts, with its empirical ε bound."""
    cfg = data.config
    counts = data.counts
    totals = np.asarray(counts.raw.sum(axis=1)).ravel()  # the attacker knows the user's own text
    u = int(np.argmax(totals))
    pu_raw = counts.raw[u].toarray().ravel().astype(np.float64)
    pu = pu_raw / pu_raw.sum()
    minus = counts.without(u)
    n = cfg.mi_samples
    R = len(MECHS) * len(cfg.mi_epsilons)
    conf = row_confidence(cfg.mi_confidence, R)
    rows = []
    bar = Progress("fig6 membership inference", R)
    for kind in MECHS:
        for eps in cfg.mi_epsilons:
            k1, m1, s1 = _params(kind, counts, eps, cfg)
            _, m0, s0 = _params(kind, minus, eps, cfg)
            delta = 0.0 if kind == "laplace" else cfg.delta
            row = audit(k1, (m1, s1), (m0, s0), pu, n, eps, delta, conf, cfg.kl_smoothing, rng)
            rows.append({"mechanism": kind, **row, "sigma_D": s1, "sigma_D_minus_u": s0})
            bar.update()
    bar.close()
    check = overall_check(rows)
    fig, (a1, a2) = plots.new(
        2, f"Fig. 6: membership inference on the top user ({int(totals[u])} occurrences), {n} release pairs per ε"
    )
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
    plots.hline(a2, check["max_certifiable_eps"], f"largest ε {n} pairs can certify", color="r")
    a1.set_ylabel("attack success probability")
    a2.set_yscale("symlog", linthresh=0.1)
    a2.set_ylabel(f"ε lower bound (C–P, {conf:.1%} per row)")
    path = plots.finish(fig, [a1, a2], out / "fig6_membership.png", xlabel="claimed ε", logx=True)
    return {
        "figure": path.name,
        "rows": rows,
        "user_items": int(totals[u]),
        "user_items_capped": int(counts.U[u].sum()),
        "samples": n,
        "confidence": cfg.mi_confidence,
        "row_confidence": conf,
        "rows_tested": R,
        "false_alarm_bound": round(1.0 - cfg.mi_confidence, 12),
        **check,
        "data_dependent_exceeded": [r["epsilon"] for r in rows if r["mechanism"] == "bayes" and r["exceeds_claim"]],
    }
