"""The curator service: the gRPC server and its servicers (``service``), request/response conversion
(``serde``), configuration (``config``), the ``lac curator`` commands (``cli``), metrics and backups.

Depends on every other wing; nothing but the CLI depends on it."""
