"""Language models over released n-gram counts (``model``: ``NgramModel``, Kneser–Ney); post-processing
of a release, costs no privacy."""
