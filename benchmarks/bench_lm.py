#!/usr/bin/env python3
"""Held-out perplexity and build time of the release language model (``lac.curator.lm.model``) on real
text: the Lee news corpus shipped with gensim, first 90% of the sentences to train, last 10% to
test, training words seen once read as ``<unk>`` (in training and test alike).

Rows: our interpolated Kneser–Ney from exact counts (a non-private baseline; modified and plain),
the same through the ARPA file in KenLM (if ``kenlm`` is installed), nltk's
``KneserNeyInterpolated`` (order 3, its standard padding pipeline; slow: it scans for
continuation counts, a few minutes per discount), and the former constant-λ = 0.9 model
(``lac.curator.lm.model`` at commit 8523f57, read with ``git show``).

    python benchmarks/bench_lm.py [--nltk-discounts 0.1 0.75] [--nltk-sentences N]
"""

from __future__ import annotations

import argparse
import math
import subprocess
import tempfile
import time
import types
from collections import Counter
from pathlib import Path

import numpy as np

from lac.common.text import sentences
from lac.curator.base.ngrams import ngrams
from lac.curator.lm.model import UNK, NgramModel

OLD_COMMIT = "8523f57"


def lee() -> list[list[str]]:
    import gensim

    return sentences((Path(gensim.__file__).parent / "test" / "test_data" / "lee_background.cor").read_text())


def counts_of(sents: list[list[str]]) -> tuple[list[str], np.ndarray]:
    c = Counter(g for s in sents for g in ngrams(s, 3))
    items = sorted(c)
    return items, np.array([c[g] for g in items], dtype=float)


def old_model_class():
    """The constant-λ NgramModel as it was before interpolated KN (None outside a git checkout)."""
    root = Path(__file__).resolve().parent.parent
    try:
        src = subprocess.run(
            ["git", "show", f"{OLD_COMMIT}:curator/lac/curator/lm/model.py"],
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    mod = types.ModuleType("lm_lambda09")
    exec(compile(src, "lm_lambda09.py", "exec"), mod.__dict__)
    return mod.NgramModel


def nltk_perplexity(train, test, discount: float) -> float:
    from nltk.lm import KneserNeyInterpolated
    from nltk.lm.preprocessing import padded_everygram_pipeline

    lm = KneserNeyInterpolated(3, discount=discount)
    grams, vocab = padded_everygram_pipeline(3, train)
    lm.fit(grams, vocab)
    total, n = 0.0, 0
    for s in test:
        padded = ["<s>", "<s>"] + s + ["</s>"]
        for i in range(2, len(padded)):
            total += math.log(lm.score(padded[i], padded[i - 2 : i]))
            n += 1
    return math.exp(-total / n)


def timed(f, *a, **kw):
    t = time.perf_counter()
    out = f(*a, **kw)
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nltk-discounts", type=float, nargs="*", default=[0.1, 0.75])
    ap.add_argument(
        "--nltk-sentences",
        type=int,
        default=0,
        help="score nltk on the first N test sentences only (0: all); our rows are then shown on the same subset too",
    )
    args = ap.parse_args()

    s = lee()
    cut = int(0.9 * len(s))
    raw_train, raw_test = s[:cut], s[cut:]
    freq = Counter(w for x in raw_train for w in x)
    keep = {w for w, c in freq.items() if c >= 2}
    train = [[w if w in keep else UNK for w in x] for x in raw_train]
    test = [[w if w in keep else UNK for w in x] for x in raw_test]
    items, counts = counts_of(train)
    n_tok = sum(len(x) + 1 for x in test)
    oov = sum(w == UNK for x in test for w in x)
    print(
        f"Lee corpus: {len(train)} training sentences ({sum(map(len, train))} tokens), {len(test)} test sentences "
        f"({n_tok} scored tokens incl. </s>, {oov} test words <unk>); |V| = {len(keep) + 2}, {len(items)} items"
    )

    exact, t_build = timed(NgramModel.from_counts, items, counts, 3)
    plain = NgramModel.from_counts(items, counts, 3, modified=False)
    legacy, t_legacy = timed(NgramModel, items, np.log(counts / counts.sum()), 3)
    sub = test[: args.nltk_sentences] if args.nltk_sentences else test
    rows = [
        ("(a) ours, modified KN from exact counts (estimated discounts)", exact.perplexity(sub)),
        ("(a) ours, plain interpolated KN from exact counts", plain.perplexity(sub)),
        ("(a) ours, NgramModel(items, log p) with the default total", legacy.perplexity(sub)),
    ]
    try:
        import kenlm
    except ImportError:
        print("kenlm not installed: no ARPA row")
    else:
        with tempfile.TemporaryDirectory() as d:
            exact.write_arpa(Path(d) / "lee.arpa")
            k = kenlm.Model(str(Path(d) / "lee.arpa"))
            lg = sum(k.score(" ".join(x), bos=True, eos=True) for x in sub)
            rows.append(("(a) ours, ARPA file read by KenLM", 10 ** (-lg / sum(len(x) + 1 for x in sub))))
    for d in args.nltk_discounts:
        ppl, t = timed(nltk_perplexity, train, sub, d)
        rows.append((f"(b) nltk KneserNeyInterpolated, discount {d:g} ({t:.0f} s)", ppl))
    old = old_model_class()
    if old is None:
        print("not a git checkout: no constant-lambda row")
    else:
        rows.append(
            (
                "(c) former constant-λ = 0.9 model, same counts",
                old(items, np.log(counts / counts.sum()), 3).perplexity(sub),
            )
        )
        # Without <unk> in training (vocabulary = every training word): how OOV words are priced.
        items2, counts2 = counts_of(raw_train)
        lp2 = np.log(counts2 / counts2.sum())
        raw_sub = raw_test[: len(sub)]
        rows.append(
            (
                "    no <unk> in training: ours (OOV gets its uniform share γ₀/|V|)",
                NgramModel.from_counts(items2, counts2, 3).perplexity(raw_sub),
            )
        )
        rows.append(
            (
                "    no <unk> in training: ours with unk_mass = 0.02",
                NgramModel.from_counts(items2, counts2, 3, unk_mass=0.02).perplexity(raw_sub),
            )
        )
        rows.append(("    no <unk> in training: former constant-λ model", old(items2, lp2, 3).perplexity(raw_sub)))

    print(f"\nheld-out perplexity on {len(sub)} test sentences")
    for name, ppl in rows:
        print(f"  {name:<72} {ppl:10.2f}")
    print(
        f"\nbuild: from_counts {t_build:.3f} s, NgramModel(items, log_probs) {t_legacy:.3f} s for {len(items)} "
        f"items; discounts {[tuple(round(x, 3) for x in d) for d in exact.discounts]}"
    )
    small_items, small_counts = counts_of(train[: len(train) * 5 // 8])
    _, t_small = timed(NgramModel.from_counts, small_items, small_counts, 3)
    _, t_arpa = timed(exact.arpa)
    print(f"build {len(small_items)} items: {t_small:.3f} s; ARPA text of the full model: {t_arpa:.3f} s")
    held = test * 20  # enough words to time
    ppl, t_at_once = timed(exact.perplexity, held)
    ref, t_by_word = timed(perplexity_word_by_word, exact, held)
    print(
        f"perplexity of {sum(len(x) + 1 for x in held):,} words: looked up at once {t_at_once:.3f} s, word by word "
        f"(the definition, the baseline) {t_by_word:.3f} s: {t_by_word / t_at_once:.1f}x faster; equal: {ppl == ref}"
    )


def perplexity_word_by_word(model: NgramModel, sents) -> float:
    """The definition (and the implementation before 2026-11-27): one ``conditional`` per word and sentence end."""
    total, count = 0.0, 0
    for x in sents:
        hist = ["<s>"]
        for w in [*x, "</s>"]:
            p = model.conditional(w, hist[-model.order :])
            total += math.log(p) if p > 0 else -math.inf
            hist.append(w)
            count += 1
    return math.exp(-total / count)


if __name__ == "__main__":
    main()
