"""The curator's storage: the report store and its Parquet segments, the journal and the privacy
ledger, and exports of stored reports (opening and counting the shuffler's batches is ``lac.curator.ingest``)."""
