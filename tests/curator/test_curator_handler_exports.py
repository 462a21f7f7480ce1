"""The ExportReports handler (``lac.curator.service.handlers.exports``) over a curator's state, without gRPC: the
privatized reports of a closed window, recorded with the ledger before any row is read, and refused without the
grant or for a window still open."""

from __future__ import annotations

import io
import time

import pyarrow as pa
import pytest
from curator_testkit import ingest_batch, on_state
from lac_testkit import DEPLOYMENT

from lac.common.errors import FailedPrecondition, PermissionDenied
from lac.common.rpc import Role
from lac.curator.service.handlers import exports, ingest, status

SENTENCES = [["the", "dog", "sleeps"], ["a", "fox", "is", "a", "small", "animal"], ["we", "walk", "the", "dog"]]
EXPORTER = frozenset({Role.ANALYST, Role.EXPORT})


def _closed_window() -> int:
    return DEPLOYMENT.window(time.time()) - 2


def test_an_export_is_recorded_and_holds_every_report(tmp_path, public_corpus):
    window = _closed_window()

    async def run(state):
        await ingest.ingest(state, ingest_batch(SENTENCES, window=window))
        made = await exports.export_reports(state, window, window, "mtls:alice", EXPORTER)
        listed = await exports.exports(state)  # before any row is read
        try:
            data = [chunk async for chunk in exports.chunks(made)]
        finally:
            made.rows.close()
        return made, listed, data, await status.budget(state)

    made, listed, data, budget = on_state(tmp_path, public_corpus, run, export_identities="alice")
    assert [(e, who, a, b, n) for e, who, _, a, b, n in listed] == [(made.export_id, "alice", window, window, 3)]
    table = pa.concat_tables(pa.ipc.open_stream(io.BytesIO(d)).read_all() for d in data)
    assert sorted(tuple(r) for r in table.column(0).to_pylist()) == sorted(tuple(s) for s in SENTENCES)
    assert made.guarantee.statement() and budget.exports == listed  # listed beside the budget, never charged
    assert all(b.epsilon == 0 for b in budget.spent.values())


def test_exports_are_refused_without_the_grant_or_for_an_open_window(tmp_path, public_corpus):
    now = DEPLOYMENT.window(time.time())

    async def run(state):
        await ingest.ingest(state, ingest_batch(SENTENCES))
        with pytest.raises(PermissionDenied) as no_grant:
            await exports.export_reports(state, now - 1, now - 1, "mtls:bob", frozenset({Role.ANALYST}))
        with pytest.raises(FailedPrecondition) as still_open:
            await exports.export_reports(state, now, now, "mtls:alice", EXPORTER)
        return no_grant.value, still_open.value, await exports.exports(state)

    no_grant, still_open, listed = on_state(tmp_path, public_corpus, run, export_identities="alice")
    assert "may not export privatized reports" in str(no_grant)
    assert f"window {now} is still open" in str(still_open) and listed == []
