"""Privacy accounting for the amplifier: what shuffling (or Poisson sub-sampling) buys.

Plain library, numpy + math only (the shuffler must not depend on scipy).

Shuffling -- Feldman, McMillan, Talwar, "Hiding Among the Clones: A Simple and Nearly
Optimal Analysis of Privacy Amplification by Shuffling" (FOCS 2021):

* Theorem 3.1 (closed form).  If each of n reports comes from a distinct user through an
  eps0-DP local randomizer and the batch is uniformly permuted, then for delta in (0, 1] and
  eps0 <= log(n / (16 log(2/delta))) the shuffled batch is (eps, delta)-DP with

      eps = log(1 + (e^eps0 - 1)/(e^eps0 + 1) * (8 sqrt(e^eps0 log(4/delta)) / sqrt(n)
                                                 + 8 e^eps0 / n)).

* Theorem 3.2 (the reduction behind the numerical bound).  The shuffled batch is
  (eps, delta)-DP whenever the pair P = (A+1, C-A), Q = (A, C-A+1) with
  C ~ Bin(n-1, e^-eps0) and A | C ~ Bin(C, 1/2) is (eps, delta)-indistinguishable.
  (The published theorem also mixes each side with a Bernoulli(e^eps0/(e^eps0+1)) swap;
  hockey-stick divergence is jointly convex and the swapped pair is the mirror image, so
  dropping the mixing can only increase delta: this bound is conservative, about 0.007
  looser than the paper's 0.17 on its n=1e5, eps0=4, delta=1e-6 example.)
  P and Q are mirror images of each other, so one hockey-stick divergence suffices:

      delta(eps) = sum_c Pr[C=c] * sum_{x >= x*(c)} (b_c(x-1) - e^eps b_c(x))
                 = sum_c Pr[C=c] * (S_c(x*-1) - e^eps S_c(x*)),

  where b_c is the Bin(c, 1/2) pmf, S_c(k) = Pr[Bin(c, 1/2) >= k] and
  x*(c) = floor(e^eps (c+1) / (1+e^eps)) + 1 is the first x with x / (c-x+1) > e^eps.

  ``numerical_delta`` evaluates an *upper bound* on delta(eps): C is truncated to the
  values whose probability is not negligible and the whole excluded mass is added
  (each excluded c contributes at most Pr[C=c]); the tails S_c are carried from one c to
  the next by Pascal's rule (sums of non-negative terms only, so no cancellation); the
  remaining subtraction and the log-gamma pmfs are covered by an explicit relative
  slack.  ``shuffle_epsilon`` then searches the smallest eps with delta(eps) <= delta by
  repeated multi-section (512 points per pass) down to a bracket narrower than ``tol``
  and returns the *upper* end of the final bracket.

Poisson sub-sampling -- each record is kept independently with probability q; an
(eps0, delta0)-DP mechanism run on the sample is (log(1 + q(e^eps0 - 1)), q delta0)-DP
(e.g. Balle, Barthe, Gaboardi 2018, "Privacy amplification by subsampling", Thm. 8).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

__all__ = [
    "AmplificationResult",
    "closed_form_valid",
    "local_epsilon_metric",
    "numerical_delta",
    "shuffle_epsilon",
    "subsampling_epsilon",
    "subsampling_statement",
]

_REL_SLACK = 1e-7       # covers log-gamma pmf error and float accumulation (both << 1e-7)
_GRID = 512             # points per multi-section pass
DEFAULT_TOL = 1e-7      # final bracket width on eps

_ASSUMPTIONS = ("assumes each of the n reports comes from a distinct user and is produced by an "
                "eps0-LDP local randomizer, and that the shuffler releases the batch uniformly "
                "permuted with no other identifying metadata")


@dataclass(frozen=True)
class AmplificationResult:
    """The central (epsilon, delta) guarantee of one shuffled batch.

    ``amplified`` is False when shuffling buys nothing (the bound is >= eps0 or eps0 lies
    outside the theorem's range); ``epsilon`` is then eps0 itself (with delta = 0 the
    local guarantee already holds for the shuffled batch, by post-processing).
    """

    eps0: float
    n: int
    delta: float
    epsilon: float
    method: str
    amplified: bool
    statement: str

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------- helpers


def _check(eps0: float, n: int, delta: float) -> None:
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if not (math.isfinite(eps0) and eps0 > 0):
        raise ValueError(f"eps0 must be finite and > 0, got {eps0!r}")
    if not (0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def _log_factorials(m: int) -> np.ndarray:
    """log(k!) for k = 0..m (math.lgamma: accurate to a few ulp)."""
    return np.fromiter((math.lgamma(k + 1.0) for k in range(m + 1)), dtype=float, count=m + 1)


def _log_binom_pmf(logfact: np.ndarray, m: int, k: np.ndarray, logp: float, log1mp: float) -> np.ndarray:
    """log Pr[Bin(m, p) = k]; -inf outside 0..m."""
    k = np.asarray(k)
    inside = (k >= 0) & (k <= m)
    kk = np.clip(k, 0, m)
    out = logfact[m] - logfact[kk] - logfact[m - kk]
    with np.errstate(invalid="ignore"):
        # 0 * log(0) terms (p = 1 or p = 0 edge) are taken as 0
        out = out + np.where(kk > 0, kk * logp, 0.0) + np.where(m - kk > 0, (m - kk) * log1mp, 0.0)
    return np.where(inside, out, -np.inf)


# ---------------------------------------------------------------------------- numerical bound


class _PrivacyCurve:
    """delta(eps) upper bounds of the FMT'21 Theorem 3.2 pair for fixed (eps0, n).

    Everything that does not depend on eps (the distribution of C, the truncation, the
    starting tails) is prepared once; ``delta`` then evaluates a whole grid of eps in one
    sweep over c.
    """

    def __init__(self, eps0: float, n: int, tiny: float):
        self.m = m = int(n) - 1                       # C ~ Bin(m, e^-eps0)
        if m <= 0:                                    # a lone report: nothing to hide among
            return
        p = math.exp(-eps0)
        logfact = _log_factorials(m)
        pc = np.exp(_log_binom_pmf(logfact, m, np.arange(m + 1), -eps0, math.log1p(-p)))  # log p = -eps0: no underflow
        keep = pc >= tiny                             # never empty: the mode has mass >= 1/(m+1)
        c_idx = np.flatnonzero(keep)
        self.c_min, self.c_max = c_min, c_max = int(c_idx[0]), int(c_idx[-1])
        self.excluded = float(pc[~keep].sum())        # sum of small non-negatives: no cancellation
        self.pc = pc[c_min:c_max + 1].copy()

        # Window of k values tracked for S_c(k) = Pr[Bin(c, 1/2) >= k].
        #  upper: Hoeffding, Pr[Bin(c,1/2) >= c/2 + t] <= exp(-2 t^2 / c) <= tiny beyond k_hi;
        #         for x* beyond the window, S_c(x*-1) <= S_c(k_hi) is used (a valid upper bound).
        #  lower: Pascal's rule lets the truncated low edge creep up one index per step; the
        #         lowest index ever read is ~ c/2, so start that far below.
        log_tiny = -math.log(tiny)
        k_hi = int(math.ceil(c_max / 2 + math.sqrt(c_max * log_tiny / 2))) + 2
        self.k_hi = k_hi = min(k_hi, c_max + 1)
        self.k_lo = k_lo = max(0, c_min - (c_max + 1) // 2 - 3)
        ks = np.arange(k_lo, k_hi + 1)

        # Exact state at c = c_min.
        log_half = math.log(0.5)
        full = np.arange(c_min + 1)
        pmf_full = np.exp(_log_binom_pmf(logfact, c_min, full, log_half, log_half))
        tail_full = np.cumsum(pmf_full[::-1])[::-1]   # S(k), k = 0..c_min: positive sums
        self.pmf0 = np.zeros(len(ks))
        self.S0 = np.zeros(len(ks))
        sel = ks <= c_min
        self.pmf0[sel] = pmf_full[ks[sel]]
        self.S0[sel] = tail_full[ks[sel]]

    def delta(self, eps: np.ndarray, chunk: int = 256) -> np.ndarray:
        eps = np.atleast_1d(np.asarray(eps, dtype=float))
        if self.m <= 0:
            return np.ones_like(eps)
        with np.errstate(over="ignore"):
            e = np.exp(eps)
        q = np.exp(-np.logaddexp(0.0, eps))  # 1/(1+e^eps) > 0; e/(1+e) itself rounds to 1 above eps ~ 36.7
        k_lo, k_hi = self.k_lo, self.k_hi
        pmf, S = self.pmf0.copy(), self.S0.copy()
        buf = np.empty_like(pmf)
        acc = np.zeros_like(eps)
        slack = np.zeros_like(eps)
        for start in range(self.c_min, self.c_max + 1, chunk):
            cs = np.arange(start, min(start + chunk, self.c_max + 1))
            # x* = floor((c+1) e/(1+e)) + 1 = (c+1) - ceil((c+1) q) + 1, exact even when q is tiny
            # (q > 0 always, so the ceiling is >= 1 even where q underflows to 0 above eps ~ 745)
            xstar = (cs + 1)[:, None] - np.maximum(np.ceil(np.outer(cs + 1, q)), 1).astype(np.int64) + 1
            i1 = np.minimum(xstar - 1, k_hi) - k_lo
            i2 = np.minimum(xstar, k_hi) - k_lo
            beyond = xstar > k_hi
            s1 = np.empty(i1.shape)
            s2 = np.empty(i2.shape)
            for r, c in enumerate(cs):
                if c > self.c_min:
                    # c-1 -> c:  S_c(k) = S_{c-1}(k) + b_{c-1}(k-1)/2 ;
                    #            b_c(k) = (b_{c-1}(k) + b_{c-1}(k-1))/2      (Pascal's rule)
                    buf[0] = 0.0
                    np.multiply(pmf[:-1], 0.5, out=buf[1:])
                    S += buf
                    pmf *= 0.5
                    pmf += buf
                S.take(i1[r], out=s1[r])
                S.take(i2[r], out=s2[r])
            s2[beyond] = 0.0
            w = self.pc[cs - self.c_min]
            es2 = np.multiply(e, s2, out=np.zeros_like(s2), where=s2 > 0.0)  # e may be inf (eps > ~709); inf*0 = 0
            acc += w @ np.maximum(s1 - es2, 0.0)
            slack += w @ (s1 + es2)
        bound = acc * (1.0 + _REL_SLACK) + slack * 1e-12 + self.excluded
        return np.minimum(bound, 1.0)


def _default_tiny(n: int, delta: float | None) -> float:
    return 1e-30 if delta is None else min(1e-30, delta * 1e-12 / max(n, 1))


def numerical_delta(eps, eps0: float, n: int, *, tiny: float | None = None) -> np.ndarray:
    """Upper bound on delta(eps) of the FMT'21 Theorem 3.2 pair, for each eps given.

    ``tiny`` is the probability below which values of C are dropped (their total mass is
    added to the bound); it only affects tightness, never soundness.
    """
    eps_arr = np.atleast_1d(np.asarray(eps, dtype=float))
    if np.any(eps_arr < 0):
        raise ValueError("eps must be >= 0")
    _check(eps0, n, 0.5)
    return _PrivacyCurve(eps0, int(n), tiny if tiny is not None else _default_tiny(n, None)).delta(eps_arr)


def _numerical_epsilon(eps0: float, n: int, delta: float, tol: float) -> tuple[float, bool]:
    """Smallest eps (to within tol, rounded up) with delta(eps) <= delta; (eps0, False) if none < eps0."""
    curve = _PrivacyCurve(eps0, n, _default_tiny(n, delta))
    lo, hi = 0.0, eps0                                # invariant: delta(hi) <= delta, once checked
    checked = False
    while hi - lo > tol:
        grid = np.linspace(lo, hi, _GRID + 1)[1:]     # includes hi (eps0 on the first pass)
        ok = curve.delta(grid) <= delta
        if not checked:
            if not ok[-1]:
                return eps0, False
            checked = True
        # delta(eps) is non-increasing in eps: bracket the first grid point that satisfies it
        j = int(np.argmax(ok))
        lo, hi = (float(grid[j - 1]) if j > 0 else lo), float(grid[j])
    return hi, hi < eps0


# ---------------------------------------------------------------------------- closed form


def closed_form_valid(eps0: float, n: int, delta: float) -> bool:
    """FMT'21 Theorem 3.1 range: eps0 <= log(n / (16 log(2/delta)))."""
    bound = n / (16.0 * math.log(2.0 / delta))
    return bound > 1.0 and eps0 <= math.log(bound)


def _closed_form_epsilon(eps0: float, n: int, delta: float) -> float:
    e0 = math.exp(eps0)
    term = 8.0 * math.sqrt(e0 * math.log(4.0 / delta)) / math.sqrt(n) + 8.0 * e0 / n
    return math.log1p((e0 - 1.0) / (e0 + 1.0) * term)


# ---------------------------------------------------------------------------- public API


def shuffle_epsilon(eps0: float, n: int, delta: float, method: str = "numerical",
                    *, tol: float = DEFAULT_TOL) -> AmplificationResult:
    """Central (epsilon, delta) of a uniformly shuffled batch of n eps0-LDP reports (FMT'21).

    ``method="numerical"``: Theorem 3.2 reduction, exact-up-to-rounding delta(eps) (always
    over-estimated) and a search returning the upper end of a bracket of width <= ``tol``.
    ``method="closed_form"``: Theorem 3.1, only when eps0 <= log(n / (16 log(2/delta))).
    When nothing is gained the result carries ``epsilon = eps0`` and ``amplified = False``.
    """
    _check(eps0, n, delta)
    n = int(n)
    if method == "numerical":
        eps, amplified = _numerical_epsilon(eps0, n, delta, tol)
        theorem = "Feldman-McMillan-Talwar 2021 (Hiding Among the Clones), Theorem 3.2 reduction without the Bernoulli mixing (conservative), numerical bound"
        if amplified:
            statement = (f"Shuffling n={n} reports makes the batch ({eps:.6g}, {delta:.3g})-DP centrally "
                         f"[{theorem}; delta(eps) computed exactly up to rounding, rounded up; "
                         f"{_ASSUMPTIONS}].")
        else:
            eps = eps0
            statement = (f"No amplification: at n={n}, delta={delta:.3g} the {theorem} gives nothing "
                         f"below eps0={eps0:.6g}; the batch is only ({eps0:.6g}, 0)-DP, the local "
                         f"guarantee [{_ASSUMPTIONS}].")
    elif method == "closed_form":
        theorem = "Feldman-McMillan-Talwar 2021 (Hiding Among the Clones), Theorem 3.1, closed form"
        if not closed_form_valid(eps0, n, delta):
            eps, amplified = eps0, False
            limit = n / (16.0 * math.log(2.0 / delta))
            limit_txt = f"log(n/(16 log(2/delta))) = {math.log(limit):.4g}" if limit > 0 else "undefined"
            statement = (f"No amplification: the {theorem} needs eps0 <= {limit_txt}, but eps0={eps0:.6g} "
                         f"(n={n}, delta={delta:.3g}); only the local ({eps0:.6g}, 0)-DP guarantee "
                         f"applies [{_ASSUMPTIONS}].")
        else:
            eps = _closed_form_epsilon(eps0, n, delta)
            amplified = eps < eps0
            if amplified:
                statement = (f"Shuffling n={n} reports makes the batch ({eps:.6g}, {delta:.3g})-DP centrally "
                             f"[{theorem}, valid since eps0 <= log(n/(16 log(2/delta))); {_ASSUMPTIONS}].")
            else:
                eps = eps0
                statement = (f"No amplification: the {theorem} gives nothing below eps0={eps0:.6g} at "
                             f"n={n}, delta={delta:.3g}; only the local ({eps0:.6g}, 0)-DP guarantee "
                             f"applies [{_ASSUMPTIONS}].")
    else:
        raise ValueError(f"method must be 'numerical' or 'closed_form', got {method!r}")
    return AmplificationResult(eps0=float(eps0), n=n, delta=float(delta), epsilon=float(eps),
                               method=method, amplified=bool(amplified), statement=statement)


def subsampling_epsilon(eps0: float, q: float) -> float:
    """Amplification by Poisson sub-sampling with rate q: eps = log(1 + q (e^eps0 - 1)).

    An (eps0, delta0)-DP mechanism applied to a Poisson sample (each record kept
    independently with probability q) is (log(1 + q(e^eps0 - 1)), q * delta0)-DP with
    respect to adding/removing one record.  See ``subsampling_statement``.
    """
    if not (math.isfinite(eps0) and eps0 >= 0):
        raise ValueError(f"eps0 must be finite and >= 0, got {eps0!r}")
    if not (0 <= q <= 1):
        raise ValueError(f"q must be in [0, 1], got {q!r}")
    return math.log1p(q * math.expm1(eps0))


def subsampling_statement(eps0: float, q: float, delta0: float = 0.0) -> str:
    eps = subsampling_epsilon(eps0, q)
    return (f"Poisson sub-sampling at rate q={q:.6g} turns an ({eps0:.6g}, {delta0:.3g})-DP mechanism into an "
            f"({eps:.6g}, {q * delta0:.3g})-DP one [amplification by sub-sampling, eps = log(1 + q(e^eps0 - 1)), "
            f"delta = q*delta0; add/remove-one neighbouring; assumes each record is kept independently "
            f"with probability q and which records were sampled stays secret].")


def local_epsilon_metric(eps_per_word: float, n_words: int, diameter: float) -> float:
    """Worst-case pure LDP level eps0 of one LAC report.

    The client's metric-DP mechanism guarantees Pr[M(w)=y] <= e^{eps d(w,w')} Pr[M(w')=y]
    per word, d = Euclidean distance of embeddings.  Any two words are at most
    ``diameter`` apart (the vocabulary's embedding diameter), so each word is
    (eps * diameter)-LDP, and a report of ``n_words`` independently perturbed words
    composes to eps0 = n_words * eps * diameter.  This eps0 is what ``shuffle_epsilon``
    takes; it is usually large, and the amplifier accounts for it honestly.
    """
    if not (eps_per_word >= 0 and math.isfinite(eps_per_word)):
        raise ValueError("eps_per_word must be finite and >= 0")
    if not (isinstance(n_words, (int, np.integer)) and n_words >= 0):
        raise ValueError("n_words must be a non-negative integer")
    if not (diameter >= 0 and math.isfinite(diameter)):
        raise ValueError("diameter must be finite and >= 0")
    return float(n_words) * float(eps_per_word) * float(diameter)
