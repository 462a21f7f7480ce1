"""Where a release's folds run: the ``Engine`` interface, this machine's ``LocalEngine`` and ``create_engine``
(``local``), and ``SparkEngine`` on Apache Spark (``spark``, optional). The folds themselves are the release
algorithms' (``lac.curator.release``); an engine only maps them over the parts and combines in order."""
