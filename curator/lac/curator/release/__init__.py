"""The release algorithms the mechanisms are built from: the public caps, the report sources, the folds and
the ``Release`` they make (``core``); the posterior (``posterior``), BayesianDP and EndToEndDP (``bayesian``,
``endtoend``, ``sound``, ``gaussian``), the baselines (``baselines``), the clients' channel (``channel``), and
the engines that run the folds (``engine`` local, ``spark``).

The mechanisms themselves live in ``lac.curator.mechanisms`` (one module each, one registry); running a
request, in ``lac.curator.runner``."""
