"""The release algorithms the mechanisms are built from: the building blocks every mechanism shares (the
public caps, the report sources, the folds and the ``Release`` they make: ``building``); the posterior
(``posterior``), BayesianDP and EndToEndDP (``bayesian``, ``endtoend``, ``sound``, ``gaussian``), the
baselines (``baselines``), the clients' channel (``channel``) and the error bars (``errorbars``).

The engines that run the folds are ``lac.curator.engines``; the mechanisms themselves live in
``lac.curator.mechanisms`` (one module each, one registry); running a request, in ``lac.curator.runner``."""
