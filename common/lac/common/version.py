"""Versions of the installed LAC distributions, from their metadata (``importlib.metadata``).

One source for ``lac --version``, the ``server_version`` of the curator's published deployment and
the ``lac_build_info`` metric of each service.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version

__all__ = ["DISTRIBUTIONS", "version", "installed", "version_line", "server_version"]

# Every LAC distribution, in the order `lac --version` names them (the `lac` command comes with lac-common).
DISTRIBUTIONS = ("lac-common", "lac-client", "lac-shuffler", "lac-curator", "lac-analyst", "lac-privacy-suite")


@cache  # servers name their version in every GetDeployment reply; the metadata is read once per process
def version(distribution: str = "lac-common") -> str:
    """The installed version of ``distribution``, or ``"unknown"`` if it is not installed (code run from a
    source tree without installing it)."""
    try:
        return _distribution_version(distribution)
    except PackageNotFoundError:
        return "unknown"


def installed() -> dict[str, str]:
    """The installed LAC distributions and their versions, in ``DISTRIBUTIONS`` order."""
    found = {}
    for name in DISTRIBUTIONS:
        try:
            found[name] = _distribution_version(name)
        except PackageNotFoundError:
            continue
    return found


def version_line() -> str:
    """What ``lac --version`` prints: ``lac 0.1.0 (lac-common 0.1.0, lac-client 0.1.0, ...)``, the ``lac``
    command's version being lac-common's."""
    found = installed()
    parts = ", ".join(f"{name} {v}" for name, v in found.items())
    return f"lac {found.get('lac-common', 'unknown')} ({parts or 'no LAC distribution installed'})"


def server_version(service: str) -> str:
    """``lac-<service> <version>``: how a server names itself (``Deployment.server_version``)."""
    return f"lac-{service} {version(f'lac-{service}')}"
