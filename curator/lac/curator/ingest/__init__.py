"""Opening, validating and counting the shuffler's sealed batches before the store commits them: the
picklable per-chunk work and the local worker pool (``chunks``), and the same work on Apache Spark
(``spark``, optional, over the Spark engine's session)."""
