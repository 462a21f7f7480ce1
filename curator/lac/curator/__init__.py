"""LAC curator: n-gram aggregation, central-DP releases, the curator service and its ``lac curator``
commands. The analyst's client of this service is its own distribution, ``lac-analyst``
(``from lac.analyst import CuratorClient``)."""
