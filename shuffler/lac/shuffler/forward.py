"""Delivery of released batches to the curator, the curator's deployment, and dead letters.

Delivery: up to ``forward_in_flight`` released batches are sent to the curator at once (so it counts
one while it stores another), each retried with its own back-off until acknowledged and marked
delivered only then; a batch is never in flight twice, and one sent again after a restart carries the
same id and bytes, which the curator stores once.

A batch the curator refuses for good (``DEAD_LETTER_CODES``: its statement, windows or size are not what the
curator accepts, which no retry changes) is set aside as a *dead letter* at once, logged and counted, and never
blocks newer batches; the operator lists, retries or drops dead letters (``lac shuffler dead-letter``).
Other failures (the curator away, overloaded, its storage failing) are retried until acknowledged.

Each batch's amplification statement uses the report-level ε0 of the curator's published deployment
(``GetDeployment``, fetched by the forwarder), never an operator-typed number.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from lac.common import retry, tls, tracing
from lac.common.deployment import Deployment
from lac.common.errors import InvalidArgument, NotFound, Unavailable
from lac.common.privacy import Adjacency, Guarantee, Model, PrivacyUnit
from lac.common.storage import StorageFailed
from lac.shuffler import amplification, serde, wire
from lac.shuffler.config import ShufflerConfig
from lac.shuffler.reportlog import StoredBatch
from lac.shuffler.state import MISMATCH_RECHECK_SECONDS

if TYPE_CHECKING:
    from lac.shuffler.state import ShufflerState

log = logging.getLogger(__name__)

DEPLOYMENT_REFRESH_SECONDS = 300.0
FORWARD_RETRY_FIRST_SECONDS = 0.5  # the forwarder's first back-off ceiling (then doubling)
FORWARD_RETRY_MIN_SECONDS = 0.01  # the back-off ceiling used when forward_retry_max_seconds is not positive
# The curator's refusals no retry changes: its checks of the batch itself (statement, windows, size).
DEAD_LETTER_CODES = frozenset(
    {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED}
)
MAX_DEAD_LETTER_IDS = 10_000  # batch ids named in one RetryDeadLetters/DropDeadLetters call
MAX_BATCH_ID_CHARS = 128  # as the curator's limit on a batch id


@dataclass(frozen=True)
class DeadLetter:
    """A batch the curator refused for good: its size, the refusal, since when, its statement (serialized)."""

    batch_id: str
    size: int
    refusal: str
    dead_since_unix: float
    privacy: bytes


@dataclass(frozen=True)
class Settled:
    """The dead letters an operator retried or dropped, and their reports."""

    batch_ids: tuple[str, ...]
    reports: int


def batch_guarantee(batch: StoredBatch, deployment: Deployment, config: ShufflerConfig) -> tuple[Guarantee, str]:
    """The central guarantee of one shuffled batch and the accounting method's name ("none": no amplification).

    Shuffling bounds hold for neighbouring batches that differ in one user's input (replace-one), and the
    report-level ε0 they amplify holds between reports of the same shape (``Adjacency.REPLACE_SAME_SHAPE``)."""
    eps0, delta = deployment.report_epsilon0, config.target_delta
    unit = PrivacyUnit.report(deployment.max_report_words)
    where = (
        f"each report is ε0-LDP with ε0 = {eps0:.6g} (L·ε·bound from the curator's deployment: "
        f"{deployment.max_report_words}·{deployment.epsilon_per_word:g}·{deployment.word_distance_bound:.6g})"
    )
    extra = []
    if config.crowd_threshold:
        extra.append(
            f"Crowd threshold k={config.crowd_threshold} applied (Prochlo-style; a data-dependent filter "
            f"with no DP claim of its own)."
        )
    if config.subsample_q < 1:
        extra.append(
            f"Reports were Poisson sub-sampled at q={config.subsample_q:g} (secret sample) before "
            f"shuffling; the ε above does not count that in. "
            + amplification.subsampling_statement(eps0, config.subsample_q)
        )
    if not batch.distinct_clients:
        return Guarantee(
            Model.SHUFFLED,
            eps0,
            0.0,
            unit,
            Adjacency.REPLACE_SAME_SHAPE,
            "shuffling without client authentication",
            details=(
                "No amplification: client authentication is off (auth none), so the reports are not known "
                f"to come from distinct clients; only the local guarantee holds: {where}.",
                *extra,
            ),
        ), "none"
    r = amplification.shuffle_epsilon(eps0, batch.n, delta)
    assumptions = (
        f"at most one report per client in the batch (enforced: quota {config.reports_per_window} per "
        f"{config.window_seconds:g} s window, one report per client per batch)",
    )
    if not r.amplified:
        return Guarantee(
            Model.SHUFFLED,
            eps0,
            0.0,
            unit,
            Adjacency.REPLACE_SAME_SHAPE,
            f"uniform shuffle of {batch.n} reports",
            details=(
                f"No amplification: {where}, and at n = {batch.n}, δ = {delta:.3g} the shuffle "
                f"accountant (lac.shuffler.amplification, method {r.method}) gives nothing below "
                f"it.",
                *extra,
            ),
            assumptions=assumptions,
        ), "none"
    return Guarantee(
        Model.SHUFFLED,
        r.epsilon,
        delta,
        unit,
        Adjacency.REPLACE_SAME_SHAPE,
        f"uniform shuffle of {batch.n} reports of distinct clients",
        details=(
            f"{where}; the shuffle accountant (lac.shuffler.amplification, method {r.method}) "
            f"bounds the batch's central ε, rounded up.",
            *extra,
        ),
        assumptions=assumptions,
    ), r.method


def batch_privacy(batch: StoredBatch, deployment: Deployment, config: ShufflerConfig) -> bytes:
    """The amplification statement of ``batch`` under the curator's ``deployment``, serialized."""
    g, method = batch_guarantee(batch, deployment, config)
    return serde.batch_privacy(batch, deployment, config, g, method)


# ------------------------------------------------------------------ the curator's deployment


def known_deployment(state: ShufflerState) -> Deployment:
    """The curator's published deployment (relayed to clients), or Unavailable until it is known."""
    if state.deployment is None:
        raise Unavailable(
            "the curator's deployment configuration is not known yet (the curator has not been "
            "reachable since this shuffler started); retry later",
            retry_after=5,
        )
    return state.deployment


async def refresh_deployment(state: ShufflerState, channel) -> Deployment | None:
    """Fetch the curator's deployment again once the last fetch is older than its refresh period."""
    fresh = MISMATCH_RECHECK_SECONDS if state.mismatch else DEPLOYMENT_REFRESH_SECONDS
    if state.deployment is not None and time.monotonic() - state.deployment_at < fresh:
        return state.deployment
    try:
        d, raw = await serde.fetch_deployment(channel)
    except grpc.aio.AioRpcError as exc:
        log.warning(
            "could not fetch the curator's deployment (%s: %s)",
            exc.code().name,
            exc.details(),
            extra={"method": "GetDeployment", "status_code": exc.code().name},
        )
        return state.deployment
    state.note_mismatch(d)
    if d != state.deployment:
        log.info("curator deployment: %s", d.report_guarantee().statement())
        with suppress(StorageFailed):  # only the cache for the next start; logged once as a storage failure
            await state.store.run(state.reportlog.set_meta, "deployment", raw)
    state.deployment, state.deployment_at = d, time.monotonic()
    return d


# ------------------------------------------------------------------ delivery


def _reap(sending: dict[str, asyncio.Task]) -> None:
    """Forget the deliveries that ended; raise the error of one that failed (the forwarder then restarts)."""
    for batch_id, task in list(sending.items()):
        if task.done():
            del sending[batch_id]
            if not task.cancelled() and (exc := task.exception()) is not None:
                raise exc


def forward_backoff(config: ShufflerConfig) -> retry.Backoff:
    """The forwarder's back-off (deployment fetches and deliveries alike): waits drawn below 0.5, 1, 2...
    s up to ``forward_retry_max_seconds`` (full jitter, ``lac.common.retry``)."""
    longest = config.forward_retry_max_seconds
    longest = longest if math.isfinite(longest) and longest > 0 else FORWARD_RETRY_MIN_SECONDS
    return retry.Backoff(initial=min(FORWARD_RETRY_FIRST_SECONDS, longest), maximum=longest)


async def forward_loop(state: ShufflerState) -> None:
    """Deliver the pending batches, up to ``forward_in_flight`` at once, each until the curator acknowledges
    it (then, and only then, it is marked delivered). A batch is never sent twice at once; one sent again
    after a restart carries the same id, which the curator de-duplicates."""
    backoff = forward_backoff(state.config)
    ceiling = backoff.initial  # of the next wait for the deployment
    sending = state.deliveries
    async with tls.channel(state.config.curator, state.curator_tls, aio=True) as channel:
        ingest = serde.ingest_call(channel)

        def finished(task: asyncio.Task) -> None:
            state.wake_forwarder.set()  # a slot is free, and a failure is raised by _reap

        try:
            while True:
                await refresh_deployment(state, channel)
                if state.deployment is None:
                    await asyncio.sleep(retry.jittered(ceiling))
                    ceiling = backoff.grow(ceiling)
                    continue
                # woken by a release or a finished delivery, or in time to fetch the deployment again
                fresh = MISMATCH_RECHECK_SECONDS if state.mismatch else DEPLOYMENT_REFRESH_SECONDS
                with suppress(TimeoutError):
                    await asyncio.wait_for(state.wake_forwarder.wait(), fresh)
                state.wake_forwarder.clear()
                _reap(sending)
                if not state.lease.held:
                    continue
                for batch_id in await state.store.run(state.reportlog.pending_batches):
                    if batch_id in sending:
                        continue
                    while len(sending) >= state.config.forward_in_flight:
                        await asyncio.wait(list(sending.values()), return_when=asyncio.FIRST_COMPLETED)
                        _reap(sending)
                    if not state.lease.held:
                        break
                    task = asyncio.create_task(_deliver(state, ingest, channel, batch_id))
                    task.add_done_callback(finished)
                    sending[batch_id] = task
        finally:
            for task in sending.values():
                task.cancel()
            await asyncio.gather(*sending.values(), return_exceptions=True)


async def _deliver(state: ShufflerState, ingest, channel, batch_id: str) -> None:
    """Send one pending batch until the curator acknowledges it, then mark it delivered."""
    backoff = forward_backoff(state.config)
    ceiling = backoff.initial  # of the next wait; each batch in flight backs off on its own
    batch = await state.store.run(state.reportlog.batch, batch_id)
    privacy = batch.privacy
    if privacy is None:
        await refresh_deployment(state, channel)
        deployment = known_deployment(state)  # known: set before the forwarder sends anything, never unset
        privacy = await asyncio.get_running_loop().run_in_executor(None, batch_privacy, batch, deployment, state.config)
        await state.store.durably(state.reportlog.set_privacy, batch_id, privacy)
    body, n = wire.with_privacy(batch.body, privacy), batch.n
    del batch  # its body: only ``body`` is kept while the batch is in flight
    while True:
        sent = time.perf_counter()
        try:
            # a new trace per attempt, never a child of a client's Submit: see lac.common.tracing
            attributes = {"lac.batch_id": batch_id, "lac.reports": n, "rpc.method": "IngestBatch"}
            with tracing.span("shuffler.forward_batch", attributes, root=True, client=True):
                reply = await ingest(body, timeout=120, metadata=tracing.inject() or None)
                tracing.set_attributes({"lac.accepted": reply.accepted, "lac.rejected": reply.rejected})
        except grpc.aio.AioRpcError as exc:
            state.metrics.forward_seconds.labels(exc.code().name).observe(time.perf_counter() - sent)
            state.forward_failures += 1
            if exc.code() in DEAD_LETTER_CODES:
                await _set_aside(state, batch_id, f"{exc.code().name}: {exc.details()}")
                return
            delay = retry.jittered(ceiling)
            log.warning(
                "curator did not take batch %s (%s: %s); retrying in %.1fs",
                batch_id,
                exc.code().name,
                exc.details(),
                delay,
                extra={
                    "batch_id": batch_id,
                    "method": "IngestBatch",
                    "status_code": exc.code().name,
                    "retry_in_seconds": delay,
                },
            )
            await asyncio.sleep(delay)
            ceiling = backoff.grow(ceiling)
            continue
        state.metrics.forward_seconds.labels("OK").observe(time.perf_counter() - sent)
        await state.store.durably(state.reportlog.delivered, batch_id)
        log.info(
            "curator acknowledged batch %s (%d accepted, %d rejected%s)",
            batch_id,
            reply.accepted,
            reply.rejected,
            ", already stored" if reply.duplicate else "",
            extra={
                "batch_id": batch_id,
                "method": "IngestBatch",
                "status_code": "OK",
                "accepted": reply.accepted,
                "rejected": reply.rejected,
                "duplicate": reply.duplicate,
            },
        )
        return


async def _set_aside(state: ShufflerState, batch_id: str, refusal: str) -> None:
    """Make a batch the curator refused for good a dead letter, so the batches after it are delivered."""
    await state.store.durably(state.reportlog.dead_letter, batch_id, refusal)
    log.error(
        "the curator refused batch %s for good (%s): set aside as a dead letter, newer batches go on; see "
        "`lac shuffler dead-letter list`, then retry or drop it",
        batch_id,
        refusal,
        extra={"batch_id": batch_id, "method": "IngestBatch", "status_code": refusal.split(":", 1)[0]},
    )


# ------------------------------------------------------------------ dead letters (operator)


async def dead_letters(state: ShufflerState) -> tuple[DeadLetter, ...]:
    """Every dead letter, oldest first."""
    rows = await state.store.run(state.reportlog.dead_letters)
    return tuple(DeadLetter(b, n, refusal, since, p or b"") for b, n, refusal, since, p in rows)


async def settle_dead_letters(state: ShufflerState, batch_ids: list[str], every: bool, drop: bool) -> Settled:
    """Retry (pending again) or drop (deleted with their reports) the dead letters named, or ``every`` one."""
    if bool(batch_ids) == every:
        raise InvalidArgument("name the dead letters' batch ids, or ask for all of them (--all), not both")
    if any(len(b) > MAX_BATCH_ID_CHARS for b in batch_ids):  # their number is bounded before parsing
        raise InvalidArgument(f"batch ids have at most {MAX_BATCH_ID_CHARS} characters")
    log_ = state.reportlog
    try:
        done = await state.store.run(log_.drop_dead if drop else log_.retry_dead, None if every else batch_ids)
    except KeyError as exc:
        unknown = exc.args[0]
        named = ", ".join(repr(b[:40]) for b in unknown[:3]) + (f" and {len(unknown) - 3} more" * (len(unknown) > 3))
        raise NotFound(f"not dead letters of this shuffler: {named}; nothing was changed") from None
    reports = sum(n for _, n in done)
    log.warning(
        "%s %d dead letter(s) of %d report(s) at the operator's request%s",
        "dropped" if drop else "retrying",
        len(done),
        reports,
        ": their reports are deleted, never delivered" if drop else "",
        extra={"batches": len(done), "reports": reports},
    )
    if not drop:
        state.wake_forwarder.set()
    return Settled(tuple(b for b, _ in done), reports)
