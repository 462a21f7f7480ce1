"""One language model per release, whatever the route: an offline release file and the curator's
queries over the same release give the same model (``lac.curator.lm.model.release_model``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from lac.common.privacy import Budget, PrivacyUnit
from lac.common.text import sentences
from lac.curator.base.ngrams import NgramVocabulary, count_reports
from lac.curator.lm.model import NgramModel, release_model
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.release.building import PublicCaps
from lac.curator.runner.offline import default_vocab_path, load_counts, offline_spec, release_offline
from lac.curator.runner.run import ReleaseRecord, run
from lac.curator.service import lifecycle
from lac.curator.service.config import CuratorConfig
from lac.curator.service.handlers import query


@pytest.fixture(scope="module")
def lee(tmp_path_factory):
    """Real text (gensim's Lee corpus): the first half is the public corpus, each sentence of the
    next 40% one user, the rest held out; the users' counts over the public vocabulary as files."""
    import gensim

    path = Path(gensim.__file__).parent / "test" / "test_data" / "lee_background.cor"
    s = sentences(path.read_text(encoding="utf-8"))
    a, b = len(s) // 2, int(0.9 * len(s))
    vocab = NgramVocabulary.from_sentences(s[:a], max_n=3, min_count=2, unknown_words=True)
    d = tmp_path_factory.mktemp("lee")
    counts = d / "users.npz"
    sp.save_npz(counts, count_reports([[x] for x in s[a:b]], vocab, C=3, W=100).matrix)
    default_vocab_path(counts).write_text("\n".join(vocab.items) + "\n", encoding="utf-8")
    vocab.save(d / "public.npz")
    return counts, d / "public.npz", vocab, s[b:]


def _served_model(tmp_path: Path, vocab: NgramVocabulary, record: ReleaseRecord, release_file: Path) -> NgramModel:
    """The release file's arrays stored by a curator and its model built by the curator's query path."""

    async def main() -> NgramModel:
        curator = lifecycle.open_state(CuratorConfig(state_dir=tmp_path / "curator"), vocab)
        try:
            with np.load(release_file) as z:
                items = tuple(z["items"].tobytes().decode("utf-8").split("\n"))
                pseudo = z["pseudo_counts"] if "pseudo_counts" in z.files else None
                curator.store.add_release(
                    record.release_id, record.to_json(), items, z["log_probs"], pseudo, [0], None, Budget(1.0)
                )
            return await query.model(curator, record.release_id)
        finally:
            await lifecycle.stop(curator)

    return asyncio.run(main())


@pytest.mark.parametrize("mechanism", ["posterior", "laplace-public"])
def test_offline_file_and_server_give_the_same_model(lee, tmp_path, mechanism):
    counts, public, vocab, test = lee
    spec = ReleaseSpec(epsilon=2.0, mechanism=mechanism, force=True)
    caps = PublicCaps()
    out = tmp_path / "release.npz"
    rec = release_offline(counts, public, spec, caps, out=out, rng=np.random.default_rng(3))
    # the same release as a Release object (same seed), for the curator's record of it
    r = run(load_counts(counts), vocab, offline_spec(spec), caps, PrivacyUnit.user(1), np.random.default_rng(3))
    with np.load(out) as z:
        np.testing.assert_array_equal(z["log_probs"], r.log_probs)
        assert ("pseudo_counts" in z.files) == (mechanism == "posterior")
        assert json.loads(z["record"].tobytes().decode()) == rec
    record = ReleaseRecord.of(r, "offline", "2024-01-01T00:00:00+00:00", vocab.max_n, (0, 0), PrivacyUnit.user(1))

    offline = NgramModel.from_release_file(out)
    served = _served_model(tmp_path, vocab, record, out)
    assert offline.perplexity(test) == served.perplexity(test)
    assert offline.arpa() == served.arpa()
    want = (
        NgramModel.from_counts(list(r.items), r.pseudo_counts, 3, partial=True)
        if r.pseudo_counts is not None
        else NgramModel(list(r.items), r.log_probs, 3)
    )
    assert offline.perplexity(test) == want.perplexity(test)


def test_release_model_routes(lee):
    """Pseudo-counts when there are any (a partial release: context mass backs off), else the distribution."""
    _, _, vocab, test = lee
    items, alpha = list(vocab.items), vocab.alpha
    lp = np.log(alpha / alpha.sum())
    counted = release_model(items, lp, alpha)
    assert counted.perplexity(test) == NgramModel.from_counts(items, alpha, 3, partial=True).perplexity(test)
    assert release_model(items, lp).perplexity(test) == NgramModel(items, lp, 3).perplexity(test)
    assert release_model(["a", "a b"], np.log([0.5, 0.5])).max_n == 2  # default: the longest item
    # pseudo-counts need no log-probabilities (they are not read); a release with neither is refused
    assert release_model(items, None, alpha).perplexity(test) == counted.perplexity(test)
    with pytest.raises(ValueError, match="log-probabilities or its pseudo-counts"):
        release_model(items, None)


@pytest.mark.parametrize("mechanism", ["laplace", "posterior"])
def test_every_item_of_a_release_has_positive_probability(lee, mechanism):
    """Items released with probability 0 (Laplace's clipped noise; a posterior pseudo-count clipped
    at 0) get their back-off share of the smoothed model, taken from the others' discounts."""
    counts, _, vocab, _ = lee
    spec = offline_spec(ReleaseSpec(epsilon=1.0, mechanism=mechanism))
    r = run(load_counts(counts), vocab, spec, PublicCaps(), PrivacyUnit.user(1), np.random.default_rng(5))
    pseudo = r.pseudo_counts
    if pseudo is not None:  # empirical Bayes clips a noisy total far below its prior to 0: every 7th, here
        pseudo = pseudo.copy()
        pseudo[::7] = 0.0
        zero = pseudo == 0
    else:
        zero = np.isneginf(r.log_probs)
    assert zero.sum() > 500
    m = release_model(r.items, r.log_probs, pseudo)
    p = np.array([m.prob(it) for it in r.items])
    assert (p > 0).all()
    orders = np.array([it.count(" ") + 1 for it in r.items])
    for n in (1, 2, 3):
        assert p[orders == n].sum() == pytest.approx(1.0)
    # a zero item's probability is the model's: the smoothed joint, in proportion to any other item's
    z, nz = (int(np.flatnonzero(zero & (orders == 3))[0]), int(np.flatnonzero(~zero & (orders == 3))[0]))
    q = m.smoothed_joint([r.items[z], r.items[nz]])
    assert p[z] / p[nz] == pytest.approx(q[0] / q[1])
    u, v, w = r.items[z].split()
    assert q[0] == pytest.approx(m.smoothed_joint([f"{u} {v}"])[0] * m.conditional(w, (u, v)))
    assert m.prob("zebra okapi") == 0.0  # not an item of the release
