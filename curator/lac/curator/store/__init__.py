"""The curator's storage: the report store and its Parquet segments, the journal and the privacy
ledger, ingest of the shuffler's batches, and exports of stored reports."""
