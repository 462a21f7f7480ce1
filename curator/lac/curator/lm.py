"""A language model over a released n-gram distribution (post-processing: costs no privacy).

Input: the release vocabulary ``items`` (n-gram strings as in ``lac.curator.ngrams``: tokens
joined by single spaces, sentences padded ``<s> w1 .. wk </s>``, ``<s>`` never an item on its
own) and the released joint ``log_probs`` (natural log, one per item, jointly over all orders).

Three views of it:

* ``prob(g)``: the joint of ``g`` renormalised within its order n (the release is one
  distribution over items of every order; this is the n-gram distribution).
* ``next_word(context, k)``: the conditional from the joint, P(w | h) = p(h w) / Σ_v p(h v) over
  the continuations of h in the vocabulary, for the longest suffix h of the context (at most
  max_n − 1 tokens) that has a continuation; shorter suffixes are tried in turn (back-off), down
  to the unigram distribution. No smoothing: it ranks what the release says.
* A smoothed back-off model (``conditional``, ``perplexity``, ``write_arpa``): interpolated
  with a constant weight λ (``interpolation``) per order,
      P(w | h) = λ·P_joint(w | h) + (1 − λ)·P(w | h⁻)   for contexts h with continuations,
      P(w | h) = P(w | h⁻)                               otherwise (h⁻ = h without its first token),
  and at the bottom P(w) = (1 − u)·p₁(w) + u/|U| (u = ``unk_mass``) over U = unigram items ∪
  {``</s>``, ``<unk>``}; words outside U are read as ``<unk>``. So no event has probability 0
  and perplexity is always finite. An interpolated model is exactly a back-off model with
  back-off weight bow(h) = 1 − λ and stored probabilities P(w | h) for the n-grams h w of the
  vocabulary, which is what ``write_arpa`` writes (log10): the ARPA file and ``conditional``
  give the same numbers, and every context's distribution sums to 1.
  N-grams (n ≥ 2) whose prefix or suffix is not itself in the model, or whose joint is 0, are left
  out of the back-off model (ARPA readers expect both to exist).
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from lac.common.files import atomic_file
from lac.common.text import BOS, EOS

__all__ = ["NgramModel", "UNK"]

UNK = "<unk>"


def _tokens(x: str | Sequence[str]) -> tuple[str, ...]:
    return tuple(x.split()) if isinstance(x, str) else tuple(x)


class NgramModel:
    """Language model of one release; see the module docstring for the three views."""

    def __init__(self, items: Sequence[str], log_probs: np.ndarray, max_n: int = 3, *,
                 interpolation: float = 0.9, unk_mass: float = 1e-3):
        if isinstance(max_n, bool) or not isinstance(max_n, (int, np.integer)) or max_n < 1:
            raise ValueError(f"max_n must be an integer >= 1, got {max_n!r}")
        if not 0 < interpolation < 1:
            raise ValueError(f"interpolation must be in (0, 1), got {interpolation!r}")
        if not 0 < unk_mass < 1:
            raise ValueError(f"unk_mass must be in (0, 1), got {unk_mass!r}")
        lp = np.asarray(log_probs, dtype=np.float64).reshape(-1)
        items = list(items)
        if lp.size != len(items):
            raise ValueError(f"{lp.size} log-probabilities for {len(items)} items")
        if np.isnan(lp).any() or (lp == np.inf).any():
            raise ValueError("log_probs must not be NaN or +inf")
        self.max_n = int(max_n)
        self.interpolation = float(interpolation)
        self.unk_mass = float(unk_mass)
        toks = [_tokens(it) for it in items]
        orders = np.fromiter((len(t) for t in toks), dtype=np.int64, count=len(toks))
        if (orders == 0).any():
            raise ValueError("empty n-gram in items")
        # Joint renormalised within each order (items longer than max_n are ignored).
        self._logp: dict[tuple[str, ...], float] = {}
        for n in range(1, self.max_n + 1):
            idx = np.flatnonzero(orders == n)
            if idx.size == 0:
                continue
            sub = lp[idx]
            top = sub.max()
            if top == -np.inf:
                norm = sub  # all zero: stays -inf
            else:
                norm = sub - (top + math.log(np.exp(sub - top).sum()))
            for i, v in zip(idx.tolist(), norm.tolist()):
                self._logp[toks[i]] = v
        # Conditionals from the joint: context -> (words, probabilities), most probable first.
        groups: dict[tuple[str, ...], tuple[list[str], list[float]]] = {}
        for g, v in self._logp.items():
            if g == (BOS,):
                continue
            ws, ps = groups.setdefault(g[:-1], ([], []))
            ws.append(g[-1])
            ps.append(v)
        self._cond_joint: dict[tuple[str, ...], tuple[list[str], np.ndarray]] = {}
        for h, (ws, ps) in groups.items():
            p = np.exp(np.asarray(ps) - max(ps)) if max(ps) > -np.inf else np.zeros(len(ps))
            s = p.sum()
            if s <= 0:
                continue
            p /= s
            order = np.argsort(-p, kind="stable")
            self._cond_joint[h] = ([ws[i] for i in order], p[order])
        self._build_backoff()

    # -- joint and conditional views ---------------------------------------------------------

    def prob(self, ngram: str | Sequence[str]) -> float:
        """Joint probability of ``ngram`` within its order (0.0 if it is not in the vocabulary)."""
        g = _tokens(ngram)
        if not 1 <= len(g) <= self.max_n:
            raise ValueError(f"an n-gram has 1..{self.max_n} tokens, got {len(g)}")
        return math.exp(self._logp.get(g, -math.inf))

    def next_word(self, context: list[str] | str, k: int = 10) -> list[tuple[str, float]]:
        """The k most probable next words after ``context`` (use ``<s>`` for a sentence start),
        with P(w | h) from the joint for the longest suffix h of the context (≤ max_n − 1 tokens)
        that has continuations in the vocabulary; unigrams if none has."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        h = _tokens(context)
        h = h[len(h) - (self.max_n - 1):] if self.max_n > 1 else ()
        while h not in self._cond_joint and h:
            h = h[1:]
        found = self._cond_joint.get(h)
        if found is None:
            return []
        ws, ps = found
        return [(w, float(p)) for w, p in zip(ws[:k], ps[:k].tolist())]

    def context_used(self, context: list[str] | str) -> tuple[str, ...]:
        """The suffix of ``context`` that ``next_word`` conditions on."""
        h = _tokens(context)
        h = h[len(h) - (self.max_n - 1):] if self.max_n > 1 else ()
        while h not in self._cond_joint and h:
            h = h[1:]
        return h

    # -- smoothed back-off model -------------------------------------------------------------

    def _build_backoff(self) -> None:
        lam = self.interpolation
        uni = {g[0]: v for g, v in self._logp.items() if len(g) == 1 and g[0] != BOS}
        vocab = set(uni) | {EOS, UNK}
        u = self.unk_mass / len(vocab)
        self._p1: dict[str, float] = {w: (1 - self.unk_mass) * math.exp(uni.get(w, -math.inf)) + u for w in vocab}
        self._vocabulary = frozenset(vocab)
        # _entries[n]: n-grams (n >= 2) of the model; _bo: context -> (word -> P(w|h)), bow(h) = 1 - λ.
        self._bo: dict[tuple[str, ...], dict[str, float]] = {}
        self._entries: dict[int, set[tuple[str, ...]]] = {1: {(w,) for w in vocab}}
        contexts_ok = {(w,) for w in vocab} | {(BOS,)}
        for n in range(2, self.max_n + 1):
            kept: dict[tuple[str, ...], list[tuple[str, float]]] = {}
            for g, v in self._logp.items():
                if len(g) != n or v == -math.inf or BOS in g[1:] or EOS in g[:-1]:
                    continue
                if g[:-1] in contexts_ok and g[1:] in self._entries[n - 1]:
                    kept.setdefault(g[:-1], []).append((g[-1], v))
            entries = set()
            for h, wv in kept.items():
                vals = np.array([v for _, v in wv])
                p = np.exp(vals - vals.max())
                p /= p.sum()
                self._bo[h] = {w: lam * float(pw) + (1 - lam) * self.conditional(w, h[1:])
                               for (w, _), pw in zip(wv, p)}
                entries.update(h + (w,) for w, _ in wv)
            self._entries[n] = entries
            contexts_ok = entries

    @property
    def vocabulary(self) -> frozenset[str]:
        """Words the smoothed model knows (others read as ``<unk>``)."""
        return self._vocabulary

    def _word(self, w: str) -> str:
        return w if w in self._p1 else UNK

    def conditional(self, word: str, context: list[str] | str | tuple[str, ...] = ()) -> float:
        """P(word | context) under the smoothed back-off model (words outside it read as ``<unk>``)."""
        word = self._word(word)
        h = tuple(self._word(t) if t != BOS else t for t in _tokens(context))
        h = h[len(h) - (self.max_n - 1):] if self.max_n > 1 else ()
        scale = 1.0
        while h:
            t = self._bo.get(h)
            if t is not None:
                p = t.get(word)
                if p is not None:
                    return scale * p
                scale *= 1.0 - self.interpolation
            h = h[1:]
        return scale * self._p1[word]

    def perplexity(self, sentences: Iterable[Sequence[str] | str]) -> float:
        """exp(−mean log P) over every word and each sentence's ``</s>`` (empty sentences skipped)
        under the smoothed back-off model; finite for any input."""
        total, count = 0.0, 0
        for s in sentences:
            words = [self._word(w) for w in _tokens(s)]
            if not words:
                continue
            hist = [BOS]
            for w in words + [EOS]:
                total += math.log(self.conditional(w, hist))
                hist.append(w)
                count += 1
        if count == 0:
            raise ValueError("no words to score")
        return math.exp(-total / count)

    def write_arpa(self, path_or_file: str | os.PathLike | io.TextIOBase) -> None:
        """Write the back-off model as an ARPA file (log10 probabilities and back-off weights)."""
        if isinstance(path_or_file, (str, os.PathLike)):
            with atomic_file(Path(path_or_file)) as f:
                text = io.TextIOWrapper(f, encoding="utf-8", newline="\n")
                self._write_arpa(text)
                text.flush()
                text.detach()
        else:
            self._write_arpa(path_or_file)

    def arpa(self) -> str:
        """The ARPA file as a string."""
        buf = io.StringIO()
        self._write_arpa(buf)
        return buf.getvalue()

    def _write_arpa(self, f) -> None:
        bow = f"{math.log10(1.0 - self.interpolation):.7f}"
        ctxs = set(self._bo)
        counts = {1: len(self._p1) + 1}
        for n in range(2, self.max_n + 1):
            counts[n] = len(self._entries[n])
        top = max((n for n in counts if counts[n]), default=1)
        f.write("\n\\data\\\n")
        for n in range(1, top + 1):
            f.write(f"ngram {n}={counts[n]}\n")
        f.write("\n\\1-grams:\n")
        f.write("-99.0000000\t<s>" + (f"\t{bow}" if (BOS,) in ctxs and top > 1 else "") + "\n")
        for w in sorted(self._p1):
            tail = f"\t{bow}" if (w,) in ctxs and top > 1 else ""
            f.write(f"{math.log10(self._p1[w]):.7f}\t{w}{tail}\n")
        for n in range(2, top + 1):
            f.write(f"\n\\{n}-grams:\n")
            for g in sorted(self._entries[n]):
                tail = f"\t{bow}" if g in ctxs and n < top else ""
                f.write(f"{math.log10(self._bo[g[:-1]][g[-1]]):.7f}\t{' '.join(g)}{tail}\n")
        f.write("\n\\end\\\n")

    @classmethod
    def from_release_file(cls, path: str | os.PathLike, max_n: int = 3, **kw) -> "NgramModel":
        """From an offline release ``.npz`` (``lac curator release --counts ... --out``)."""
        with np.load(os.fspath(path), allow_pickle=False) as z:
            items = z["items"].tobytes().decode("utf-8").split("\n")
            return cls(items, z["log_probs"], max_n, **kw)
