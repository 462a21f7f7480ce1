"""The curator's handlers, one module per RPC family (ingest, release with preview, query, exports, status): each
takes domain objects and the ``CuratorState`` and returns frozen dataclasses (or domain records); no protos."""
