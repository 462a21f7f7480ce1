"""Exact Euclidean nearest-row search (and the exact diameter) for word embeddings.

"Exact" means: the same answer as the float64 brute force ``reference_nearest_rows``,
i.e. ``argmin_j sum((p - v_j)**2)`` evaluated in float64, ties to the lowest row.

Speed comes from a float32 GEMM: for each point p, the score
``s_j = ||v_j||^2 - 2 p.v_j`` (= squared distance minus the constant ||p||^2) is computed
in float32, together with a rigorous bound E(p) on its rounding error.  Every row whose
float32 score is within ``2E + 2e64`` of the smallest one is a candidate (e64 bounds the
rounding of the float64 reference itself); candidates are re-ranked with the reference
formula.  The true reference winner is always a candidate, so the result is identical.
Usually the only candidate is the float32 winner and no re-ranking is needed.

Two backends compute the float32 scores; the candidate rule and re-ranking are shared.

* ``fused`` (default where available): a compiled AVX-512 or AVX2+FMA kernel (``_nearest_kernel.c``,
  loaded with ctypes; ``NearestIndex.isa`` says which) that keeps scores in registers and tracks
  per point the best score, its row and the smallest score of any other row, so no score matrix is
  ever written.  It runs on every core (Python threads; ctypes releases the GIL).
* ``blas``: blocks of 1024 points are multiplied against cache-sized tiles of vocabulary rows
  by numpy's BLAS; per tile only a row-wise argmin runs over the scores.  Tiles whose minimum
  is above best + margin hold no candidate, now or later (best only decreases).

Either way, only points whose second score is within the margin of their best ("ambiguous":
ties, near-ties) are searched again exhaustively and re-ranked.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import itertools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from lac.common.config import CORES

_Scan = tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.float64]]

_U32 = 2.0**-24  # unit roundoff, float32
_U64 = 2.0**-53  # unit roundoff, float64
_SLACK = 1.0 + 1e-6  # covers the float64 rounding of the error bounds themselves
_BLOCK_ENTRIES = 1 << 22  # score-matrix entries per block (16 MiB in float32)
_QUERY_BLOCK = 1024  # points per GEMM: enough arithmetic per loaded vocabulary row to be compute-bound
_TILE_ENTRIES = 1 << 21  # scores per (points x vocabulary tile) GEMM: 8 MiB, stays in the L3 cache
_MIN_TILE = 256
_LANES, _MICRO = 16, 6  # fused kernel: vocabulary rows per panel, points per micro-kernel
_FUSED_BLOCK = 4096  # points per fused-kernel call (its state is 192 bytes per point)
_L2_BYTES = 384 * 1024  # vocabulary bytes per fused chunk: fits a 512 KiB L2 cache with room to spare
BACKENDS = ("auto", "fused", "blas")
ISAS = {"avx2": 1, "avx512": 2}  # the fused kernel's vectorised paths (its ``isa`` argument)


@functools.lru_cache(maxsize=1)
def _kernel() -> ctypes.CDLL | None:
    """The compiled fused kernel via ctypes, or None (not built, or no AVX2 + FMA on this CPU)."""
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_nearest_kernel{suffix}"
        if path.exists():
            break
    else:
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:
        return None
    if not lib.lac_nearest_simd():
        return None
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.lac_nearest_scan.argtypes = [ptr, ptr, i64, ctypes.c_int, ptr, i64, ptr, ptr, ptr, i64, ctypes.c_int]
    lib.lac_nearest_scan.restype = ctypes.c_int
    return lib


def fused_available() -> bool:
    """True if the compiled fused kernel is installed and this CPU runs it."""
    return _kernel() is not None


def fused_isas() -> tuple[str, ...]:
    """The fused kernel's paths this CPU runs (``ISAS``), fastest last; empty without the kernel."""
    lib = _kernel()
    best = lib.lac_nearest_simd() if lib is not None else 0
    return tuple(name for name, level in ISAS.items() if level <= best)


@functools.lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=CORES, thread_name_prefix="lac-nearest")


def _gamma(k: int, u: float) -> float:
    """Higham's gamma_k = k u / (1 - k u): bound on relative error of k rounded ops."""
    return k * u / (1.0 - k * u)


def sqdist64(points: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The reference squared distance: ``sum((p - v)**2, axis=-1)`` in float64.

    Broadcasts like numpy; the reduction is always over the contiguous last axis,
    so re-ranking and brute force round identically.
    """
    diff = np.asarray(points, dtype=np.float64) - np.asarray(rows, dtype=np.float64)
    out: np.ndarray = np.square(diff).sum(axis=-1)
    return out


def reference_nearest_rows(points: np.ndarray, vectors: np.ndarray, block: int = 8) -> np.ndarray:
    """Brute force: argmin of float64 squared distances, ties to the lowest index (slow; for tests)."""
    p = np.asarray(points, dtype=np.float64)
    v = np.asarray(vectors, dtype=np.float64)
    out = np.empty(len(p), dtype=np.int64)
    for s in range(0, len(p), block):
        out[s : s + block] = np.argmin(sqdist64(p[s : s + block, None, :], v[None, :, :]), axis=1)
    return out


class NearestIndex:
    """Exact Euclidean nearest-row queries against fixed ``vectors`` (V x d, float32 or float64)."""

    def __init__(
        self, vectors: np.ndarray, norms2: np.ndarray | None = None, backend: str = "auto", isa: str | None = None
    ):
        """``backend``: "fused" (compiled kernel), "blas" (numpy GEMM tiles) or "auto" (fused if available);
        ``isa``: the fused kernel's path (``ISAS``; default the fastest this CPU runs, ``fused_isas()``)."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if isa is not None and isa not in fused_isas():
            raise ValueError(f"isa must be one of {', '.join(fused_isas()) or '(none here)'}, got {isa!r}")
        v = np.asarray(vectors)
        if v.ndim != 2 or v.shape[0] == 0 or v.shape[1] == 0:
            raise ValueError(f"vectors must be a non-empty 2-D array, got shape {v.shape}")
        if v.dtype not in (np.float32, np.float64):
            raise TypeError(f"vectors must be float32 or float64, got {v.dtype}")
        size, dim = v.shape
        n64 = np.einsum("ij,ij->i", v, v, dtype=np.float64)
        if not np.all(np.isfinite(n64)):
            raise ValueError("vectors must be finite")
        if norms2 is None:
            n32 = n64.astype(np.float32)
        else:
            n32 = np.asarray(norms2)
            if n32.shape != (size,):
                raise ValueError(f"norms2 must have shape ({size},), got {n32.shape}")
            # Only squared norms within the analysed rounding error keep the search exact.
            if not np.all(np.abs(n32.astype(np.float64) - n64) <= _gamma(dim + 2, _U32) * n64):
                raise ValueError("norms2 are not the squared row norms of vectors")
        self.vectors = v
        self.size, self.dim = size, dim
        self.max_norm = float(np.sqrt(n64.max())) * _SLACK
        self._n32 = np.asarray(n32, dtype=np.float32)
        self._aug: dict[np.dtype[Any], np.ndarray] = {}
        fused = backend != "blas" and fused_available() and size < 2**31 - _LANES
        if backend == "fused" and not fused:
            raise RuntimeError(
                "the fused nearest-row kernel is not available here "
                "(not compiled at install, or the CPU lacks AVX2/FMA); use backend='blas'"
            )
        self.backend = "fused" if fused else "blas"
        self.isa = (isa or fused_isas()[-1]) if fused else None  # the fused kernel's path, None for blas
        if fused:
            self._panels, self._panel_norms = self._build_panels()
        else:
            self._augmented(np.dtype(np.float32))

    def _build_panels(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows as [panel][dim][16] float32 of -2 v (padding rows 0) and norms (padding +inf)."""
        npanels = -(-self.size // _LANES)
        panels = np.zeros((npanels, self.dim, _LANES), dtype=np.float32)
        step = 1 << 12  # panels per copy: bounds the temporary
        for p0 in range(0, npanels, step):
            rows = self.vectors[p0 * _LANES : min(p0 + step, npanels) * _LANES]
            full = len(rows) // _LANES
            chunk = np.multiply(rows, -2.0, dtype=np.float32)  # exact: power-of-two scaling
            panels[p0 : p0 + full] = chunk[: full * _LANES].reshape(full, _LANES, self.dim).transpose(0, 2, 1)
            if len(rows) % _LANES:
                panels[p0 + full, :, : len(rows) % _LANES] = chunk[full * _LANES :].T
        norms = np.full(npanels * _LANES, np.inf, dtype=np.float32)
        norms[: self.size] = self._n32
        return panels, norms

    def _augmented(self, dtype: np.dtype[Any]) -> np.ndarray:
        """Augmented rows [-2 v, ||v||^2] so one GEMM with [p, 1] yields the score directly."""
        if dtype not in self._aug:
            aug = np.empty((self.size, self.dim + 1), dtype=dtype)
            np.multiply(self.vectors, -2.0, out=aug[:, : self.dim], casting="unsafe")  # exact scaling
            aug[:, self.dim] = self._n32
            self._aug[dtype] = aug
        return self._aug[dtype]

    def _prepare(self, points: np.ndarray) -> tuple[npt.NDArray[np.float64], np.dtype[Any], npt.NDArray[np.float64]]:
        """Validated float64 points, GEMM dtype and per-point candidate margin."""
        p = np.asarray(points, dtype=np.float64)
        if p.ndim != 2 or p.shape[1] != self.dim:
            raise ValueError(f"points must have shape (m, {self.dim}), got {p.shape}")
        if p.shape[0] == 0:
            return p, np.dtype(np.float32), np.empty(0)
        pnorm = np.sqrt(np.einsum("ij,ij->i", p, p)) * _SLACK
        if not np.all(np.isfinite(pnorm)):
            raise ValueError("points must be finite")
        big_m = self.max_norm
        if (pnorm.max() + big_m) ** 2 > 1e300:
            raise ValueError("points are too far from the vectors for exact float64 distances")
        # float32 GEMM unless its products could overflow; then float64 with the same analysis.
        dtype = np.dtype(np.float32) if 2 * pnorm.max() * big_m + big_m**2 < 1e36 else np.dtype(np.float64)
        u = _U32 if dtype == np.float32 else _U64
        # |score error| <= gamma_{2d+3} (2||p|| M + M^2): input cast, GEMM of length d+1 in any
        # summation order (FMA or not), and the stored squared norms.  The float64 reference
        # distance itself is within gamma64_{d+3} (||p|| + M)^2 of the real one.
        err = _gamma(2 * self.dim + 3, u) * (2 * pnorm * big_m + big_m**2)
        err64 = _gamma(self.dim + 3, _U64) * (pnorm + big_m) ** 2
        margin = (2 * err + 2 * err64) * _SLACK + 1e-30  # 1e-30 absorbs float32 underflow
        return p, dtype, margin

    def query(self, points: np.ndarray, block: int | None = None) -> np.ndarray:
        """Row index of the nearest vector for each point (int64), identical to the float64 brute force.

        ``block`` is the number of points per GEMM or kernel call (default 1024 for blas,
        4096 for fused).  Points with any second row within the candidate margin of their
        best are re-ranked against all rows (``_query_exhaustive``).
        """
        p, dtype, margin = self._prepare(points)
        m = p.shape[0]
        if m == 0:
            return np.empty(0, dtype=np.int64)
        if block is not None and int(block) < 1:
            raise ValueError("block must be >= 1")
        gemm_block = int(block or _QUERY_BLOCK)
        if dtype != np.float32:
            return self._query_exhaustive(p, margin, dtype, gemm_block)
        if self.backend == "fused":
            out, best, second = self._scan_fused(p, int(block or _FUSED_BLOCK))
        else:
            out, best, second = self._scan_blas(p, margin, gemm_block)
        amb = np.flatnonzero(second <= np.nextafter(best + margin, np.inf))
        if amb.size:
            out[amb] = self._query_exhaustive(p[amb], margin[amb], np.dtype(np.float32), gemm_block)
        return out

    def _scan_fused(self, p: np.ndarray, block: int) -> _Scan:
        """Float32 winner, its score and the smallest other score per point, from the fused kernel."""
        m = p.shape[0]
        q32 = p.astype(np.float32)  # the same rounding the BLAS path applies
        out = np.empty(m, dtype=np.int64)
        best, second = np.empty(m), np.empty(m)
        chunk = max(1, _L2_BYTES // (self.dim * _LANES * 4))

        def run(lo: int, hi: int) -> None:
            for s in range(lo, hi, block):
                e = min(s + block, hi)
                out[s:e], best[s:e], second[s:e] = self._scan_block(q32[s:e], chunk)

        threads = min(CORES, max(1, m // (8 * _MICRO)))
        if threads == 1:
            run(0, m)
        else:
            cuts = np.linspace(0, m, threads + 1).astype(int)
            for f in [_pool().submit(run, int(lo), int(hi)) for lo, hi in itertools.pairwise(cuts)]:
                f.result()
        return out, best, second

    def _scan_block(self, q32: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One fused-kernel call over a block of float32 points: winner, its score, the runner-up score."""
        kernel = _kernel()
        if kernel is None:  # the fused backend is only chosen when the kernel loaded
            raise RuntimeError("the fused nearest-row kernel is not loaded")
        n = q32.shape[0]
        nmicro = -(-n // _MICRO)
        packed = np.zeros((nmicro * _MICRO, self.dim), dtype=np.float32)
        packed[:n] = q32
        packed = np.ascontiguousarray(packed.reshape(nmicro, _MICRO, self.dim).transpose(0, 2, 1))
        lane_best = np.full((nmicro * _MICRO, _LANES), np.inf, dtype=np.float32)
        lane_second = np.full_like(lane_best, np.inf)
        lane_idx = np.zeros(lane_best.shape, dtype=np.int32)
        rc = kernel.lac_nearest_scan(
            self._panels.ctypes.data,
            self._panel_norms.ctypes.data,
            self._panels.shape[0],
            self.dim,
            packed.ctypes.data,
            nmicro,
            lane_best.ctypes.data,
            lane_second.ctypes.data,
            lane_idx.ctypes.data,
            chunk,
            ISAS[self.isa] if self.isa else 0,
        )
        if rc != 0:
            raise RuntimeError(f"fused nearest-row kernel failed ({rc})")
        lane_best, lane_second, lane_idx = lane_best[:n], lane_second[:n], lane_idx[:n]
        # Across lanes: the smallest score, and on equal scores the lowest row.
        top = lane_best.min(axis=1)
        rows = np.where(lane_best == top[:, None], lane_idx, np.iinfo(np.int32).max)
        lane = rows.argmin(axis=1)
        at = np.arange(n)
        winner = rows[at, lane]
        lane_best[at, lane] = np.inf
        second = np.minimum(lane_second.min(axis=1), lane_best.min(axis=1))
        return winner, top, second

    def _scan_blas(self, p: np.ndarray, margin: np.ndarray, block: int) -> _Scan:
        """Float32 winner, its score and the smallest other score that could matter, from BLAS tiles."""
        m = p.shape[0]
        out = np.empty(m, dtype=np.int64)
        best_all, second_all = np.empty(m), np.empty(m)
        block = min(block, m)
        tile = int(min(self.size, max(_MIN_TILE, _TILE_ENTRIES // block)))
        aug = self._augmented(np.dtype(np.float32))
        buf = np.ones((block, self.dim + 1), dtype=np.float32)
        scores_buf = np.empty((block, tile), dtype=np.float32)
        for start in range(0, m, block):
            stop = min(start + block, m)
            nb = stop - start
            buf[:nb, : self.dim] = p[start:stop]
            pb = buf[:nb]
            rows = np.arange(nb)
            best = np.full(nb, np.inf)  # smallest float32 score so far (held in float64)
            second = np.full(nb, np.inf)  # smallest score of any other row that could matter
            idx = np.zeros(nb, dtype=np.int64)
            mg = margin[start:stop]
            for t0 in range(0, self.size, tile):
                t1 = min(t0 + tile, self.size)
                sc = scores_buf[:nb, : t1 - t0]
                np.matmul(pb, aug[t0:t1].T, out=sc)
                # Single-threaded on purpose: splitting it over Python threads measured slower on
                # 2 cores (likely because OpenBLAS's worker keeps spinning briefly after each GEMM).
                arg = sc.argmin(axis=1)
                tmin = sc[rows, arg].astype(np.float64)
                # Tiles whose minimum exceeds best + margin can hold no candidate now or later
                # (best only decreases); the others are "contenders".
                c = np.flatnonzero(tmin <= np.nextafter(best + mg, np.inf))
                if c.size == 0:
                    continue
                sub = sc[c]
                sub[np.arange(c.size), arg[c]] = np.inf
                tsec = sub.min(axis=1).astype(np.float64)
                old, new = best[c], tmin[c]
                better = new < old  # strict: on equal scores the earlier (lower) row stays
                second[c] = np.minimum(np.minimum(second[c], tsec), np.where(better, old, new))
                best[c] = np.where(better, new, old)
                idx[c] = np.where(better, t0 + arg[c], idx[c])
            out[start:stop], best_all[start:stop], second_all[start:stop] = idx, best, second
        return out, best_all, second_all

    def _query_exhaustive(self, p: np.ndarray, margin: np.ndarray, dtype: np.dtype[Any], block: int) -> np.ndarray:
        """Full score rows per block of points, every candidate within the margin re-ranked in float64.

        Used for points with near-ties (rare) and when float32 products could overflow.
        """
        m = p.shape[0]
        out = np.empty(m, dtype=np.int64)
        aug_t = self._augmented(dtype).T
        block = max(1, min(block, _BLOCK_ENTRIES // self.size))
        buf = np.ones((min(block, m), self.dim + 1), dtype=dtype)
        for start in range(0, m, block):
            stop = min(start + block, m)
            nb = stop - start
            pb = buf[:nb]
            pb[:, : self.dim] = p[start:stop]
            scores = pb @ aug_t
            best = scores.argmin(axis=1)
            smin = scores[np.arange(nb), best].astype(np.float64)
            # Threshold rounded up into the score dtype, so the comparison never loses a candidate.
            thr = np.nextafter((smin + margin[start:stop]).astype(dtype), dtype.type(np.inf))
            out[start:stop] = best
            # A point is ambiguous iff its second-smallest score is also under the threshold.
            scores[np.arange(nb), best] = np.inf
            amb = np.flatnonzero(scores.min(axis=1) <= thr)
            if amb.size:
                scores[amb, best[amb]] = -np.inf  # the winner stays a candidate
                rr, cc = np.nonzero(scores[amb] <= thr[amb, None])
                dist = sqdist64(p[start + amb[rr]], self.vectors[cc])
                order = np.lexsort((cc, dist, rr))  # by point, then distance, then row
                rr_o = rr[order]
                first = np.ones(order.size, dtype=bool)
                first[1:] = rr_o[1:] != rr_o[:-1]
                out[start + amb[rr_o[first]]] = cc[order[first]]
        return out


def nearest_rows(
    points: np.ndarray,
    vectors: np.ndarray,
    norms2: np.ndarray | None = None,
    block: int | None = None,
    backend: str = "auto",
) -> np.ndarray:
    """Exact Euclidean nearest row of ``vectors`` for each point (int64), ties to the lowest index.

    ``norms2`` (squared row norms, e.g. ``Embedding.norms2``) is optional.  ``block`` is the
    number of points per GEMM or kernel call; ``backend`` as for ``NearestIndex``.  To query
    the same vectors repeatedly, build a ``NearestIndex`` once.
    """
    return NearestIndex(vectors, norms2, backend).query(points, block=block)


def farthest_pair(vectors: np.ndarray) -> tuple[float, int, int]:
    """Exact diameter ``max_{i,j} sqrt(sum((v_i - v_j)**2))`` (float64) and one pair attaining it.

    Blocked float32 GEMM over pairs with a rigorous rounding bound, exact float64 re-ranking
    of near-maximal candidates, and pruning by the triangle inequality through the centroid
    (pairs with ||v_i - c|| + ||v_j - c|| below an attained distance cannot be the maximum).
    """
    v = np.asarray(vectors)
    if v.ndim != 2 or v.shape[0] == 0:
        raise ValueError(f"vectors must be a non-empty 2-D array, got shape {v.shape}")
    v64 = np.asarray(v, dtype=np.float64)
    size, dim = v64.shape
    if size == 1:
        return 0.0, 0, 0
    n64 = np.einsum("ij,ij->i", v64, v64)
    if not np.all(np.isfinite(n64)):
        raise ValueError("vectors must be finite")
    big_m = float(np.sqrt(n64.max())) * _SLACK
    if 4 * big_m**2 > 1e36:
        raise ValueError("vectors too large for the float32 diameter search")
    # Pair score n_i + n_j - 2 v_i.v_j from one GEMM of length d+2: [v_i, n_i, 1].[-2 v_j, 1, n_j].
    err = _gamma(2 * dim + 5, _U32) * 4 * big_m**2
    err64 = _gamma(dim + 3, _U64) * 4 * big_m**2
    margin = (2 * err + 2 * err64) * _SLACK + 1e-30

    centre = v64.mean(axis=0)
    radius = np.sqrt(sqdist64(v64, centre))
    order = np.argsort(-radius, kind="stable")
    r_sorted = radius[order]
    vs = v64[order]
    n32 = n64[order].astype(np.float32)
    left = np.empty((size, dim + 2), dtype=np.float32)
    left[:, :dim] = vs
    left[:, dim] = n32
    left[:, dim + 1] = 1.0
    right = np.empty((size, dim + 2), dtype=np.float32)
    right[:, :dim] = -2.0 * vs
    right[:, dim] = 1.0
    right[:, dim + 1] = n32

    # Seed with an attained value: the farthest row from the row farthest from the centroid.
    d0 = sqdist64(vs, vs[0])
    j0 = int(np.argmax(d0))
    best = (float(d0[j0]), 0, j0)
    running = best[0] - err - err64  # a valid lower bound for any collected candidate's score
    slack = 1.0 - 1e-9
    pos = 0
    while pos < size:
        bound = np.sqrt(best[0]) * slack
        if r_sorted[pos] + r_sorted[0] < bound:
            break  # no remaining pair can reach the attained distance
        # Rows j (sorted position < stop) that can pair with some i in this block.
        ncols = int(np.searchsorted(-r_sorted, -(bound - r_sorted[pos]), side="right"))
        rows_per_block = max(1, _BLOCK_ENTRIES // max(1, min(ncols, size)))
        stop = min(pos + rows_per_block, size)
        ncols = min(max(ncols, 1), stop)
        scores = left[pos:stop] @ right[:ncols].T
        running = max(running, float(scores.max()))
        thr = np.nextafter(np.float32(running - margin), np.float32(-np.inf))  # round down: keep candidates
        ii, jj = np.nonzero(scores >= thr)
        if ii.size:
            dist = sqdist64(vs[pos + ii], vs[jj])
            k = int(np.argmax(dist))
            if dist[k] > best[0]:
                best = (float(dist[k]), pos + int(ii[k]), int(jj[k]))
        pos = stop
    i, j = sorted((int(order[best[1]]), int(order[best[2]])))
    return float(np.sqrt(best[0])), i, j
