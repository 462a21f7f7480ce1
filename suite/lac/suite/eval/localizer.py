"""Item 4: the localizer's trade-off — plausible deniability (N_w, S_w) and n-gram utility vs local ε."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lac.client.calibrate import band_label, calibrate, choose_words, default_bands
from lac.client.embedding import Embedding, glove_default
from lac.client.localizer import Localizer
from lac.client.mechanisms import MultivariateLaplace
from lac.common.progress import Progress
from lac.common.rng import RandomSource

from . import plots
from .data import EvalData
from .mechanisms import release
from .metrics import kl


def privatize_reports(loc: Localizer, reports: list[list[list[str]]]) -> list[list[list[str]]]:
    """Every word of every report replaced by the localizer (one vectorised pass)."""
    flat = [w for r in reports for s in r for w in s]
    out = loc.perturb_ids(loc.ids(flat))
    words = loc.embedding.words
    res, k = [], 0
    for r in reports:
        sents = []
        for s in r:
            sents.append([words[i] for i in out[k : k + len(s)]])
            k += len(s)
        res.append(sents)
    return res


def embedding(data: EvalData) -> Embedding:
    """The GloVe embedding of the evaluation (``embedding_vocab`` most frequent words)."""
    return glove_default(data.config.embedding_vocab)


def run(data: EvalData, out: Path, rng: RandomSource) -> dict:
    """Item 4: per-word plausible deniability (N_w, S_w) and n-gram utility of the Localizer for each local ε."""
    cfg = data.config
    emb = embedding(data)
    bands = default_bands(emb.size)
    ids, band_of = choose_words(emb, cfg.calib_words_per_band, rng, bands)
    rows = calibrate(
        emb,
        MultivariateLaplace,
        cfg.local_epsilons,
        ids,
        cfg.calib_draws,
        rng,
        bands=bands,
        band_of=band_of,
        progress=True,
    )
    n = min(cfg.local_users, len(data.train_reports))
    pick = np.sort(rng.choice(len(data.train_reports), size=n, replace=False))
    reports = [data.train_reports[i] for i in pick]
    vocab = data.lm_vocab
    lcfg = cfg.with_overrides(W=cfg.lm_W)
    clean = data.counts_for_config(vocab, lcfg, reports)
    p = clean.private_distribution
    flat = [w for r in reports for s in r for w in s]
    in_vocab = np.mean([w in emb.index for w in flat])
    utility = []
    bar = Progress("localizer n-gram utility", len(cfg.local_epsilons))
    for eps in cfg.local_epsilons:
        loc = Localizer(emb, MultivariateLaplace(eps), rng)
        pert = privatize_reports(loc, reports)
        pf = [w for r in pert for s in r for w in s]
        changed = float(np.mean([a != b for a, b in zip(flat, pf)]))
        pc = data.counts_for_config(vocab, lcfg, pert)
        cur = release("bayes", pc.U, pc.alpha, 1.0, lcfg, rng)
        utility.append(
            {
                "epsilon": eps,
                "words_changed": changed,
                "kl_perturbed_counts": kl(p, pc.private_distribution, cfg.kl_smoothing),
                "kl_after_bayes_eps1": kl(p, cur, cfg.kl_smoothing),
            }
        )
        bar.update()
    bar.close()
    public_kl = kl(p, release("public", None, clean.alpha, 1, cfg, rng), cfg.kl_smoothing)
    clean_bayes = kl(p, release("bayes", clean.U, clean.alpha, 1.0, lcfg, rng), cfg.kl_smoothing)
    grid = list(cfg.local_epsilons)
    fig, (a1, a2) = plots.new(2, f"Localizer (multivariate Laplace on {emb.name}): plausible deniability and utility")
    a1.plot(grid, [r.median_n_w for r in rows], marker="o", ms=4, label="median N_w (all words)")
    for b in bands:
        lab = band_label(b)
        a1.plot(grid, [r.bands[lab]["median_n_w"] for r in rows], ls=":", marker=".", label=f"N_w, ranks {lab}")
    a1.plot(
        grid,
        [r.median_s_w / cfg.calib_draws for r in rows],
        marker="s",
        ms=4,
        label=f"median S_w / {cfg.calib_draws} draws",
    )
    a1.set_ylabel("fraction")
    a2.plot(
        grid, [u["kl_perturbed_counts"] for u in utility], marker="o", ms=4, label="perturbed counts (no curator noise)"
    )
    a2.plot(grid, [u["kl_after_bayes_eps1"] for u in utility], marker="s", ms=4, label="+ BayesianDP ε=1 (brute-force)")
    a2.axhline(public_kl, color="k", ls="--", lw=1, label="public baseline")
    a2.axhline(clean_bayes, color="g", ls=":", lw=1, label="BayesianDP ε=1 on clean text")
    a2.set_ylabel("KL(clean n-grams ‖ ·), nats")
    a2.set_yscale("log")
    path = plots.finish(fig, [a1, a2], out / "localizer_tradeoff.png", xlabel="local ε per word", logx=True)
    return {
        "figure": path.name,
        "embedding": emb.name,
        "diameter": emb.diameter(),
        "draws": cfg.calib_draws,
        "words_audited": int(ids.size),
        "users": n,
        "words": len(flat),
        "in_embedding": float(in_vocab),
        "calibration": [r.as_dict() for r in rows],
        "utility": utility,
        "public_kl": public_kl,
        "clean_bayes_kl": clean_bayes,
        "vocab_size": len(vocab),
    }
