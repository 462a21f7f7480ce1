"""Releases: n-gram items and vocabularies (``ngrams``), the release path (``core``: ``ReleaseSpec``,
``run``, ``Release``), its preview and offline runner, the engines that run its folds (local, Spark),
and the algorithms the mechanisms are built from (posterior, BayesianDP, baselines, the clients' channel).

The mechanisms themselves live in ``lac.curator.mechanisms`` (one module each, one registry)."""
