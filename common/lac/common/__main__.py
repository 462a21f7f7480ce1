"""``python -m lac.common`` is the ``lac`` command (used to start services as subprocesses)."""

from lac.common.cli import main

main()
