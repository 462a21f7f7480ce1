"""Evaluation settings: one frozen dataclass, with presets ``tiny`` (tests), ``quick`` and ``default``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace


@dataclass(frozen=True)
class EvalConfig:
    """Every setting of one evaluation run (data, mechanisms, figure grids); defaults are the full run."""

    seed: int = 20240601  # evaluation randomness only (a simulation, not a release)
    # data
    max_users: int | None = None  # private users (fortunes) used, None = all
    heldout_fraction: float = 0.1  # users held out for the language-model test
    vocab_size: int = 50_000  # most frequent public trigrams (seen >= 2 times) in the release vocabulary
    W: int = 20  # public cap on distinct items per user
    C: int = 1  # per-item clamp (paper: 1 below 1M users)
    delta: float = 1e-6
    S: float = 0.01  # BayesianDP decay slope (fixed; EndToEndDP tunes it privately)
    rho: float = 0.3  # BayesianDP private/public weight (fixed)
    count_clip: int = 20_000  # item totals clipped here before BayesianDP's log (sound sensitivity)
    kl_smoothing: float = 1e-4  # released q is mixed with uniform at this weight before KL / perplexity
    runs: int = 5  # independent releases per point
    # figure grids
    epsilons: tuple[float, ...] = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
    fig_epsilon: float = 0.1  # ε of figures 2-4 (paper: 0.1)
    user_counts: tuple[int, ...] = (500, 1000, 2000, 5000, 10_000)
    vocab_sizes: tuple[int, ...] = (2_000, 5_000, 10_000, 20_000, 50_000)
    public_noise: tuple[float, ...] = (0.0, 1.0, 3.0, 10.0, 30.0, 100.0)
    ks: tuple[int, ...] = (2, 5, 10, 20, 50, 100, 200)
    table_epsilon: float = 0.2
    table_k: int = 50
    lm_vocab_size: int = 50_000  # Table 1: most frequent public n-grams of orders 1-3 (as the curator releases)
    lm_W: int = 100  # Table 1: per-user item cap (the curator's default)
    table_runs: int = 3  # Table 1: releases per DP mechanism (each builds a language model)
    # membership inference
    mi_epsilons: tuple[float, ...] = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)
    mi_samples: int = 400  # release pairs per ε
    mi_confidence: float = 0.95
    # localizer
    embedding_vocab: int = 20_000
    local_epsilons: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 50.0)
    calib_words_per_band: int = 30
    calib_draws: int = 100
    local_users: int = 2000  # users privatized (items 4 and 5)
    # targets (lac.suite.eval.targets): the user corpus, sound releases vs baselines
    target_points: tuple[tuple[str, int, int], ...] = (
        ("50k real users", 50_000, 1),
        ("1.02M users: 340k real texts, each replicated 3 times", 340_000, 3),
    )
    target_epsilons: tuple[float, ...] = (0.1, 1.0)
    target_runs: int = 3  # releases per DP row and point
    target_heldout: int = 5_000  # held-out texts (never released) for perplexity
    target_W: int = 100
    target_C: int = 3
    count_clip_targets: int = 10_000_000
    # end to end through the device (lac.suite.eval.e2e): presets x central ε, against the clean text
    e2e_points: tuple[tuple[str, int, int], ...] = (
        ("20k real users", 20_000, 1),
        ("200k real users", 200_000, 1),
        ("1.02M users: 340k real texts, each privatized 3 times independently", 340_000, 3),
    )
    e2e_corpora: tuple[str, ...] = ("user", "close")  # lac.suite.eval.e2e.CORPORA
    e2e_close_points: tuple[tuple[str, int, int], ...] = (  # the corpus close to the public domain: 23,635 texts
        ("20k real users", 20_000, 1),
        ("200k users: 20k real texts, each privatized 10 times independently", 20_000, 10),
    )
    e2e_close_heldout: int = 2_000  # held-out texts of the close corpus (never released)
    e2e_presets: tuple[str, ...] = ("private", "balanced", "utility")
    e2e_central: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0)
    e2e_embedding_vocab: int = 50_000  # the presets' embedding (GloVe 6B 50d, 50,000 words)
    e2e_vocab_min_count: int = 2  # the release vocabulary: the curator's defaults (public n-grams seen twice ...)
    e2e_vocab_items: int = 50_000  # ... at most this many)
    e2e_runs: int = 1  # releases per row (at these sizes the release's own noise moves perplexity by < 1%)
    e2e_channel_draws: int = 55  # local channel's Monte-Carlo draws per word on average (the curator's CHANNEL_DRAWS)
    # authorship vs topic after the Localizer (lac.suite.eval.authorship; seed 003 §6)
    authorship_authors: int = 40  # GCIDE's most quoted authors (by quoted words)
    authorship_snippet_words: int = 50  # words per snippet (author and topic alike)
    authorship_known: int = 16  # known (training) snippets per author
    authorship_unknown: int = 10  # unknown (test) snippets per author
    authorship_topics: tuple[str, ...] = (
        "noun.animal",
        "noun.plant",
        "noun.food",
        "noun.body",
        "noun.artifact",
        "noun.person",
        "noun.location",
        "noun.substance",
        "verb.motion",
        "verb.communication",
    )  # WordNet lexicographer categories
    authorship_topic_train: int = 100  # training snippets per topic
    authorship_topic_test: int = 30  # test snippets per topic
    # ε per word of the sweep (the presets' ε are added)
    authorship_epsilons: tuple[float, ...] = (3.0, 5.0, 6.0, 7.0, 8.0, 10.0, 15.0, 25.0)
    authorship_iterations: int = 100  # Koppel et al.'s random feature subsets per unknown text
    authorship_embedding_vocab: int = 50_000  # the presets' embedding
    # a classifier trained on privatized text, tested on clean text (lac.suite.eval.downstream; seed 002)
    downstream_topics: tuple[str, ...] = (
        "noun.animal",
        "noun.plant",
        "noun.food",
        "noun.body",
        "noun.artifact",
        "noun.person",
        "noun.location",
        "noun.substance",
        "verb.motion",
        "verb.communication",
    )  # WordNet lexicographer categories
    downstream_words: int = 30  # words per text (one report: at most the deployment's L = 40)
    downstream_train: int = 180  # training texts per topic (verb.motion has enough words for 250 texts in all)
    downstream_test: int = 60  # clean test texts per topic
    downstream_epsilons: tuple[float, ...] = (3.0, 5.0, 6.0, 7.0, 8.0, 10.0, 15.0, 25.0)  # presets' ε added
    downstream_embedding_vocab: int = 50_000  # the presets' embedding
    downstream_export_preset: str = "balanced"  # the setting trained through the export path
    # privacy accounting of the pipeline (lac.suite.eval.pipeline)
    central_epsilons: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0)
    report_words: int = 32  # reports truncated to this many words so ε0 = ℓ·ε·diam holds for all
    eps0_grid_points: int = 24

    def as_dict(self) -> dict:
        """The settings as a plain dict (JSON-able)."""
        return asdict(self)

    def with_overrides(self, **kw) -> EvalConfig:
        """A copy with the given settings replaced; unknown names and None values are ignored."""
        names = {f.name for f in fields(self)}
        return replace(self, **{k: v for k, v in kw.items() if k in names and v is not None})


PRESETS = {
    "default": EvalConfig(),
    "quick": EvalConfig(
        runs=3,
        table_runs=1,
        epsilons=(0.05, 0.1, 0.5, 1.0, 5.0),
        user_counts=(1000, 3000, 10_000),
        vocab_sizes=(2_000, 10_000, 50_000),
        public_noise=(0.0, 3.0, 30.0),
        ks=(5, 20, 50, 200),
        mi_epsilons=(0.1, 1.0, 5.0, 20.0, 100.0),
        mi_samples=200,
        local_epsilons=(2.0, 10.0, 20.0, 50.0),
        calib_words_per_band=15,
        calib_draws=40,
        local_users=1000,
        central_epsilons=(1.0, 4.0),
        eps0_grid_points=12,
        target_points=(("20k real users", 20_000, 1),),
        target_epsilons=(1.0,),
        target_runs=1,
        e2e_points=(("20k real users", 20_000, 1),),
        e2e_close_points=(("20k real users", 20_000, 1),),
        e2e_presets=("balanced",),
        e2e_central=(0.3, 1.0),
        authorship_authors=20,
        authorship_topic_train=60,
        authorship_topic_test=20,
        downstream_train=120,
        downstream_test=40,
        downstream_epsilons=(3.0, 5.0, 8.0, 10.0, 15.0, 25.0),
    ),
    "tiny": EvalConfig(
        max_users=1500,
        table_runs=1,
        vocab_size=3000,
        lm_vocab_size=5000,
        count_clip=2000,
        runs=2,
        epsilons=(0.1, 1.0),
        user_counts=(300, 1000),
        vocab_sizes=(1000, 3000),
        public_noise=(0.0, 10.0),
        ks=(2, 10),
        mi_epsilons=(1.0, 20.0),
        mi_samples=40,
        embedding_vocab=5000,
        local_epsilons=(5.0, 20.0),
        calib_words_per_band=5,
        calib_draws=10,
        local_users=150,
        central_epsilons=(2.0,),
        eps0_grid_points=6,
        target_points=(("2k real users", 2_000, 1),),
        target_epsilons=(1.0,),
        target_runs=1,
        target_heldout=300,
        e2e_points=(("2k real users", 2_000, 1),),
        e2e_close_points=(("1k real users", 1_000, 1),),
        e2e_close_heldout=200,
        e2e_presets=("balanced",),
        e2e_central=(1.0,),
        e2e_embedding_vocab=5_000,
        e2e_channel_draws=20,
        e2e_vocab_min_count=100,
        e2e_vocab_items=3_000,
        authorship_authors=8,
        authorship_snippet_words=40,
        authorship_known=8,
        authorship_unknown=6,
        authorship_topics=("noun.animal", "noun.food", "noun.artifact", "verb.motion"),
        authorship_topic_train=20,
        authorship_topic_test=10,
        authorship_epsilons=(3.0, 25.0),
        authorship_iterations=30,
        authorship_embedding_vocab=5_000,
        downstream_topics=("noun.animal", "noun.food", "noun.artifact", "verb.motion"),
        downstream_train=30,
        downstream_test=10,
        downstream_epsilons=(3.0, 25.0),
        downstream_embedding_vocab=5_000,
    ),
}
