"""The IngestBatch handler (``lac.curator.service.handlers.ingest``) over a curator's state, without gRPC: a batch
is stored once, bad reports are quarantined without failing it, and a batch whose privacy unit does not match is
refused with the right error."""

from __future__ import annotations

import dataclasses

import pytest
from curator_testkit import ingest_batch, on_state

from lac.common.errors import FailedPrecondition, InvalidArgument, RejectReason
from lac.curator.ingest.chunks import IngestBatch
from lac.curator.service.handlers import ingest, status

SENTENCES = [["the", "dog", "sleeps"], ["a", "fox", "is", "a", "small", "animal"], ["we", "walk", "the", "dog"]]


def test_a_batch_is_stored_once(tmp_path, public_corpus):
    batch = ingest_batch(SENTENCES, batch_id="b-1")

    async def run(state):
        first = await ingest.ingest(state, batch)
        again = await ingest.ingest(state, batch)
        return first, again, await status.status(state)

    first, again, now = on_state(tmp_path, public_corpus, run)
    assert first == ingest.Ingested("b-1", accepted=3, rejected=0)
    assert again == ingest.Ingested("b-1", duplicate=True)
    assert (now.batches, now.reports, now.quarantined) == (1, 3, 0)
    assert sum(now.reports_by_window.values()) == 3


def test_a_bad_report_is_quarantined_and_the_batch_stored(tmp_path, public_corpus):
    good = ingest_batch(SENTENCES)
    batch = dataclasses.replace(good, payloads=[*good.payloads, b"\xff not a sealed payload"])

    async def run(state):
        return await ingest.ingest(state, batch), await status.status(state)

    done, now = on_state(tmp_path, public_corpus, run)
    assert (done.accepted, done.rejected) == (3, 1)
    assert now.rejects == {str(RejectReason.MALFORMED): 1} and now.quarantined == 1


def test_batches_the_curator_cannot_account_for_are_refused(tmp_path, public_corpus):
    batch = ingest_batch(SENTENCES)
    other_quota = dataclasses.replace(batch.privacy, reports_per_window=batch.privacy.reports_per_window + 1)
    future = ingest_batch(SENTENCES, window=10**9)

    async def run(state):
        errors = []
        for bad in (
            IngestBatch("", batch.payloads, batch.privacy),
            IngestBatch("b-2", batch.payloads, None),
            IngestBatch("b-3", batch.payloads, other_quota),
            future,
        ):
            with pytest.raises((InvalidArgument, FailedPrecondition)) as caught:
                await ingest.ingest(state, bad)
            errors.append(caught.value)
        return errors, await status.status(state)

    errors, now = on_state(tmp_path, public_corpus, run)
    assert [type(e) for e in errors] == [InvalidArgument, FailedPrecondition, FailedPrecondition, InvalidArgument]
    assert "batch_id must be 1..128 characters" in str(errors[0])
    assert "without the shuffler's privacy statement" in str(errors[1])
    assert "the shuffler's quota is" in str(errors[2])
    assert "must satisfy 0 <= first <= last" in str(errors[3])
    assert now.batches == 0  # nothing of a refused batch is stored
