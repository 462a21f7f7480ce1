"""The analyst's client of the curator (``client``: ``CuratorClient``, re-exported as
``lac.curator.CuratorClient``) and its notebook views (``notebook``)."""
