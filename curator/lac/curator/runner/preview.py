"""Accuracy preview of a release before it runs: the noise scale and the expected utility,
computed from public information and an assumed number of reports only.

Nothing here reads a report, so a preview spends no privacy budget. What it needs:

* the public vocabulary and its counts α (the shape of text: per order n, π_j = α_j / Σ_{P_n} α);
* the mechanism's noise, which is data-independent for every sound release;
* a number of reports n: an assumption of the caller, or a count the curator already holds in a
  form the caller may see (see ``lac.curator.service.handlers.release``); never the exact count for analysts.

Model of the signal (deliberately simple, public): a report has L words, the public corpus's
mean sentence length (L = Σ α over unigrams / α(</s>) − 1), and its n-grams of each order follow
π. Its expected contribution to item j of order k is then L·π_j occurrences (Laplace, counts),
L·π_j / √(max_n·L) = π_j·√(L / max_n) in the posterior's normalised weights, and π_j in
Laplace-with-public's probability vector. Expected totals are n times that (the last: once).
An item is *resolvable* when its expected total is at least ``SNR`` times the per-item noise
standard deviation, and the release's *signal share* is the share of the text's words
(unigram mass under π) that are resolvable. A release is *swamped* when its signal share is
below ``target_share``: most words would be read from noise, and the posterior would return
little more than the public prior. BayesianDP's noise is on logits and does not shrink with n:
it is swamped when σ on the logits exceeds 1 (each probability multiplied by e^{±σ}).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np

from lac.common.privacy import PrivacyUnit
from lac.curator import mechanisms
from lac.curator.base.ngrams import NgramVocabulary
from lac.curator.mechanisms import LogitNoise, PublicContext, ReleaseSpec
from lac.curator.release.building import PublicCaps

__all__ = ["SNR", "MIN_SIGNAL_SHARE", "Preview", "predict", "mean_sentence_words", "refusal"]

MIN_SIGNAL_SHARE = 0.25  # the accuracy check's default threshold (the curator's min_signal_share, the offline path)
SNR = 2.0  # an item is resolvable when its expected total is at least SNR noise standard deviations
_MAX_LOGIT_SIGMA = 1.0


@dataclass(frozen=True)
class Preview:
    """The predicted accuracy of one release (public information and an assumed n only)."""

    mechanism: str
    epsilon: float
    delta: float
    noise: float  # per-item noise standard deviation, in ``noise_unit``
    noise_unit: str
    reports: int | None  # the n the prediction assumes (None: not known to the caller)
    reports_source: str  # where n comes from, in words
    resolvable: tuple[int, ...]  # per order 1..max_n: public n-grams expected to stand out of the noise
    signal_share: float | None  # share of the text's words that are resolvable
    swamped: bool | None  # None: not decidable from public information
    target_share: float
    reports_needed: int | None  # n at which the signal share reaches the target (None: n does not help)
    epsilon_needed: float | None  # ε at which it does, with these reports (None: unknown / ε does not help)
    advice: str
    # Each covered window after the release: (window, spent ε, spent δ, remaining ε, remaining δ), from the
    # ledger and the release's charge (empty: not charged, or not known here); ``budget``: a window's (ε, δ).
    budget_after: tuple[tuple[int, float, float, float, float], ...] = ()
    budget: tuple[float, float] | None = None
    # while the local channel the release needs is not ready: the sampling's progress (0..1) and where it is
    channel_progress: float | None = None
    channel_status: str = ""

    def budget_statement(self) -> str:
        """The budget after the release in words ("" when it is not charged)."""
        if not self.budget_after or self.budget is None:
            return ""
        window, eps, delta, eps_left, delta_left = min(self.budget_after, key=lambda w: (w[3], w[4]))
        which = (
            f"window {window}"
            if len(self.budget_after) == 1
            else f"window {window} (the least of {len(self.budget_after)})"
        )
        if eps_left < -1e-9 * self.budget[0] or delta_left < -1e-9 * self.budget[1]:
            return (
                f" It would overspend {which}: ε {eps:g} of {self.budget[0]:g}, δ {delta:g} of {self.budget[1]:g};"
                " it would be refused."
            )
        return (
            f" Budget after it: {which} keeps ε {max(eps_left, 0.0):g} of {self.budget[0]:g}"
            f" and δ {max(delta_left, 0.0):g} of {self.budget[1]:g}."
        )

    def statement(self) -> str:
        """The preview in words, for the CLI and the refusal message."""
        head = (
            f"{self.mechanism} at (ε, δ) = ({self.epsilon:g}, {self.delta:g}): noise σ = {self.noise:.4g} "
            f"per item ({self.noise_unit})"
        )
        body = ""
        if self.reports is not None:
            body = f"; with {self.reports:,} reports ({self.reports_source})"
            if self.signal_share is not None:
                body += (
                    f": {100 * self.signal_share:.0f}% of the text's words stand out of the noise "
                    f"(resolvable n-grams by order: {', '.join(f'{r:,}' for r in self.resolvable)})"
                )
        elif self.reports_needed is not None:
            body = "; number of reports unknown here (give expected_reports for a utility prediction)"
        verdict = (
            "." if self.swamped is None else " — the noise would swamp the signal." if self.swamped else " — useful."
        )
        channel = (
            f" Not yet: {self.channel_status}; a release answers UNAVAILABLE until then." if self.channel_status else ""
        )
        return head + body + verdict + (f" {self.advice}" if self.advice else "") + self.budget_statement() + channel


def refusal(preview: Preview, spent: str) -> str:
    """The message of a release refused because ``preview`` predicts it swamped (``spent``: what
    the refused request cost, e.g. "nothing was spent")."""
    return (
        f"release refused: {preview.statement()} ({spent}; set force to release anyway: `lac curator release --force`)"
    )


def mean_sentence_words(vocab: NgramVocabulary) -> float:
    """L: words per sentence of the public corpus (unigram mass over the </s> count, minus </s>)."""
    uni = vocab.orders == 1
    total = float(vocab.alpha[uni].sum())
    eos = float(vocab.alpha[vocab.index["</s>"]]) if "</s>" in vocab.index else 0.0
    return max(total / eos - 1.0, 1.0) if eos > 0 else max(total / max(uni.sum(), 1), 1.0)


def _word_shares(vocab: NgramVocabulary) -> np.ndarray:
    """π over the unigrams, largest first."""
    a = np.sort(vocab.alpha[vocab.orders == 1])[::-1]
    return a / a.sum() if a.sum() > 0 else a


def _pi_needed(shares: np.ndarray, target: float) -> float:
    """The smallest word share π* such that words with π ≥ π* hold ``target`` of the mass."""
    k = int(np.searchsorted(np.cumsum(shares), target - 1e-12))
    return float(shares[min(k, shares.size - 1)])


def _resolvable(vocab: NgramVocabulary, per_share: float, noise: float) -> tuple[tuple[int, ...], float]:
    """(resolvable items per order, signal share) when item j's expected total is π_j·per_share."""
    out = []
    for n in range(1, vocab.max_n + 1):
        a = vocab.alpha[vocab.orders == n]
        pi = a / a.sum() if a.sum() > 0 else a
        out.append(int(np.count_nonzero(pi * per_share >= SNR * noise)))
    shares = _word_shares(vocab)
    return tuple(out), float(shares[shares * per_share >= SNR * noise].sum())


def _epsilon_for(noise_at, target_noise: float, epsilon: float) -> float | None:
    """The smallest ε (bisection, monotone noise) with noise_at(ε) ≤ target_noise, or None above 1e4."""
    if noise_at(1e4) > target_noise:
        return None
    lo, hi = 1e-6, 1e4
    if noise_at(lo) <= target_noise:
        return lo
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if noise_at(mid) <= target_noise else (mid, hi)
        if hi / lo < 1.0 + 1e-6:
            break
    return hi


def predict(
    spec: ReleaseSpec,
    vocab: NgramVocabulary,
    caps: PublicCaps,
    unit: PrivacyUnit,
    *,
    reports: int | None,
    reports_source: str = "assumed",
    target_share: float = 0.5,
) -> Preview:
    """Predict the release of ``spec`` over ``vocab`` with the public ``caps`` and ``unit`` (its m reports
    per user) for ``reports`` reports (see the module docstring); its δ is the mechanism's charge (0 for a
    pure ε-DP mechanism, whatever δ the request carried)."""
    m = mechanisms.get(spec.mechanism)
    epsilon = spec.epsilon
    L = mean_sentence_words(vocab)
    shares = _word_shares(vocab)
    pi_star = _pi_needed(shares, target_share)
    preview = partial(
        Preview,
        mechanism=spec.mechanism,
        epsilon=epsilon,
        delta=m.charge(spec).delta,
        reports=reports,
        reports_source=reports_source,
        target_share=target_share,
    )
    noise_model = m.noise(spec, PublicContext(vocab, caps, unit, words_per_report=L))
    if noise_model is None:
        raise ValueError(f"no preview for mechanism {spec.mechanism!r}")
    if isinstance(noise_model, LogitNoise):
        if math.isnan(noise_model.sigma):
            return preview(
                noise=float("nan"),
                noise_unit="logits; data-dependent, known only after the release",
                resolvable=(),
                signal_share=None,
                swamped=None,
                reports_needed=None,
                epsilon_needed=None,
                advice="",
            )
        sigma = noise_model.sigma
        logits_swamped = sigma > _MAX_LOGIT_SIGMA
        need = _epsilon_for(noise_model.sigma_at, _MAX_LOGIT_SIGMA, epsilon)
        advice = (noise_model.remedy + (f" or ε ≥ {need:.3g}" if need else "") + ".") if logits_swamped else ""
        return preview(
            noise=sigma,
            noise_unit="on the logits, independent of the number of reports",
            resolvable=(),
            signal_share=None,
            swamped=logits_swamped,
            reports_needed=None,
            epsilon_needed=need,
            advice=advice,
        )
    noise_at, unit_name = noise_model.noise_at, noise_model.unit
    per_report, fixed = noise_model.per_report, noise_model.fixed
    noise = noise_at(epsilon)
    if fixed:  # the signal is a probability vector: n does not enter
        resolvable, share = _resolvable(vocab, per_report, noise)
        reports_needed = None
        eps_needed = _epsilon_for(noise_at, pi_star * per_report / SNR, epsilon)
    else:
        reports_needed = max(1, math.ceil(SNR * noise / (pi_star * per_report)))
        if reports is not None:
            resolvable, share = _resolvable(vocab, reports * per_report, noise)
            eps_needed = _epsilon_for(noise_at, reports * pi_star * per_report / SNR, epsilon)
        else:
            resolvable, share, eps_needed = (), None, None
    swamped = None if share is None else share < target_share
    advice = ""
    if swamped is None and reports_needed is not None:
        advice = (
            f"It needs at least {reports_needed:,} reports for {100 * target_share:.0f}% of the words to stand "
            f"out of the noise."
        )
    elif swamped:
        helps = []
        if reports_needed is not None:
            helps.append(f"at least {reports_needed:,} reports")
        if eps_needed is not None:
            helps.append(f"ε ≥ {eps_needed:.3g}")
        helps.extend(noise_model.remedies)
        advice = (
            f"For {100 * target_share:.0f}% of the words to stand out it needs " + " or ".join(helps) + "."
            if helps
            else ""
        )
    return preview(
        noise=noise,
        noise_unit=unit_name,
        resolvable=resolvable,
        signal_share=share,
        swamped=swamped,
        reports_needed=reports_needed,
        epsilon_needed=eps_needed,
        advice=advice,
    )
