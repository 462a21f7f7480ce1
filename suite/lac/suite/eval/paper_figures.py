"""Figures 1–5 of Ramadan et al. §4: KL(private ‖ release) of BayesianDP and the baselines."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lac.common.progress import Progress
from lac.common.rng import RandomSource
from lac.curator.release.endtoend import EndToEndParams, end_to_end_dp

from . import plots
from .data import EvalData, trigram_vocabulary
from .mechanisms import LABELS, release
from .metrics import kl, summarize

FIG1_MECHS = ("posterior", "bayes", "bayes-sound", "endtoend", "laplace", "laplace-public", "laplace-public-obs")


def _kl_runs(name, counts, eps, cfg, rng, runs, alpha=None, K=None) -> list[float]:
    p = counts.private_distribution
    a = counts.alpha if alpha is None else alpha
    return [
        kl(p, release(name, counts.U, a, eps, cfg, rng, K=K, vocab=counts.vocab), cfg.kl_smoothing) for _ in range(runs)
    ]


def _table(x_name, xs, series: dict[str, list[list[float]]]) -> list[dict]:
    return [{x_name: x, **{m: summarize(v[i]) for m, v in series.items()}} for i, x in enumerate(xs)]


def figure1(data: EvalData, out: Path, rng: RandomSource) -> dict:
    """Figure 1: KL(private ‖ release) against ε for every mechanism, with the public baseline."""
    cfg = data.config
    bar = Progress("fig1 KL vs ε", len(FIG1_MECHS) * len(cfg.epsilons))
    series: dict[str, list[list[float]]] = {}
    for m in FIG1_MECHS:
        series[m] = []
        for eps in cfg.epsilons:
            series[m].append(_kl_runs(m, data.counts, eps, cfg, rng, cfg.runs))
            bar.update()
    bar.close()
    public = kl(
        data.counts.private_distribution, release("public", None, data.counts.alpha, 1, cfg, rng), cfg.kl_smoothing
    )
    fig, (ax,) = plots.new(1, f"Fig. 1: KL vs ε ({data.counts.U.shape[0]} users, |V| = {len(data.vocab)} trigrams)")
    for m in FIG1_MECHS:
        plots.band(ax, cfg.epsilons, series[m], LABELS[m][0])
    plots.hline(ax, public, "public baseline", color="k")
    path = plots.finish(
        fig,
        [ax],
        out / "fig1_kl_vs_epsilon.png",
        xlabel="ε",
        ylabel="KL(private ‖ release), nats",
        logx=True,
        logy=True,
    )
    e2e = end_to_end_dp(
        data.counts.U,
        data.counts.alpha,
        EndToEndParams(epsilon=1.0, delta=cfg.delta, C=cfg.C, sensitivity="bruteforce"),
        rng=rng,
    )
    diag = {
        "epsilon": 1.0,
        "laplace_scale": e2e.laplace_scale,
        "score_range": float(np.ptp(e2e.scores)),
        "S": e2e.S,
        "rho": e2e.rho,
    }
    return {
        "figure": path.name,
        "public_kl": public,
        "rows": _table("epsilon", cfg.epsilons, series),
        "endtoend_selection": diag,
    }


def _two_panel(x_name, xs, left, right, publics, title, path, xlabel, logx=True):
    fig, (a1, a2) = plots.new(2, title)
    for m, v in left.items():
        plots.band(a1, xs, v, LABELS[m][0])
    a1.plot(xs, publics, "k--", marker="s", ms=3, label="public baseline")
    for m, v in right.items():
        plots.band(a2, xs, v, LABELS[m][0])
    plots.finish(fig, [a1, a2], path, xlabel=xlabel, ylabel="KL(private ‖ release), nats", logx=logx, logy=True)
    return {
        "figure": path.name,
        "public_kl": dict(zip(map(str, xs), publics)),
        "rows": _table(x_name, xs, {**left, **right}),
    }


def figure2(data: EvalData, out: Path, rng: RandomSource) -> dict:
    """Figure 2: KL against the number of users at the figures' ε."""
    cfg, eps = data.config, data.config.fig_epsilon
    n_all = data.counts.U.shape[0]
    xs = sorted({min(n, n_all) for n in cfg.user_counts})
    left: dict[str, list[list[float]]] = {"posterior": [], "bayes": [], "bayes-sound": []}
    right: dict[str, list[list[float]]] = {"laplace": [], "laplace-public": []}
    publics = []
    bar = Progress("fig2 KL vs users", len(xs) * cfg.runs)
    for n in xs:
        for v in (*left.values(), *right.values()):
            v.append([])
        pub = []
        for _ in range(cfg.runs):
            sub = data.counts.subset(np.sort(rng.choice(n_all, size=n, replace=False)))
            for m, v in (*left.items(), *right.items()):
                v[-1].append(_kl_runs(m, sub, eps, cfg, rng, 1)[0])
            pub.append(kl(sub.private_distribution, release("public", None, sub.alpha, 1, cfg, rng), cfg.kl_smoothing))
            bar.update()
        publics.append(float(np.median(pub)))
    bar.close()
    return _two_panel(
        "users",
        xs,
        left,
        right,
        publics,
        f"Fig. 2: KL vs number of users (ε = {eps:g})",
        out / "fig2_kl_vs_users.png",
        "users (random subsets, one per run)",
    )


def figure3(data: EvalData, out: Path, rng: RandomSource) -> dict:
    """Figure 3: KL against the vocabulary size (most frequent public trigrams)."""
    cfg, eps = data.config, data.config.fig_epsilon
    n_tri = int((data.full_vocab.orders == 3).sum())
    xs = sorted({min(k, n_tri) for k in cfg.vocab_sizes})
    left: dict[str, list[list[float]]] = {"posterior": [], "bayes": [], "bayes-sound": []}
    right: dict[str, list[list[float]]] = {"laplace": [], "laplace-public": []}
    publics = []
    bar = Progress("fig3 KL vs vocabulary", len(xs))
    for k in xs:
        counts = data.counts_for(trigram_vocabulary(data.full_vocab, k))
        for m, v in (*left.items(), *right.items()):
            v.append(_kl_runs(m, counts, eps, cfg, rng, cfg.runs))
        publics.append(
            kl(counts.private_distribution, release("public", None, counts.alpha, 1, cfg, rng), cfg.kl_smoothing)
        )
        bar.update()
    bar.close()
    return _two_panel(
        "vocab_size",
        xs,
        left,
        right,
        publics,
        f"Fig. 3: KL vs vocabulary size (ε = {eps:g})",
        out / "fig3_kl_vs_vocab.png",
        "|V| (most frequent public trigrams)",
    )


def figure4(data: EvalData, out: Path, rng: RandomSource) -> dict:
    """Figure 4: KL against the Laplace noise added to the public counts."""
    cfg, eps = data.config, data.config.fig_epsilon
    xs = list(cfg.public_noise)
    series: dict[str, list[list[float]]] = {"posterior": [], "bayes": [], "bayes-sound": [], "public": []}
    bar = Progress("fig4 KL vs public noise", len(xs) * cfg.runs)
    p = data.counts.private_distribution
    for b in xs:
        for v in series.values():
            v.append([])
        for _ in range(cfg.runs):
            alpha = data.counts.alpha
            if b > 0:
                alpha = np.maximum(alpha + rng.laplace(0.0, b, size=alpha.size), 0.0)
            for m in ("posterior", "bayes", "bayes-sound"):
                series[m][-1].append(_kl_runs(m, data.counts, eps, cfg, rng, 1, alpha=alpha)[0])
            series["public"][-1].append(kl(p, release("public", None, alpha, 1, cfg, rng), cfg.kl_smoothing))
            bar.update()
    bar.close()
    fig, (ax,) = plots.new(1, f"Fig. 4: KL vs Laplace noise scale on public counts (ε = {eps:g})")
    xplot = [max(b, 0.3) for b in xs]  # 0 drawn at the left edge of the log axis
    for m, v in series.items():
        plots.band(ax, xplot, v, LABELS[m][0])
    path = plots.finish(
        fig,
        [ax],
        out / "fig4_kl_vs_public_noise.png",
        xlabel="Laplace scale added to public counts (0 drawn at 0.3)",
        ylabel="KL(private ‖ release), nats",
        logx=True,
        logy=True,
    )
    return {"figure": path.name, "rows": _table("public_noise_scale", xs, series)}


def figure5(data: EvalData, out: Path, rng: RandomSource, fig1: dict) -> dict:
    """Figure 5: k-anonymity (not DP) against BayesianDP, from figure 1's rows."""
    cfg = data.config
    p = data.counts.private_distribution
    kan = [
        kl(p, release("kanon", data.counts.U, data.counts.alpha, 1, cfg, rng, K=K), cfg.kl_smoothing) for K in cfg.ks
    ]
    bayes = [[r["bayes"]["min"], r["bayes"]["median"], r["bayes"]["max"]] for r in fig1["rows"]]
    fig, (a1, a2) = plots.new(2, f"Fig. 5: k-anonymity (NOT DP) vs BayesianDP ({data.counts.U.shape[0]} users)")
    a1.plot(cfg.ks, kan, marker="o", ms=4, label="k-anonymity (deterministic)")
    plots.band(a2, cfg.epsilons, bayes, LABELS["bayes"][0])
    lo = min(min(kan), min(b[0] for b in bayes)) * 0.8
    hi = max(max(kan), max(b[2] for b in bayes)) * 1.25
    for ax in (a1, a2):
        ax.set_ylim(lo, hi)
    a1.set_xlabel("K")
    a2.set_xlabel("ε")
    path = plots.finish(
        fig, [a1, a2], out / "fig5_kanon.png", ylabel="KL(private ‖ release), nats", logx=True, logy=True
    )
    return {"figure": path.name, "kanon": [{"K": K, "kl": v} for K, v in zip(cfg.ks, kan)]}
