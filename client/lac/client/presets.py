"""Named privacy presets: an ε per word chosen from measured plausible deniability.

How they were chosen: ``lac client calibrate --epsilons 1,2,3,5,8,10,12,15 --draws 100`` on the
default embedding (GloVe 6B 50d, 50,000 words, diameter 18.92) with the multivariate Laplace
mechanism: 100 words drawn uniformly from the frequency bands [0,100), [100,1k), [1k,10k),
[10k,50k), 100 perturbations each. N_w is the fraction of perturbations that return the word
itself, S_w the number of distinct outputs among the 100. Each preset is the largest ε of the
grid whose median N_w meets its target, confirmed on a finer grid (4 … 11, 400 words x 200
draws), where it is also the largest integer ε meeting the target:

=========  ====  ============  ============  ==========================================
preset     ε     median N_w    median S_w    target
=========  ====  ============  ============  ==========================================
private    5     0.07          90 / 100      median N_w ≤ 0.1: almost every word changes
balanced   8     0.47          45 / 100      median N_w ≤ 0.5: about half the words kept
utility    10    0.76          22 / 100      median N_w ≤ 0.8: most words kept
=========  ====  ============  ============  ==========================================

For comparison ε = 3 keeps no word (N_w 0.00, S_w 99: the output is unrelated words) and
ε = 15 keeps nearly all (N_w 0.98, S_w 2.5: the text leaves almost unchanged). These are
empirical proxies on this embedding, not guarantees; the guarantee of every report is its
``statement`` (ε·d metric DP per word). Frequent words change more often than rare ones
(their neighbourhoods are denser): at ε = 8 median N_w is 0.30 for the 100 most frequent words
and 0.57 for ranks 10k-50k. Other embeddings need their own ``lac client calibrate`` run.
"""

from __future__ import annotations

from dataclasses import dataclass

from lac.common.deployment import DEFAULT_EMBEDDING

__all__ = ["Preset", "PRESETS", "DEFAULT_PRESET", "get_preset"]


@dataclass(frozen=True)
class Preset:
    """An ε per word for the multivariate Laplace mechanism over ``embedding``, with the
    plausible-deniability statistics measured for it (median N_w, median S_w of 100 draws)."""

    name: str
    epsilon: float
    median_n_w: float
    median_s_w: float
    target_n_w: float
    embedding: str = DEFAULT_EMBEDDING
    mechanism: str = "multivariate-laplace"

    def describe(self) -> str:
        """The preset in one line: ε, embedding and the measured N_w and S_w."""
        return (
            f"preset {self.name!r}: ε = {self.epsilon:g} per word over {self.embedding} "
            f"(measured median N_w {self.median_n_w:.2f} ≤ {self.target_n_w:g}, "
            f"median S_w {self.median_s_w:g} of 100 draws)"
        )


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("private", 5.0, median_n_w=0.07, median_s_w=90, target_n_w=0.1),
        Preset("balanced", 8.0, median_n_w=0.465, median_s_w=44.5, target_n_w=0.5),
        Preset("utility", 10.0, median_n_w=0.76, median_s_w=22, target_n_w=0.8),
    )
}
DEFAULT_PRESET = "balanced"

# Outside [private, utility] on the default embedding the output is nearly random words (below)
# or nearly the input (above); the Localizer warns once when ε is there without calibration.
CALIBRATED_RANGE = (PRESETS["private"].epsilon, PRESETS["utility"].epsilon)


def get_preset(preset: str | Preset) -> Preset:
    """The preset named ``preset`` (a ``Preset`` is returned as is); ValueError for unknown names."""
    if isinstance(preset, Preset):
        return preset
    try:
        return PRESETS[preset]
    except (KeyError, TypeError):
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}") from None
