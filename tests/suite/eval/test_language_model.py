"""`lac eval`'s language-model rows are the curator's models of the same releases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lac.common.privacy import PrivacyUnit
from lac.common.text import sentences
from lac.curator.base.ngrams import NgramVocabulary
from lac.curator.lm.model import release_model
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.release.building import PublicCaps
from lac.curator.runner.run import run
from lac.suite.eval.config import EvalConfig
from lac.suite.eval.data import count
from lac.suite.eval.language_model import row_model


@pytest.fixture(scope="module")
def lee():
    """Real text (gensim's Lee corpus): public half, one user per sentence of the next 40%, the rest held out."""
    import gensim

    path = Path(gensim.__file__).parent / "test" / "test_data" / "lee_background.cor"
    s = sentences(path.read_text(encoding="utf-8"))
    a, b = len(s) // 2, int(0.9 * len(s))
    vocab = NgramVocabulary.from_sentences(s[:a], max_n=3, min_count=2, unknown_words=True)
    cfg = EvalConfig(W=100, C=3)
    return count(vocab, [[x] for x in s[a:b]], cfg), cfg, s[b:]


@pytest.mark.parametrize("name", ["laplace", "laplace-public", "posterior"])
def test_eval_rows_build_the_curators_model_of_the_same_release(lee, name):
    counts, cfg, test = lee
    eval_model = row_model(name, counts, 2.0, cfg, np.random.default_rng(11), K=cfg.table_k)
    # the same release (same caps, same draws) made by the curator's release path, and its model there
    spec = ReleaseSpec(epsilon=2.0, delta=cfg.delta, mechanism=name, discovery=False)
    r = run(counts.U, counts.vocab, spec, PublicCaps(W=cfg.W, C=cfg.C), PrivacyUnit.report(), np.random.default_rng(11))
    served = release_model(r.items, r.log_probs, r.pseudo_counts, max_n=3)
    # equal up to the curator's rounding of released log-probabilities to multiples of 2⁻⁴⁰
    assert eval_model.perplexity(test) == pytest.approx(served.perplexity(test), rel=1e-9)
