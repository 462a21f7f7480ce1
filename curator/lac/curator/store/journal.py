"""The ledger journal: every charge (and every export), kept where restoring a backup cannot erase it.

The privacy ledger lives in ``curator.sqlite``, which ``lac curator restore`` replaces with a
backup's copy. Spending recorded after that backup would then be forgotten and handed back to the
analysts, and a retried release (same request id) would run and charge again. So every charge is
also appended to ``ledger.journal`` in the state directory (one JSON line per charge, fsync'd),
a file restore never replaces, and the two are reconciled both ways whenever a store opens and
before a restore replaces a database:

* a charge in the database but not in the journal (the curator stopped between its commit and
  the append) is appended;
* a charge in the journal but not in the database (a restored older database) is put back in the
  ledger, with its request id, so the budget never goes backwards and the retry is recognised.

A charge is identified by (release id, time); a torn last line (a crash while appending) is cut
off and its charge comes back from the database.

Replicas over one PostgreSQL database (``--store``) each keep their own journal in their own state
directory (appends from several machines to one file are not atomic over NFS). Neither a double
charge nor a lost one follows:

* no double charge: a charge is put back only if its key is missing from the database, in one
  serializable transaction, and the ledger's unique index on (release id, time, window) refuses a
  second copy, however many journals hold it (each replica's start appends to its own journal the
  charges the database had, so journals overlap) and however many replicas reconcile at once;
* no lost charge: the database is the ledger every replica reads and charges in a transaction; a
  journal is only its second copy, appended after the commit (a crash before the append is made good
  from the database at the next start). What a journal adds is protection against the database going
  back (an older backup restored): then each replica's start puts back what its journal holds, so a
  charge is lost only if the database goes back *and* the journal of the replica that made it is lost
  with its state directory before that replica starts again. With PostgreSQL that is the database's
  own duty (synchronous replication to a standby, continuous archiving), not the journal's.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from lac.common.database import Database
from lac.common.files import fsync_dir

log = logging.getLogger(__name__)

__all__ = [
    "JOURNAL_NAME",
    "Charge",
    "ExportRecord",
    "read",
    "append",
    "database_charges",
    "database_exports",
    "reconcile",
    "carry",
]

JOURNAL_NAME = "ledger.journal"


@dataclass(frozen=True)
class Charge:
    """One charge of (ε, δ) to each accounting window in [first_window, last_window]."""

    release_id: str
    at: float
    first_window: int
    last_window: int
    epsilon: float
    delta: float
    request_id: str | None = None
    spec: str = ""
    data_dependent: bool = False  # a data-dependent release (NOT DP): counted with its windows, ε = δ = 0

    @property
    def key(self) -> tuple[str, float]:
        return self.release_id, self.at


@dataclass(frozen=True)
class ExportRecord:
    """One export of privatized reports (listed with the ledger, never charged): kept like a charge so that
    restoring an older backup does not forget who exported what."""

    export_id: str
    identity: str
    at: float
    first_window: int
    last_window: int
    rows: int
    guarantee: str

    @property
    def key(self) -> tuple[str, str]:
        return "export", self.export_id


Entry = Charge | ExportRecord


def read(path: Path) -> list[Charge]:
    """The charges in the journal at ``path`` ([] if there is none); a torn last line is cut off."""
    return [e for e in _entries(path) if isinstance(e, Charge)]


def _entries(path: Path) -> list[Entry]:
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):  # a crash while appending: that charge is still in the database
        with open(path, "r+b") as f:
            f.truncate(end)
            os.fsync(f.fileno())
        log.warning("%s: cut off a torn last line (%d bytes)", path, len(data) - end)
    entries: list[Entry] = []
    for n, line in enumerate(data[:end].splitlines(), 1):
        try:
            fields = json.loads(line)
            entries.append(ExportRecord(**fields) if "export_id" in fields else Charge(**fields))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}, line {n}: not a ledger entry ({exc}); the journal is damaged") from None
    return entries


def append(path: Path, charges: Sequence[Entry]) -> None:
    """Append ``charges`` (or export records) and fsync (the file is created 0600)."""
    try:
        _append(path, charges)
    except OSError as exc:  # committed in the database already: reconciled from there at the next start or restore
        log.error("could not append %d charge(s) to the ledger journal %s: %s", len(charges), path, exc)


def _append(path: Path, charges: Sequence[Entry]) -> None:
    if not charges:
        return
    new = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"".join(json.dumps(asdict(c), sort_keys=True).encode() + b"\n" for c in charges))
        os.fsync(fd)
    finally:
        os.close(fd)
    if new:
        fsync_dir(path.parent)


def database_charges(db: Database) -> list[Charge]:
    """The charges in the ledger of the curator database ``db``."""
    requests = {
        rid: (req, spec) for req, spec, rid in db.execute("SELECT request_id, spec, release_id FROM release_requests")
    }
    rows = db.execute(
        "SELECT release_id, at, MIN(win), MAX(win), MAX(epsilon), MAX(delta), MAX(data_dependent) FROM window_ledger "
        "GROUP BY release_id, at ORDER BY MIN(id)"
    )
    charges = []
    for release_id, at, lo, hi, eps, delta, dd in rows:
        req, spec = requests.get(release_id, (None, ""))
        charges.append(Charge(release_id, float(at), int(lo), int(hi), float(eps), float(delta), req, spec, bool(dd)))
    return charges


def database_exports(db: Database) -> list[ExportRecord]:
    """The exports the curator database ``db`` lists."""
    if not db.columns("exports"):  # a database from before exports (a backup's)
        return []
    rows = db.execute(
        "SELECT export_id, identity, at, first_window, last_window, rows, guarantee FROM exports ORDER BY at, rowid"
    )
    return [ExportRecord(str(e), str(i), float(t), int(a), int(b), int(n), str(g)) for e, i, t, a, b, n, g in rows]


def reconcile(db: Database, state_dir: Path) -> int:
    """Make the journal and ``db`` hold the same charges and export records (see the module doc); returns
    how many journal charges were put back into the database, in one transaction (all or none; two replicas
    doing it at once put each back once)."""
    path = state_dir / JOURNAL_NAME
    journal = _entries(path)
    journal_keys = {e.key for e in journal}

    def put_back() -> tuple[list[Entry], list[Charge], list[ExportRecord]]:
        in_db: list[Entry] = [*database_charges(db), *database_exports(db)]
        db_keys = {e.key for e in in_db}
        charges = [e for e in journal if e.key not in db_keys and isinstance(e, Charge)]
        exports = [e for e in journal if e.key not in db_keys and isinstance(e, ExportRecord)]
        for c in charges:
            db.executemany(
                "INSERT INTO window_ledger (release_id, win, epsilon, delta, at, data_dependent) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    (c.release_id, w, c.epsilon, c.delta, c.at, int(c.data_dependent))
                    for w in range(c.first_window, c.last_window + 1)
                ),
            )
            if c.request_id is not None:
                db.execute(
                    "INSERT INTO release_requests VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                    (c.request_id, c.spec, c.release_id),
                )
        if exports and db.columns("exports"):
            db.executemany(
                "INSERT INTO exports VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                ((e.export_id, e.identity, e.at, e.first_window, e.last_window, e.rows, e.guarantee) for e in exports),
            )
        return in_db, charges, exports

    in_db, charges, exports = db.transaction(put_back)
    _append(path, [e for e in in_db if e.key not in journal_keys])
    if charges or exports:
        log.warning(
            "the ledger journal holds %d charge(s) and %d export record(s) that the database does not (it was "
            "restored from an older backup): put back, so their budget stays spent and their request ids stay used",
            len(charges),
            len(exports),
        )
    return len(charges)


def carry(source: Path, state_dir: Path) -> int:
    """Append the charges of the journal ``source`` (e.g. the old machine's) that ``state_dir``'s
    journal lacks; the next start puts them into the ledger. Returns how many were added."""
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no ledger journal there")
    path = state_dir / JOURNAL_NAME
    have = {e.key for e in _entries(path)}
    new = [e for e in _entries(source) if e.key not in have]
    _append(path, new)
    return sum(isinstance(e, Charge) for e in new)
