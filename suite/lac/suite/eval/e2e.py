"""End to end, as a user deploys LAC: held-out users' texts go through the Localizer at a preset,
are counted as the curator counts them, and released by the curator's own release path; every
row is measured against the users' *clean* text.

Data: the simulated-user corpus (``lac.suite.data.user_texts``: one text = one user = one report),
disjoint from the public corpus that gives the prior and the release vocabulary (the curator's
defaults: the 50,000 most frequent public n-grams of orders 1–3). Held-out texts are split off
first and never released. A point with ``k`` > 1 privatizes every real text k times
independently, as k distinct users with the same clean text: labelled replication, not new text.

Rows (perplexity of the release's language model, ``lac.curator.lm.model.release_model``, on the
held-out clean sentences; KL(clean ‖ release) per order over the public vocabulary, p = the
users' clean counts after the caps W and C):
* public prior: the public counts alone (no private data);
* clean, non-private: the users' exact clean counts (what an exact release of clean text gives);
* perturbed, non-private: the exact counts of the privatized reports (what the curator sees,
  before its noise);
* release of the perturbed text: the default mechanism without the channel (the old default);
* release, channel-aware (the default): the same DP release, the users' clean statistics
  estimated with the deployment's public local channel (post-processing);
* curator-only: the default release of the users' clean text (no device), for reference.
"""

from __future__ import annotations

import math

import numpy as np

from lac.common.paths import data_dir
from lac.common.progress import Progress
from lac.common.rng import RandomSource
from lac.common.text import sentences
from lac.curator.base.ngrams import ReportItems, report_items
from lac.curator.base.prior import public_vocabulary
from lac.curator.lm.model import release_model
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.release.channel import NgramChannel, deployment_channel
from lac.curator.release.core import ItemReports, PublicCaps, vocab_counts
from lac.curator.runner.run import run
from lac.curator.service.config import CuratorConfig
from lac.suite.data import prepare_corpora

from .metrics import kl, summarize
from .targets import heldout_split

ROWS = {
    "public": "public prior (no private data)",
    "clean": "clean text, non-private (exact counts)",
    "perturbed": "perturbed text, non-private (what the curator counts, before its noise)",
    "release-perturbed": "release of the perturbed text (no channel)",
    "release-clean": "release, channel-aware (LAC default)",
    "curator-only": "curator-only: the default release of the clean text (no device)",
}
TARGETS = (
    ("kl", "balanced preset, (1, 1e-6), ≥ 200k users: KL(clean ‖ release) ≤ 0.85× the public prior's", 200_000, 0.85),
    ("ppl", "balanced preset, (1, 1e-6), ≥ 200k users: perplexity ≤ 0.90× the public prior's", 200_000, 0.90),
    ("ppl", "balanced preset, (1, 1e-6), ≥ 1M users: perplexity ≤ 0.80× the public prior's", 1_000_000, 0.80),
)
_BLOCK = 20_000


def _blocks(reports: list, words: frozenset[str]) -> list[ReportItems]:
    return [report_items(reports[i : i + _BLOCK], 3, words) for i in range(0, len(reports), _BLOCK)]


def _per_order_kl(p: np.ndarray, q: np.ndarray, orders: np.ndarray, smoothing: float) -> list[float]:
    out = []
    for n in (1, 2, 3):
        sel = orders == n
        pn, qn = p[sel], np.maximum(q[sel], 0.0)
        if pn.sum() <= 0 or qn.sum() <= 0:
            out.append(math.nan)
            continue
        out.append(kl(pn / pn.sum(), qn / qn.sum(), smoothing))
    return out


def run_e2e(cfg, out, rng: RandomSource) -> dict:
    """The end-to-end rows, the targets at the balanced preset, and the frontier figure."""
    from lac.client.embedding import glove_default
    from lac.client.localizer import Localizer
    from lac.client.presets import get_preset

    texts, held, pool = heldout_split(cfg.target_heldout, rng)
    corpora = prepare_corpora()
    cc = CuratorConfig()
    vocab = public_vocabulary(
        corpora.public_corpus, cc.max_n, cfg.e2e_vocab_min_count, cfg.e2e_vocab_items, data_dir() / "eval-cache"
    )
    caps = PublicCaps(W=cfg.target_W, C=cfg.target_C)
    words = vocab.words
    embedding = glove_default(cfg.e2e_embedding_vocab)
    presets = [get_preset(p) for p in cfg.e2e_presets]
    channels = {}
    for p in presets:
        print(f"  local channel at ε = {p.epsilon:g} per word (sampled once, cached)", flush=True)
        channels[p.name] = deployment_channel(
            data_dir() / "eval-cache",
            vocab,
            corpora.public_corpus,
            embedding.name,
            "multivariate-laplace",
            p.epsilon,
            cfg.e2e_channel_draws,
        )

    def model_ppl(items, counts) -> float:
        return release_model(items, None, counts, 3).perplexity(held)

    def release(blocks, eps: float, channel: NgramChannel | None):
        spec = ReleaseSpec(epsilon=eps, delta=cfg.delta)
        r = run(ItemReports(blocks, vocab), vocab, spec, caps, rng=rng, channel=channel)
        return r, release_model(r.items, r.log_probs, r.pseudo_counts, 3).perplexity(held)

    prior_ppl = model_ppl(vocab.items, vocab.alpha)
    points = []
    steps = sum(len(presets) * (1 + len(cfg.e2e_central) * cfg.e2e_runs * 2) for _ in cfg.e2e_points)
    bar = Progress("end to end", steps)
    for label, n_real, k in cfg.e2e_points:
        n_real = min(n_real, pool.size)
        clean_texts = [texts[i] for i in pool[:n_real]]
        clean_blocks = _blocks([sentences(t) for t in clean_texts], words)
        clean_counts = np.asarray(vocab_counts(iter(clean_blocks), vocab, caps.C, caps.W).sum(axis=0)).ravel() * k
        base = {
            "public": {
                "ppl": prior_ppl,
                "kl": _per_order_kl(clean_counts, vocab.alpha, vocab.orders, cfg.kl_smoothing),
            },
            "clean": {"ppl": model_ppl(vocab.items, clean_counts), "kl": [0.0, 0.0, 0.0]},
        }
        curator_only = {}
        for eps in cfg.e2e_central:
            r, ppl = release(clean_blocks * k, eps, None)
            curator_only[eps] = {
                "ppl": ppl,
                "kl": _per_order_kl(clean_counts, r.pseudo_counts[: len(vocab)], vocab.orders, cfg.kl_smoothing),
            }
        rows = []
        for p in presets:
            localizer = Localizer(embedding, _mechanism(p.epsilon), rng=rng, calibrated=True)
            reports = [
                [list(s) for s in rep.sentences] for _ in range(k) for rep in localizer.privatize_many(clean_texts)
            ]
            changed = _changed(clean_texts, reports[:n_real])
            pert_blocks = _blocks(reports, words)
            pert_counts = np.asarray(vocab_counts(iter(pert_blocks), vocab, caps.C, caps.W).sum(axis=0)).ravel()
            bar.update()
            perturbed = {
                "ppl": model_ppl(vocab.items, pert_counts),
                "kl": _per_order_kl(clean_counts, pert_counts, vocab.orders, cfg.kl_smoothing),
            }
            for eps in cfg.e2e_central:
                res: dict[str, dict[str, list]] = {
                    name: {"ppl": [], "kl": []} for name in ("release-perturbed", "release-clean")
                }
                for _ in range(cfg.e2e_runs):
                    for name, ch in (("release-perturbed", None), ("release-clean", channels[p.name])):
                        r, ppl = release(pert_blocks, eps, ch)
                        res[name]["ppl"].append(ppl)
                        res[name]["kl"].append(
                            _per_order_kl(clean_counts, r.pseudo_counts[: len(vocab)], vocab.orders, cfg.kl_smoothing)
                        )
                        bar.update()
                rows.append(
                    {
                        "preset": p.name,
                        "local_epsilon": p.epsilon,
                        "epsilon": eps,
                        "words_changed": changed,
                        "sigma": r.sigma,
                        "perturbed": perturbed,
                        "curator-only": curator_only[eps],
                        **{
                            name: {
                                "ppl": summarize(v["ppl"]),
                                "kl": [float(np.median(c)) for c in zip(*v["kl"])],
                            }
                            for name, v in res.items()
                        },
                    }
                )
        points.append({"label": label, "real_users": n_real, "replicate": k, "users": n_real * k, **base, "rows": rows})
    bar.close()
    figure = _frontier(points, out)
    return {
        "points": points,
        "checks": checks(points),
        "figure": figure,
        "heldout_texts": cfg.target_heldout,
        "heldout_sentences": len(held),
        "vocab_size": len(vocab),
        "embedding": embedding.name,
        "delta": cfg.delta,
        "W": caps.W,
        "C": caps.C,
        "runs": cfg.e2e_runs,
        "channel_draws": next(iter(channels.values())).word.draws if channels else 0,
        "channel_sampling": next(iter(channels.values())).word.describe() if channels else "",
    }


def _mechanism(epsilon: float):
    from lac.client.mechanisms import MultivariateLaplace

    return MultivariateLaplace(epsilon)


def _changed(texts: list[str], reports: list) -> float:
    """Share of words the devices replaced (word by word within each report)."""
    pairs = [
        (a, b)
        for t, r in zip(texts, reports)
        for a, b in zip([w for s in sentences(t) for w in s], [w for s in r for w in s])
    ]
    return float(np.mean([a != b for a, b in pairs])) if pairs else 0.0


def mean_kl(row: dict) -> float:
    """The mean over orders 1–3 of a row's KL(clean ‖ ·)."""
    return float(np.nanmean(row["kl"]))


def checks(points: list[dict]) -> list[dict]:
    """Each end-to-end target at every point it applies to (balanced preset, ε = 1)."""
    out = []
    for key, text, users, bound in TARGETS:
        for pt in points:
            if pt["users"] < users:
                continue
            for row in pt["rows"]:
                if row["preset"] != "balanced" or row["epsilon"] != 1.0:
                    continue
                rel = row["release-clean"]
                if key == "kl":
                    value = mean_kl(rel) / mean_kl(pt["public"])
                    shown = f"mean KL {mean_kl(rel):.3f} vs public {mean_kl(pt['public']):.3f} ({value:.2f}×)"
                else:
                    value = rel["ppl"]["median"] / pt["public"]["ppl"]
                    shown = f"perplexity {rel['ppl']['median']:.1f} vs public {pt['public']['ppl']:.1f} ({value:.2f}×)"
                out.append({"text": text, "point": pt["label"], "value": value, "shown": shown, "met": value <= bound})
        if not any(c["text"] == text for c in out):
            out.append({"text": text, "point": None, "value": None, "shown": "not measured (no point of that size)"})
    return out


def _frontier(points: list[dict], out):
    """Perplexity relative to the public prior against the central ε, one line per preset (local ε
    per word), channel-aware and not, at the largest point without replication."""
    from . import plots

    plain = [p for p in points if p["replicate"] == 1] or points
    pt = max(plain, key=lambda p: p["users"])
    fig, (ax,) = plots.new(1, f"End to end, {pt['label']}: perplexity on clean held-out text / public prior's")
    for preset in dict.fromkeys(r["preset"] for r in pt["rows"]):
        rows = [r for r in pt["rows"] if r["preset"] == preset]
        xs = [r["epsilon"] for r in rows]
        loc = rows[0]["local_epsilon"]
        for name, style in (("release-clean", "-"), ("release-perturbed", ":")):
            ys = [r[name]["ppl"]["median"] / pt["public"]["ppl"] for r in rows]
            tag = "channel-aware" if name == "release-clean" else "perturbed"
            ax.plot(xs, ys, style, marker="o", ms=4, label=f"{preset} (ε = {loc:g}/word), {tag}")
    plots.hline(ax, 1.0, "public prior")
    plots.hline(ax, pt["clean"]["ppl"] / pt["public"]["ppl"], "clean, non-private", color="grey")
    return str(
        plots.finish(fig, [ax], out / "e2e_frontier.png", xlabel="central ε (δ = 1e-6)", ylabel="ratio", logx=True)
    )
