"""Where LAC keeps prepared data (embedding caches, corpora, sampled channels) on this machine.

The first writable one of ``$LAC_DATA_DIR``, ``$XDG_CACHE_HOME/lac`` and ``~/.cache/lac``. When none is (a
container user without a home, a sandboxed app), a directory of this user's own in the system's temporary
directory, with one warning that says where; when even that cannot be written, ``DataDirUnavailable`` names
the settings that fix it.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["DATA_DIR_ENV", "DataDirUnavailable", "data_dir"]

DATA_DIR_ENV = "LAC_DATA_DIR"
log = logging.getLogger(__name__)
_warned: set[str] = set()  # each fallback is logged once per process


class DataDirUnavailable(OSError):
    """No writable data directory: not ``$LAC_DATA_DIR``, ``$XDG_CACHE_HOME/lac``, ``~/.cache/lac`` nor a
    temporary one. The message says why each failed and which setting to change."""


def data_dir() -> Path:
    """The data directory (see the module's docstring), created if missing."""
    tried: list[str] = []
    for label, candidate in _candidates(tried):
        try:
            return _writable(candidate, label, tried)
        except OSError as exc:
            tried.append(f"{label} ({candidate}): {exc.strerror or exc}")
    raise DataDirUnavailable(
        f"no writable directory for LAC's prepared data: {'; '.join(tried)}. Set {DATA_DIR_ENV} (or XDG_CACHE_HOME) "
        "to a directory this user can write",
    )


def _candidates(tried: list[str]) -> Iterator[tuple[str, Path]]:
    """(label, path) of each place to try, in order; a setting that names no usable place is noted in ``tried``."""
    if value := os.environ.get(DATA_DIR_ENV):
        yield DATA_DIR_ENV, Path(value)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        yield "XDG_CACHE_HOME/lac", Path(xdg) / "lac"
    elif xdg:
        tried.append(f"XDG_CACHE_HOME ({xdg}) is not an absolute path (ignored, as the XDG specification says)")
    try:
        home = Path.home()
    except (RuntimeError, KeyError) as exc:  # no HOME and no password entry for this user
        tried.append(f"~/.cache/lac: no home directory ({exc})")
    else:
        yield "~/.cache/lac", home / ".cache" / "lac"
    yield "a temporary directory", Path(tempfile.gettempdir()) / f"lac-data-{os.getuid()}"


def _writable(path: Path, label: str, tried: list[str]) -> Path:
    """``path``, created if missing, once a file could be created in it; OSError otherwise. The temporary
    directory must be this user's own (not a symlink or another user's, in a directory everyone writes)."""
    temporary = label == "a temporary directory"
    if temporary:
        path.mkdir(mode=0o700, exist_ok=True)
        st = path.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            raise PermissionError(errno.EACCES, "exists and is not a directory of this user's own", str(path))
        os.chmod(path, 0o700)
    else:
        path.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".lac-probe-", dir=path)
    os.close(fd)
    os.unlink(probe)
    if tried or temporary:
        note = f"using {path} ({label})" + (", which the system may clear" if temporary else "")
        message = f"LAC's data directory: {'; '.join(tried)}; {note}. Set {DATA_DIR_ENV} to choose where"
        if message not in _warned:
            _warned.add(message)
            log.warning("%s", message)
    return path
