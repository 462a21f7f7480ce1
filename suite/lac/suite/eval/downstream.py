"""A classifier trained on privatized text, tested on clean text: seed 002's downstream use.

Seed 002 (§2, §5.2) asks what an analyst can still learn from the shuffled privatized reports, e.g. a
classifier trained on them. This section measures it with the real Localizer and, in one setting, with the
real export path (``lac.curator.store.export``):

- **task**: topic classification of short texts (WordNet 3.0 definitions labelled with their lexicographer
  category, the authorship section's topic set, ``authorship.labelled_sets``), joined into texts of
  ``downstream_words`` words (at most the deployment's L = 40 words, so each text is one report);
- **classifier**: scikit-learn TF-IDF on word 1-2-grams + a linear SVM (``authorship.linear_topic_classifier``);
- **train** on the training texts privatized by the Localizer (multivariate Laplace over GloVe 6B 50d) at
  each preset of ``lac.client.presets`` and a sweep of ε per word, and on the clean training texts (the
  baseline); **test** every model on the same CLEAN held-out texts: what a model learnt from privatized
  reports is worth on the users' real text;
- **through the export path** (the ``downstream_export_preset``): the privatized training reports are sealed
  to a real curator's key (HPKE), ingested by a real curator server (IngestBatch, one closed accounting
  window per topic, as a shuffler delivers batches), exported over gRPC by ``CuratorClient.export_reports`` (one
  export per window: the rows come shuffled and unlabelled, the window says which collection they are), and
  the classifier is trained on the exported rows;

each with the accuracy's chance level (the largest class share of the test set) and a two-sided 95%
Clopper–Pearson interval. App developers run ``evaluate`` on their own labelled texts.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lac.client.localizer import Localizer, PrivatizedReport
from lac.client.presets import PRESETS

from .authorship import (
    CONFIDENCE,
    LabelledSplit,
    Score,
    clean_view,
    default_localizer_factory,
    labelled_sets,
    linear_topic_classifier,
    snippets,
)

__all__ = ["DEFAULT_EPSILONS", "evaluate", "export_round_trip", "downstream_data", "run", "figure"]

DEFAULT_EPSILONS = (3.0, 5.0, 8.0, 10.0, 15.0, 25.0)


def _settings(epsilons: Sequence[float]) -> list[dict[str, Any]]:
    names = {p.epsilon: p.name for p in PRESETS.values()}
    return [{"epsilon": e, "preset": names.get(e)} for e in sorted(set(map(float, epsilons)) | set(names))]


def _score(model, split: LabelledSplit, chance: float) -> dict[str, Any]:
    return Score.of(model.predict(split.test_texts), split.test_labels, chance).as_dict()


def evaluate(
    split: LabelledSplit,
    localizer_factory: Callable[[float], Localizer] | None = None,
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
    *,
    classifier: Callable[[np.random.Generator], Any] = linear_topic_classifier,
    rng: np.random.Generator | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Train ``classifier`` on ``split``'s training texts privatized by ``localizer_factory(ε)`` (default: the
    presets' Localizer) at each of ``epsilons`` and each preset's ε, and on the clean training texts; test each
    model on the clean test texts. Returns a JSON-able dict: sizes, ``chance``, ``clean`` (the clean-trained
    model's score) and ``rows`` (epsilon, preset, words_kept: share of training words the Localizer left
    unchanged, correct, n, accuracy, ci_low, ci_high, relative: accuracy / the clean model's)."""
    rng = rng if rng is not None else np.random.default_rng()
    say = progress or (lambda _m: None)
    s = LabelledSplit(
        [clean_view(x) for x in split.train_texts],
        list(split.train_labels),
        [clean_view(x) for x in split.test_texts],
        list(split.test_labels),
    )
    if not all(s.train_texts) or not all(s.test_texts):
        raise ValueError("every text needs at least one word the tokeniser reads (a-z, 0-9)")
    if len(set(s.train_labels)) < 2:
        raise ValueError("at least two classes are needed")
    factory = localizer_factory if localizer_factory is not None else default_localizer_factory()
    chance = s.chance()
    say("clean")
    clean = _score(classifier(rng).fit(s.train_texts, s.train_labels), s, chance)
    rows = []
    for st in _settings(epsilons):
        say(f"ε = {st['epsilon']:g}" + (f" ({st['preset']})" if st["preset"] else ""))
        private = [r.text for r in factory(st["epsilon"]).privatize_many(s.train_texts)]
        sc = _score(classifier(rng).fit(private, s.train_labels), s, chance)
        rows.append({**st, "words_kept": _kept(s.train_texts, private), **sc, "relative": _relative(sc, clean)})
    return {
        "classes": len(set(s.train_labels) | set(s.test_labels)),
        "train": len(s.train_texts),
        "test": len(s.test_texts),
        "train_words": sum(len(x.split()) for x in s.train_texts),
        "test_words": sum(len(x.split()) for x in s.test_texts),
        "chance": chance,
        "clean": clean,
        "rows": rows,
        "confidence": CONFIDENCE,
    }


def _kept(clean: Sequence[str], private: Sequence[str]) -> float:
    n = sum(len(x.split()) for x in clean)
    same = sum(a == b for x, y in zip(clean, private) for a, b in zip(x.split(), y.split()))
    return same / max(n, 1)


def _relative(score: dict[str, Any], clean: dict[str, Any]) -> float:
    return score["accuracy"] / clean["accuracy"] if clean["accuracy"] else float("nan")


# --- the export path ------------------------------------------------------------------------------------


class _Curator:
    """A real curator server in this process (own event loop thread, plaintext gRPC on 127.0.0.1:0)."""

    def __init__(self, config) -> None:
        from lac.curator.base.ngrams import NgramVocabulary
        from lac.curator.service import lifecycle
        from lac.curator.service.server import create_server

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        vocab = NgramVocabulary.from_sentences([["the"]], max_n=config.max_n)  # releases are not used here

        async def start() -> int:
            self.curator = lifecycle.open_state(config, vocab)
            self.server, port = create_server(self.curator)
            await self.server.start()
            return port

        self.port = asyncio.run_coroutine_threadsafe(start(), self.loop).result(120)

    def stop(self) -> None:
        from lac.curator.service import lifecycle

        async def stop() -> None:
            await self.server.stop(1)
            await lifecycle.stop(self.curator)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(120)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def export_round_trip(
    reports: dict[str, list[PrivatizedReport]], localizer: Localizer, workdir: Path
) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Seal each label's privatized ``reports`` to a fresh curator key (HPKE), ingest them into a real curator
    server as one batch of one closed accounting window per label (as a shuffler delivers them, with the
    shuffle accountant's statement), export each window over gRPC with ``CuratorClient.export_reports`` and
    return the exported rows (words joined by spaces) per label, with the exports' guarantee statement and
    the curator's ledger of exports."""
    from lac.analyst import CuratorClient
    from lac.client.submit import report_content
    from lac.common import envelope
    from lac.common.deployment import Deployment
    from lac.common.v1 import curator_pb2, curator_pb2_grpc, reports_pb2
    from lac.curator.service.config import CuratorConfig
    from lac.shuffler.amplification import shuffle_epsilon

    eps = localizer.mechanism.epsilon
    some = next(r for rs in reports.values() for r in rs)
    keys = workdir / "keys"
    config = CuratorConfig(
        state_dir=workdir / "curator",
        port=0,
        key_dir=keys,
        insecure=True,  # plaintext gRPC on loopback; the reports themselves are HPKE-sealed
        export_identities="downstream-eval",
        epsilon_per_word=eps,
        embedding=some.embedding,
        word_distance_bound=float(localizer.diameter),
        clean_estimate=False,
        ingest_workers=1,
        min_signal_share=0.0,
        shuffler_release_interval_seconds=0.0,  # no shuffler: the batches below are all there is of a window
        forward_horizon_seconds=0.0,
    )
    envelope.generate_key(keys)
    key = envelope.CuratorKeyRing.load(keys).public_key()
    d: Deployment = config.deployment
    labels = sorted(reports)
    newest_closed = d.window(time.time()) - 1
    window_of = {label: newest_closed - i for i, label in enumerate(labels)}
    server = _Curator(config)
    try:
        import grpc

        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            ingest = curator_pb2_grpc.CuratorIngestStub(ch)
            for label in labels:
                rs, w = reports[label], window_of[label]
                r = shuffle_epsilon(d.report_epsilon0, len(rs), 1e-6) if d.report_epsilon0 <= 700 else None
                amplified = r is not None and r.amplified
                privacy = reports_pb2.BatchPrivacy(
                    n_reports=len(rs),
                    report_epsilon0=d.report_epsilon0,
                    delta=r.delta if r is not None and amplified else 0.0,
                    central_epsilon=r.epsilon if r is not None and amplified else d.report_epsilon0,
                    amplified=amplified,
                    method=r.method if r is not None and amplified else "none",
                    statement=r.statement if r is not None else f"No amplification: ε0 = {d.report_epsilon0:.6g}",
                    distinct_clients=True,
                    reports_per_window=d.reports_per_window,
                    window_seconds=d.window_seconds,
                    first_window=w,
                    last_window=w,
                )
                reply = ingest.IngestBatch(
                    curator_pb2.IngestBatchRequest(
                        batch_id=f"downstream-{w}",
                        reports=[envelope.seal(report_content(x), key) for x in rs],
                        privacy=privacy,
                    ),
                    timeout=300,
                )
                if reply.accepted != len(rs):
                    raise RuntimeError(f"the curator accepted {reply.accepted} of {len(rs)} reports of {label}")
        out: dict[str, list[str]] = {}
        statement = ""
        with CuratorClient(f"127.0.0.1:{server.port}", insecure=True) as c:
            for label in labels:
                got = c.export_reports(window_of[label])
                out[label] = got.texts()
                statement = got.statement
            ledger = c.exports(as_arrow=True).to_pylist()
    finally:
        server.stop()
    return out, {"statement": statement, "exports": len(ledger), "rows": sum(e["rows"] for e in ledger)}


# --- data from packages and the `lac eval` section --------------------------------------------------


def downstream_data(cfg, rng: np.random.Generator) -> tuple[LabelledSplit, dict[str, Any]]:
    """The topic task from packages: WordNet 3.0 definitions (Debian ``wordnet-base``) of the
    ``downstream_topics`` lexicographer categories, each category's definitions shuffled and joined into texts
    of ``downstream_words`` words, ``downstream_train`` training and ``downstream_test`` test texts per topic."""
    _, defs = labelled_sets()
    by_topic: dict[str, list[str]] = defaultdict(list)
    for text, lex in defs:
        by_topic[lex].append(text)
    split = LabelledSplit([], [], [], [])
    need = cfg.downstream_train + cfg.downstream_test
    for lex in cfg.downstream_topics:
        sn = snippets(by_topic[lex], need, cfg.downstream_words, rng, link_ngram=None)
        if len(sn) < need:
            raise RuntimeError(
                f"WordNet has too few {lex} definitions for {need} texts of {cfg.downstream_words} words"
            )
        split.test_texts.extend(sn[: cfg.downstream_test])
        split.test_labels.extend([lex] * cfg.downstream_test)
        split.train_texts.extend(sn[cfg.downstream_test :])
        split.train_labels.extend([lex] * cfg.downstream_train)
    info = {
        "definitions": len(defs),
        "topics": [{"topic": t, "definitions": len(by_topic[t])} for t in cfg.downstream_topics],
        "text_words": cfg.downstream_words,
    }
    return split, info


def run(cfg, out: Path, rng: np.random.Generator) -> dict[str, Any]:
    """The ``lac eval`` section: the sweep in process, the export path at one preset, the figure ``downstream.png``."""
    import sys

    def say(m: str) -> None:
        print(f"  downstream: {m}", file=sys.stderr, flush=True)

    split, info = downstream_data(cfg, rng)
    factory = default_localizer_factory(cfg.downstream_embedding_vocab, rng)
    res = evaluate(split, factory, cfg.downstream_epsilons, rng=rng, progress=say)
    res["data"] = info
    res["embedding"] = f"GloVe 6B 50d, {cfg.downstream_embedding_vocab:,} words"
    preset = PRESETS[cfg.downstream_export_preset]
    say(f"export path at {preset.name} (ε = {preset.epsilon:g}): seal, ingest, export, train")
    loc = factory(preset.epsilon)
    train = [clean_view(x) for x in split.train_texts]
    private = loc.privatize_many(train)
    by_label: dict[str, list[PrivatizedReport]] = defaultdict(list)
    for report, label in zip(private, split.train_labels):
        by_label[label].append(report)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lac-downstream-") as tmp:
        exported, ledger = export_round_trip(dict(by_label), loc, Path(tmp))
    texts = [t for label in sorted(exported) for t in exported[label]]
    labels = [label for label in sorted(exported) for _ in exported[label]]
    test = LabelledSplit([], [], [clean_view(x) for x in split.test_texts], list(split.test_labels))
    sc = _score(linear_topic_classifier(rng).fit(texts, labels), test, res["chance"])
    res["export"] = {
        "preset": preset.name,
        "epsilon": preset.epsilon,
        "rows": len(texts),
        "seconds": time.perf_counter() - t0,
        **ledger,
        **sc,
        "relative": _relative(sc, res["clean"]),
    }
    res["figure"] = figure(res, out / "downstream.png").name
    return res


def figure(res: dict, path: Path) -> Path:
    """Clean-test accuracy vs ε per word of the classifier trained on privatized text (95% CIs), the clean-trained
    classifier, chance, the presets and the export-path point."""
    from . import plots

    fig, axes = plots.new(
        1, f"Topic classifier trained on privatized text, tested on clean text ({res['classes']} topics)"
    )
    ax = axes[0]
    rows = sorted(res["rows"], key=lambda r: r["epsilon"])
    x = [r["epsilon"] for r in rows]
    y = np.array([r["accuracy"] for r in rows])
    err = np.array([[r["accuracy"] - r["ci_low"] for r in rows], [r["ci_high"] - r["accuracy"] for r in rows]])
    ax.errorbar(x, y, yerr=err, fmt="o-", ms=4, capsize=2, label="trained on privatized (in process)")
    c = res["clean"]
    ax.axhline(c["accuracy"], color="g", ls=":", lw=1, label=f"trained on clean text {c['accuracy']:.3f}")
    ax.axhline(res["chance"], color="k", ls="--", lw=1, label=f"chance {res['chance']:.3f}")
    e = res.get("export")
    if e:
        ax.errorbar(
            [e["epsilon"]],
            [e["accuracy"]],
            yerr=[[e["accuracy"] - e["ci_low"]], [e["ci_high"] - e["accuracy"]]],
            fmt="s",
            color="C3",
            ms=6,
            capsize=3,
            label="trained on exported reports (sealed → curator → export)",
        )
    for r in rows:
        if r["preset"]:
            ax.axvline(r["epsilon"], color="0.6", lw=0.8)
            ax.text(r["epsilon"], 0.02, f" {r['preset']}", fontsize=7, rotation=90, va="bottom", color="0.4")
    ax.set_ylim(0, 1)
    ax.set_xscale("log")
    ax.set_xticks(x, [f"{v:g}" for v in x])
    ax.minorticks_off()
    ax.set_ylabel(f"accuracy on {res['test']} clean test texts (95% CI)")
    return plots.finish(fig, axes, path, xlabel="ε per word of the training texts (log scale; presets marked)")
