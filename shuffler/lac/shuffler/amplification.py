"""Privacy accounting for the amplifier: what shuffling (or Poisson sub-sampling) buys.

Plain library, numpy + math only (the shuffler must not depend on scipy).

Shuffling: the default bound (``method="numerical"``)
======================================================
Setting: a batch of n reports, each from a distinct user, each produced by the same
eps0-LDP local randomizer R (write p = e^eps0, e = e^eps), released uniformly permuted.
Neighbouring batches differ in one user's input (the victim: x0 versus x1); the other
users' inputs are arbitrary and known to the adversary.

**Bound.**  For every eps in [0, eps0] the shuffled batch is (eps, delta(eps))-DP with
delta(eps) = H_e(P || Q), the hockey-stick divergence of the "stronger clone" pair

    C ~ Bin(n-1, 2/(p+1)),   A | C ~ Bin(C, 1/2),   D ~ Bern(p/(p+1)),
    P = (A + D, C - A + 1 - D),        Q = (A + 1 - D, C - A + D).

Q is P mirrored, so H_e(Q || P) = H_e(P || Q).  This is the pair of Feldman, McMillan,
Talwar, "Stronger Privacy Amplification by Shuffling for Renyi and Approximate
Differential Privacy" (SODA 2023, Thm 3.2), and of Wang et al., "Privacy Amplification
via Shuffling: Unified, Simplified, and Tightened" (VLDB 2024) with the parameters of a
general eps0-LDP randomizer (p = q = e^eps0, beta = (p-1)/(p+1)).  Their general proofs
have a gap: the FMT'23 errata restricts the theorem to a class of randomizers, and (as we
read it) Wang et al.'s Lemma 4.5 re-inserts the victim's "common" component W by a rule that
depends on the count A + B only, which is not the right conditional law when
beta' = TV(R(x0), R(x1)) < (p-1)/(p+1).  This module relies on the following proof.

1. Decomposition (Wang et al., Lemma 4.4).  With a = beta'/(p-1),
   U0 = (R(x0) - R(x1))_+ / beta', U1 = (R(x1) - R(x0))_+ / beta' and w = 1 - (p+1) a >= 0
   there is a distribution W with
       R(x0) = p a U0 + a U1 + w W,        R(x1) = a U0 + p a U1 + w W,
   and eps0-LDP (R(z) >= R(x)/p pointwise) gives, for every other user's input z,
       R(z) >= a U0 + a U1 + (w/p) W       (on {R(x0) >= R(x1)} the right side is R(x0)/p).
2. Clones.  Each other user independently outputs a sample of U0 (probability a), of
   U1 (a), of W (w/p) or of its own leftover law.  The shuffled batch is a
   post-processing of the counts X = (X0, X1, XW) of U0, U1 and W samples (victim
   included; the set of leftover users is uniform given its size), and since the victim
   is one of n draws,  H_e = E[max(0, (p-e) X0 + (1-pe) X1 + p(1-e) XW)] / n  with
   X ~ Mult(n; a, a, w/p, rest).
3. Monotonicity in a (proved here).  The cell probabilities move with a along
   (1, 1, -(p+1)/p, -(p-1)/p), so with g = max(0, .) and Y the statistic on n-1 draws,
       d/da E[g] = n E[g(Y+c0) + g(Y+c1) - (p+1)/p g(Y+cW) - (p-1)/p g(Y)],
   (c0, c1, cW) = (p-e, 1-pe, p(1-e)).  The law {cW w.p. (p+1)/2p, 0 w.p. (p-1)/2p} has
   the mean (c0+c1)/2 of the law {c0, c1 w.p. 1/2 each} and lies in [c1, c0] when e <= p,
   so it is smaller in convex order and the derivative is >= 0.  At a = 1/(p+1) (w = 0)
   the counts are exactly the pair (P, Q) above, which therefore bounds every
   eps0-LDP randomizer.

The bound is nearly attained: 3-ary randomized response (others' inputs on the third value)
is exactly (0.11703, 1e-6)-DP after shuffling at eps0 = 4, n = 1e5, against 0.11815 here
(tests/shuffler/test_amplification.py computes such lower bounds independently).

**Evaluation (every approximation errs upwards).**  Given C = c the likelihood ratio
P/Q = (p x + c+1-x)/(x + p(c+1-x)) increases with the first coordinate x, so

    H_e = sum_c Pr[C=c] max_k (A S_c(k-1) + B S_c(k)),  A = (p-e)/(p+1) >= 0, B = (1-pe)/(p+1) <= 0,

with S_c(k) = Pr[Bin(c, 1/2) >= k].  ``numerical_delta``:

* takes k as the best of the three integers around the computed threshold, so rounding
  of the threshold cannot lose the maximum;
* computes S_c as suffix sums of non-negative pmf terms (one log-gamma anchor per c, then
  a product of ratios) over a window beyond which Hoeffding bounds the tail by tau: tau is
  added to S_c(k-1) and nothing to S_c(k), whose coefficient is negative;
* drops values of C outside a Chernoff interval and adds both Chernoff tail bounds; when C
  has many likely values they are grouped in blocks, each block weighted at its smallest c
  (the c-term is non-increasing in c: one more clone is a post-processing);
* multiplies by an explicit relative slack that covers log-gamma, product and summation
  rounding.

``shuffle_epsilon`` then searches the smallest eps with delta(eps) <= delta by repeated
multi-section and returns the *upper* end of a bracket narrower than ``tol`` (relative
below eps = 1): a point at which the bound was verified.  "No amplification" (reported as
eps = eps0, delta = 0) means the bound is not below eps_loc = log(p - delta (p+1)) -- what
eps0-LDP alone gives at this delta, the randomized-response curve -- by more than 1e-6 eps0
(the precision at which statements print epsilon).

Other shuffling bounds (for comparison)
=======================================
* ``method="fmt21"``: Feldman, McMillan, Talwar, "Hiding Among the Clones" (FOCS 2021),
  Theorem 3.2: the same pair with C ~ Bin(n-1, e^-eps0) (valid for every eps0-LDP
  randomizer since R(z) >= (R(x0) + R(x1)) / 2p).
* ``method="fmt21_nomix"``: that pair without the Bernoulli mixing (D = 1), this module's
  former default: conservative (joint convexity) and looser.
* ``method="closed_form"``: FMT'21 Theorem 3.1.  For eps0 <= log(n / (16 log(2/delta))),
      eps = log(1 + (e^eps0 - 1)/(e^eps0 + 1) * (8 sqrt(e^eps0 log(4/delta)) / sqrt(n) + 8 e^eps0 / n)).

Poisson sub-sampling -- each record is kept independently with probability q; an
(eps0, delta0)-DP mechanism run on the sample is (log(1 + q(e^eps0 - 1)), q delta0)-DP
(e.g. Balle, Barthe, Gaboardi 2018, "Privacy amplification by subsampling", Thm. 8).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from lac.common.checks import check_int
from lac.common.privacy import check_delta, check_epsilon

__all__ = [
    "METHODS",
    "AmplificationResult",
    "closed_form_valid",
    "local_only_epsilon",
    "numerical_delta",
    "shuffle_epsilon",
    "subsampling_epsilon",
    "subsampling_statement",
]

METHODS = ("numerical", "fmt21", "fmt21_nomix", "closed_form")
DEFAULT_TOL = 1e-7  # final bracket width on eps, relative below eps = 1
_GRID = 32  # points per multi-section pass
_MAX_ROWS = 1024  # values of C evaluated separately before grouping into blocks
_CHUNK = 1 << 20  # pmf entries per working array (8 MB)
_TABLE = 1 << 22  # tail-table entries kept per curve (32 MB)
_EPS0_MAX = 700.0  # above: clone probability < 1e-300, nothing to gain (and e^eps overflows)
_NO_GAIN = 1e-6  # relative gain over the local guarantee below which we say "no amplification"
_ULP = 2.0**-52

_ASSUMPTIONS = (
    "assumes each of the n reports comes from a distinct user and is produced by the same "
    "eps0-LDP local randomizer, that the shuffler releases the batch uniformly permuted with no "
    "other identifying metadata, and that neighbouring batches differ in one user's input"
)

_THEOREMS = {
    "numerical": (
        "stronger-clone bound of Feldman-McMillan-Talwar 2023 (Thm 3.2 pair) and Wang et al. 2024 "
        "(p=q=e^eps0): hockey-stick divergence of P=(A+D, C-A+1-D) vs Q=(A+1-D, C-A+D) with "
        "C~Bin(n-1, 2/(e^eps0+1)), A~Bin(C,1/2), D~Bern(e^eps0/(e^eps0+1)), an upper bound for every "
        "eps0-LDP randomizer (proof in lac.shuffler.amplification), computed numerically and rounded up"
    ),
    "fmt21": (
        "Feldman-McMillan-Talwar 2021 (Hiding Among the Clones) Theorem 3.2 (the same pair with "
        "C~Bin(n-1, e^-eps0)), computed numerically and rounded up"
    ),
    "fmt21_nomix": (
        "Feldman-McMillan-Talwar 2021 (Hiding Among the Clones) Theorem 3.2 reduction without the "
        "Bernoulli mixing (conservative), computed numerically and rounded up"
    ),
    "closed_form": "Feldman-McMillan-Talwar 2021 (Hiding Among the Clones), Theorem 3.1, closed form",
}


@dataclass(frozen=True)
class AmplificationResult:
    """The central (epsilon, delta) guarantee of one shuffled batch.

    ``amplified`` is False when shuffling buys nothing (the bound does not beat the local
    guarantee, or eps0 lies outside the theorem's range); ``epsilon`` is then eps0 itself
    (with delta = 0 the local guarantee already holds for the shuffled batch, by
    post-processing).
    """

    eps0: float
    n: int
    delta: float
    epsilon: float
    method: str
    amplified: bool
    statement: str

    def to_dict(self) -> dict:
        """The result as a plain dict (JSON-able)."""
        return asdict(self)


# ---------------------------------------------------------------------------- helpers


def _check(eps0: float, n: int, delta: float) -> None:
    check_int(n, "n")
    check_epsilon(eps0, "eps0")
    check_delta(delta, allow_zero=False)


def _kl_bernoulli(x: float, log_q: float, log_1mq: float) -> float:
    """KL(Bern(x) || Bern(q)), q given by its logs (stable for q near 0 or 1)."""
    out = 0.0
    if x > 0:
        out += x * (math.log(x) - log_q)
    if x < 1:
        out += (1 - x) * (math.log1p(-x) - log_1mq)
    return max(out, 0.0)


def _likely_range(m: int, log_q: float, log_1mq: float, log_inv_tail: float) -> tuple[int, int, float]:
    """[lo, hi] holding all but a Chernoff-bounded mass of Bin(m, q); returns (lo, hi, excluded bound)."""
    mean = m * math.exp(log_q)

    def bound(k: int) -> float:  # m KL(k/m || q): log of the Chernoff bound
        return m * _kl_bernoulli(k / m, log_q, log_1mq)

    # upper: smallest k >= mean with Pr[C >= k] <= e^-bound(k) <= tail (bound increases above the mean)
    a, b = min(m, math.ceil(mean)), m
    if bound(b) < log_inv_tail:
        hi, upper = m, 0.0
    else:
        while a < b:
            mid = (a + b) // 2
            a, b = (mid + 1, b) if bound(mid) < log_inv_tail else (a, mid)
        hi, upper = a - 1, math.exp(-bound(a))
    a, b = 0, max(0, math.floor(mean))
    if bound(a) < log_inv_tail:
        lo, lower = 0, 0.0
    else:  # largest k <= mean with bound(k) >= log_inv_tail
        while a < b:
            mid = (a + b + 1) // 2
            a, b = (mid, b) if bound(mid) >= log_inv_tail else (a, mid - 1)
        lo, lower = a + 1, math.exp(-bound(a))
    return lo, max(hi, lo), (upper + lower) * (1 + 1e-9)


def _log_binom_pmf_at(m: int, k: int, log_q: float, log_1mq: float) -> float:
    out = math.lgamma(m + 1) - math.lgamma(k + 1) - math.lgamma(m - k + 1)
    return out + (k * log_q if k else 0.0) + ((m - k) * log_1mq if m - k else 0.0)


def _pair_params(method: str, eps0: float) -> tuple[float, float, float, float]:
    """(log clone prob, log(1 - clone prob), log mix, log(1 - mix)) of a method's pair."""
    lpx = math.log1p(math.exp(-eps0))  # log(1 + e^-eps0)
    log_mix, log_1m_mix = -lpx, -eps0 - lpx  # p/(p+1), 1/(p+1)
    log_1m_e = math.log(-math.expm1(-eps0))  # log(1 - e^-eps0)
    if method == "numerical":  # clone prob 2/(p+1)
        return math.log(2.0) - eps0 - lpx, log_1m_e - lpx, log_mix, log_1m_mix
    if method == "fmt21":  # clone prob e^-eps0
        return -eps0, log_1m_e, log_mix, log_1m_mix
    return -eps0, log_1m_e, 0.0, -math.inf  # fmt21_nomix: D = 1


# ---------------------------------------------------------------------------- numerical bound


class _PrivacyCurve:
    """Upper bounds on delta(eps) = H_{e^eps}(P || Q) of one clone pair, for fixed (eps0, n).

    Everything independent of eps (the likely values of C, their weights, the table of
    Bin(c, 1/2) tails over each Hoeffding window) is prepared once; ``delta`` then reads
    three candidate thresholds per (c, eps) from the table, for a whole grid of eps.
    """

    def __init__(self, method: str, eps0: float, n: int, delta_target: float):
        self.eps0 = eps0
        log_q, log_1mq, log_mix, log_1m_mix = _pair_params(method, eps0)
        self.mix, self.w1 = math.exp(log_mix), math.exp(log_1m_mix)  # w = Pr[D = 1], 1 - w
        self.mixing = self.w1 > 0
        self.expm1_eps0 = math.expm1(eps0)
        m = n - 1  # C ~ Bin(m, clone prob)
        # Mass dropped by the C range and by each Hoeffding window: 1e-7 of the target delta.
        tail = 1e-7 * delta_target
        self.log_inv_tail = -math.log(tail)
        if m == 0:
            lo = hi = 0
            pc, self.excluded, log_pc_size = np.ones(1), 0.0, 0.0
        else:
            lo, hi, self.excluded = _likely_range(m, log_q, log_1mq, self.log_inv_tail)
            cs = np.arange(lo, hi)
            steps = np.log((m - cs) / (cs + 1.0)) + (log_q - log_1mq)  # log pmf(c+1) - log pmf(c)
            anchor = _log_binom_pmf_at(m, lo, log_q, log_1mq)
            pc = np.exp(anchor + np.concatenate(([0.0], np.cumsum(steps))))
            log_pc_size = abs(anchor) + float(np.abs(steps).sum())  # what rounding of the logs scales with
        rows = np.arange(lo, hi + 1)
        # Hoeffding: Pr[Bin(c,1/2) >= c/2 + s] <= exp(-2 s^2/c); the window of tails kept per c
        # reaches s = sqrt(c log(1/tail) / 2).  Cap the table at _TABLE entries by grouping c.
        width = math.ceil(math.sqrt(hi * self.log_inv_tail / 2)) + 6
        max_rows = max(64, min(_MAX_ROWS, _TABLE // width))
        if len(rows) > max_rows:  # blocks of consecutive c, each weighted at its smallest c
            size = -(-len(rows) // max_rows)
            starts = np.arange(0, len(rows), size)
            self.c, self.weight = rows[starts], np.add.reduceat(pc, starts)
        else:
            self.c, self.weight = rows, pc
        c = self.c.astype(float)
        self.k_hi = np.minimum(self.c, np.ceil(c / 2 + np.sqrt(c * self.log_inv_tail / 2))).astype(np.int64)
        gap = self.k_hi + 1 - c / 2
        with np.errstate(divide="ignore", invalid="ignore"):
            beyond = np.where(self.k_hi < self.c, np.exp(-2 * gap * gap / np.maximum(c, 1.0)), 0.0)
        self.beyond = beyond + 1e-300 * (self.k_hi + 2)  # + whatever underflowed inside the window
        self.k_lo = np.maximum(0, (self.c + 1) // 2 - 3)  # below the lowest index any eps >= 0 reads
        self.S = self._tails()
        # Relative slack for rounding: the log-gamma anchors (a few ulp of lgamma(n+1) + n log 2),
        # one ulp per step of the running products and sums, the summed log-weights of C.
        self.rel_slack = 1e-12 + 64 * _ULP * (math.lgamma(n + 1) + n + self.S.shape[1] + log_pc_size + len(rows))

    def _tails(self) -> np.ndarray:
        """S[r, i] = Pr[k_hi[r] + 1 - i <= Bin(c[r], 1/2) <= k_hi[r]]  (so S[r, 0] = 0).

        Row by row from the top of the window down: one log-gamma anchor at k_hi, then
        b(a-1) = b(a) a/(c-a+1); S is a running sum of these non-negative terms.  Columns
        past k_hi - k_lo + 1 are never read.
        """
        c, k_hi = self.c, self.k_hi
        width = int((k_hi - self.k_lo).max()) + 2
        S = np.zeros((len(c), width))
        down = np.arange(width - 2, dtype=float)
        step = max(1, _CHUNK // width)
        for r0 in range(0, len(c), step):
            cc, kh = c[r0 : r0 + step], k_hi[r0 : r0 + step]
            top = np.array(
                [
                    math.lgamma(x + 1) - math.lgamma(k + 1) - math.lgamma(x - k + 1)
                    for x, k in zip(cc.tolist(), kh.tolist())
                ]
            ) + cc * math.log(0.5)
            a = kh.astype(float)[:, None] - down  # b(a-1) / b(a) = a / (c-a+1)
            ratio = (cc + 1.0)[:, None] - a
            np.divide(a, ratio, out=ratio)  # rows shorter than the table: unread
            pmf = np.empty((len(cc), width - 1))
            pmf[:, 0] = np.exp(top)
            np.cumprod(ratio, axis=1, out=pmf[:, 1:])
            pmf[:, 1:] *= pmf[:, :1]
            np.cumsum(pmf, axis=1, out=S[r0 : r0 + step, 1:])
        return S

    def _threshold_index(self, eps: np.ndarray) -> np.ndarray:
        """Computed first x with P/Q > e^eps given C = c (exact up to one unit either way)."""
        em = np.exp(-eps)
        if self.mixing:  # (e w - (1-w)) / ((2w-1)(1+e)) = (p - e^-eps) / ((p-1)(1 + e^-eps)), in expm1 form
            frac = (self.expm1_eps0 - np.expm1(-eps)) / (self.expm1_eps0 * (1.0 + em))
        else:  # x / (c+1-x) > e
            frac = 1.0 / (1.0 + em)
        return np.floor(np.outer(self.c + 1, frac)).astype(np.int64) + 1

    def delta(self, eps) -> np.ndarray:
        eps = np.atleast_1d(np.asarray(eps, dtype=float))
        # P <= p Q pointwise for a mixing pair: delta = 0 from eps0 on (and A below would be < 0)
        live = (eps < self.eps0) if self.mixing else np.ones(eps.shape, bool)
        out = np.zeros_like(eps)
        if not live.any():
            return out
        ev = eps[live]
        # A = w - e(1-w) >= 0 and B = (1-w) - e w < 0 in cancellation-free forms, then rounded
        # towards a larger bound: A up by 4 ulp, B towards 0 by 4 ulp (relative).
        if self.mixing:
            A = (self.expm1_eps0 - np.expm1(ev)) * self.w1
            B = -(np.expm1(ev) * self.mix + math.tanh(self.eps0 / 2))
        else:
            A, B = np.ones_like(ev), -np.exp(ev)
        A, B = A + 4 * _ULP, B * (1 - 4 * _ULP)
        col = (self.k_hi + 1)[:, None] - self._threshold_index(ev)  # column of S holding S(k*)
        last = self.S.shape[1] - 1
        best = np.zeros((len(self.c), len(ev)))
        for shift in (-1, 0, 1):
            j = col - shift
            # k > k_hi: column <= 0 holds 0 (tau is added below); S(-1) = S(0) = 1 when k_lo = 0
            s_lo = np.take_along_axis(self.S, np.clip(j + 1, 0, last), axis=1)
            s_hi = np.take_along_axis(self.S, np.clip(j, 0, last), axis=1)
            bound = A * (s_lo * (1 + self.rel_slack) + self.beyond[:, None]) + B * (s_hi * (1 - self.rel_slack))
            np.maximum(best, bound, out=best)
        out[live] = (self.weight @ best) * (1 + self.rel_slack) + self.excluded
        return np.minimum(out, 1.0)


def numerical_delta(eps, eps0: float, n: int, *, tiny: float | None = None, method: str = "numerical") -> np.ndarray:
    """Upper bound on delta(eps) of a method's clone pair (default: the stronger-clone pair), per eps.

    ``tiny`` is the target delta that sets the truncation (dropped mass <= 1e-7 * tiny per
    cut, added to the bound); it only affects tightness, never soundness.
    """
    eps_arr = np.atleast_1d(np.asarray(eps, dtype=float))
    if np.any(eps_arr < 0) or not np.all(np.isfinite(eps_arr)):
        raise ValueError("eps must be finite and >= 0")
    if method not in ("numerical", "fmt21", "fmt21_nomix"):
        raise ValueError(f"method must be 'numerical', 'fmt21' or 'fmt21_nomix', got {method!r}")
    _check(eps0, n, 0.5)
    if eps0 > _EPS0_MAX:
        raise ValueError(f"eps0 above {_EPS0_MAX:g} is not evaluated (no amplification there)")
    return _PrivacyCurve(method, float(eps0), int(n), tiny if tiny is not None else 1e-12).delta(eps_arr)


def local_only_epsilon(eps0: float, delta: float) -> float:
    """The eps with (eps, delta)-DP that eps0-LDP alone gives: log(p - delta (p+1)), floored at 0.

    Randomized response's privacy curve (p - e^eps)/(p+1) is the largest of any eps0-DP pair.
    """
    x = delta * (1.0 + math.exp(-eps0))  # 1 - e^(eps - eps0) at the solution
    return max(0.0, eps0 + math.log1p(-x)) if x < 1 else 0.0


def _numerical_epsilon(method: str, eps0: float, n: int, delta: float, tol: float) -> tuple[float, bool]:
    """Smallest eps (to within tol, rounded up) with delta(eps) <= delta; (eps0, False) if no gain."""
    if eps0 > _EPS0_MAX:
        return eps0, False
    curve = _PrivacyCurve(method, eps0, n, delta)
    if curve.delta(eps0)[0] > delta:
        return eps0, False
    lo, hi = 0.0, eps0  # invariant: delta(hi) <= delta was verified
    while hi - lo > tol * min(1.0, hi) and hi > 1e-12:
        grid = np.linspace(lo, hi, _GRID + 1)[1:-1]
        ok = curve.delta(grid) <= delta
        if not ok.any():
            lo = float(grid[-1])
            continue
        # delta(eps) is non-increasing in eps: bracket the first grid point that satisfies it
        j = int(np.argmax(ok))
        lo, hi = (float(grid[j - 1]) if j > 0 else lo), float(grid[j])
    gained = hi < local_only_epsilon(eps0, delta) - _NO_GAIN * eps0
    return hi, gained


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


def shuffle_epsilon(
    eps0: float, n: int, delta: float, method: str = "numerical", *, tol: float = DEFAULT_TOL
) -> AmplificationResult:
    """Central (epsilon, delta) of a uniformly shuffled batch of n eps0-LDP reports.

    ``method="numerical"`` (default): the stronger-clone bound (module docstring), with
    delta(eps) over-estimated and a search returning the upper end of a bracket of width
    <= ``tol`` * min(1, eps).  ``"fmt21"`` / ``"fmt21_nomix"``: FMT'21 Theorem 3.2 with / without the
    mixing step, same evaluation (for comparison).  ``"closed_form"``: FMT'21 Theorem 3.1,
    only when eps0 <= log(n / (16 log(2/delta))).  When nothing is gained the result
    carries ``epsilon = eps0`` and ``amplified = False``.
    """
    _check(eps0, n, delta)
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    n, eps0, delta = int(n), float(eps0), float(delta)
    theorem = _THEOREMS[method]
    assumptions = f"{_ASSUMPTIONS}; eps0={eps0:.6g}"
    no_gain = (
        f"the {theorem} gives nothing beyond the local guarantee; the batch is only ({eps0:.6g}, 0)-DP, "
        f"the local guarantee [{assumptions}]."
    )
    if method == "closed_form":
        if not closed_form_valid(eps0, n, delta):
            limit = n / (16.0 * math.log(2.0 / delta))
            limit_txt = f"log(n/(16 log(2/delta))) = {math.log(limit):.4g}" if limit > 0 else "undefined"
            return _result(
                eps0,
                n,
                delta,
                eps0,
                method,
                False,
                f"No amplification: the {theorem} needs eps0 <= {limit_txt}, but eps0={eps0:.6g} "
                f"(n={n}, delta={delta:.3g}); only the local ({eps0:.6g}, 0)-DP guarantee "
                f"applies [{assumptions}].",
            )
        eps = _closed_form_epsilon(eps0, n, delta)
        amplified = eps < eps0
        valid = ", valid since eps0 <= log(n/(16 log(2/delta)))"
    else:
        eps, amplified = _numerical_epsilon(method, eps0, n, delta, tol)
        valid = ""
    if not amplified:
        return _result(eps0, n, delta, eps0, method, False, f"No amplification: at n={n}, delta={delta:.3g} {no_gain}")
    return _result(
        eps0,
        n,
        delta,
        eps,
        method,
        True,
        f"Shuffling n={n} reports makes the batch ({eps:.6g}, {delta:.3g})-DP centrally "
        f"[{theorem}{valid}; {assumptions}].",
    )


def _result(eps0, n, delta, eps, method, amplified, statement) -> AmplificationResult:
    return AmplificationResult(
        eps0=float(eps0),
        n=int(n),
        delta=float(delta),
        epsilon=float(eps),
        method=method,
        amplified=bool(amplified),
        statement=statement,
    )


def subsampling_epsilon(eps0: float, q: float) -> float:
    """Amplification by Poisson sub-sampling with rate q: eps = log(1 + q (e^eps0 - 1)).

    An (eps0, delta0)-DP mechanism applied to a Poisson sample (each record kept
    independently with probability q) is (log(1 + q(e^eps0 - 1)), q * delta0)-DP with
    respect to adding/removing one record.  See ``subsampling_statement``.
    """
    check_epsilon(eps0, "eps0", allow_zero=True)
    if not (0 <= q <= 1):
        raise ValueError(f"q must be in [0, 1], got {q!r}")
    if q == 0:
        return 0.0
    if eps0 > 700:  # e^eps0 overflows: log(1 + q(e^eps0 - 1)) = eps0 + log(q + (1 - q) e^-eps0)
        return eps0 + math.log(q + (1.0 - q) * math.exp(-eps0))
    return math.log1p(q * math.expm1(eps0))


def subsampling_statement(eps0: float, q: float, delta0: float = 0.0) -> str:
    """The guarantee Poisson sub-sampling at rate ``q`` gives an (ε0, δ0)-DP mechanism, in words."""
    eps = subsampling_epsilon(eps0, q)
    return (
        f"Poisson sub-sampling at rate q={q:.6g} turns an ({eps0:.6g}, {delta0:.3g})-DP mechanism into an "
        f"({eps:.6g}, {q * delta0:.3g})-DP one [amplification by sub-sampling, eps = log(1 + q(e^eps0 - 1)), "
        f"delta = q*delta0; add/remove-one neighbouring; assumes each record is kept independently "
        f"with probability q and which records were sampled stays secret]."
    )
