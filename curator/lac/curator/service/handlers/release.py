"""Release, PreviewRelease, ListReleases and GetRelease: releases charged to the per-window ledger, their predicted
accuracy, and the stored releases.

Releases are idempotent by the request's ``request_id``: a retry returns the release the first call made (or awaits
it while it runs) and spends once (``release``). A release that cannot be stored charges nothing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
import uuid
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from lac.common import tracing
from lac.common.errors import AlreadyExists, ErrorReason, FailedPrecondition, InvalidArgument, NotFound
from lac.common.privacy import Budget, ExportedWindows, PrivacyUnit
from lac.common.rng import secure_generator
from lac.curator import mechanisms
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.release.errorbars import ItemErrors
from lac.curator.runner import run as releases
from lac.curator.runner.preview import Preview, predict, refusal
from lac.curator.runner.run import ReleaseRecord
from lac.curator.service.handlers import exports

if TYPE_CHECKING:
    from lac.curator.service.state import CuratorState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredRelease:
    """A stored release as it is shown now: its record (with the caveat of exports of its windows made since it),
    its items, their released log-probabilities, pseudo-counts (None: none) and error bars (None: none)."""

    record: ReleaseRecord
    items: tuple[str, ...]
    log_probs: np.ndarray
    pseudo_counts: np.ndarray | None
    errors: ItemErrors | None


def spec_key(spec: ReleaseSpec) -> str:
    """A canonical text of a release request's parameters: retries with one request id must match it."""
    return json.dumps(spec.as_dict(), sort_keys=True)


def _out_of_range(spec: ReleaseSpec, exc: ArithmeticError) -> InvalidArgument:
    """The error for parameters the mechanism's arithmetic cannot handle (e.g. a noise scale that overflows)."""
    return InvalidArgument(
        f"the release's parameters are out of the numerically supported range (mechanism "
        f"{spec.mechanism}, ε = {spec.epsilon!r}, δ = {spec.delta!r}): {exc}"
    )


def _check_mechanism(spec: ReleaseSpec) -> None:
    if not mechanisms.get(spec.mechanism).over_rpc:
        raise InvalidArgument(
            f"mechanism {spec.mechanism!r} is not available over RPC; available: {', '.join(mechanisms.over_rpc())}"
        )


def exported_windows(
    span: tuple[int, int], exports: list[tuple[str, str, float, int, int, int]], since: float | None = None
) -> ExportedWindows | None:
    """The windows of ``span`` that ``exports`` (``CuratorStore.exports``; only those made after ``since``, when
    given) covered, None if none did."""
    first, last = span
    covering = [(a, b) for _, _, at, a, b, _ in exports if a <= last and b >= first and (since is None or at > since)]
    covered = {w for a, b in covering for w in range(max(a, first), min(b, last) + 1)}
    return ExportedWindows.of(covered, len(covering), later=since is not None)


def _shown(record: ReleaseRecord, exports: list[tuple[str, str, float, int, int, int]]) -> ReleaseRecord:
    """``record`` with the caveat of the exports of its windows made after it."""
    made = dt.datetime.fromisoformat(record.created_at).timestamp()
    later = exported_windows((record.first_window, record.last_window), exports, since=made)
    return record if later is None else record.with_later_exports(later)


def _perturbed_preface(cause: str) -> str:
    """The first sentence of a release that was to estimate the users' clean text but has no local channel."""
    return (
        f"This release describes the users' perturbed reports, not their clean text: the curator's local channel, "
        f"which this deployment's releases use to estimate the clean text, is missing ({cause})."
    )


def _mixed_preface(since: int, epsilon: float) -> str:
    """The first sentence of a release that was to estimate the users' clean text over windows before ``since``,
    which may hold reports made at another ε than the local channel's ``epsilon``."""
    return (
        f"This release describes the users' perturbed reports, not their clean text: its windows before {since} "
        f"may hold reports made at another ε per word than the local channel's {epsilon:g} (stored before this "
        f"curator took reports at exactly that ε), and one channel cannot deconvolve reports of several ε; "
        f"releases of windows {since} on estimate the clean text."
    )


async def windows_of(state: CuratorState, spec: ReleaseSpec) -> tuple[tuple[int, int], PrivacyUnit]:
    """The windows ``spec`` covers and the privacy unit over them (one client's reports there)."""
    _check_mechanism(spec)
    span: tuple[int, int] | None = None
    if spec.first_window is not None and spec.last_window is not None:  # (both or neither: ReleaseSpec)
        span = (spec.first_window, spec.last_window)
    else:
        span = await state.store_thread.run(state.store.windows)
        if span is None:
            raise FailedPrecondition("no reports are stored yet: there is nothing to release")
    n_windows = span[1] - span[0] + 1
    if n_windows > 100_000:
        raise InvalidArgument(f"a release covers at most 100,000 windows, not {n_windows}")
    if span[0] < 0:  # before the Unix epoch: no report is there, and charging it would be for nothing
        raise InvalidArgument(f"the release covers window {span[0]}: accounting windows count from 0")
    d = state.deployment
    newest = state.newest_window()
    if span[1] > newest:  # no report can be there yet: charging those windows would waste their budget
        raise InvalidArgument(
            f"the release covers windows up to {span[1]}, after the current window {newest}: no "
            f"report can be stored there yet; end it at the current window or before"
        )
    return span, PrivacyUnit.client(d.reports_per_window, n_windows, d.window_seconds)


def _predict(state: CuratorState, spec: ReleaseSpec, unit: PrivacyUnit, reports: int | None, source: str) -> Preview:
    try:
        return predict(
            spec,
            state.vocab,
            state.caps,
            unit,
            reports=reports,
            reports_source=source,
            target_share=state.config.min_signal_share,
        )
    except ArithmeticError as exc:
        raise _out_of_range(spec, exc) from None


async def _known_reports(
    state: CuratorState, spec: ReleaseSpec, span: tuple[int, int], operator: bool
) -> tuple[int | None, str]:
    """The number of reports the caller may know, and where it comes from: the request's
    assumption, the exact count (operators see it anyway) or a DP count released earlier for
    exactly these windows, reused unless they have all closed since it was taken (so a refused
    release charges its count once while a window is open, and once more after it closed)."""
    if spec.expected_reports is not None:
        return spec.expected_reports, "assumed by the request"
    if operator:
        return await state.store_thread.run(state.store.report_count, *span), "stored, exact (operator view)"
    kept = await state.store_thread.run(state.store.noisy_count, *span)
    if kept is not None:
        value, scale, eps, at = kept
        closes = (span[1] + 1) * state.deployment.window_seconds
        if closes <= at or time.time() < closes:  # taken after the windows closed, or still open now
            when = dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="seconds")
            still = "" if closes <= at else f", while window {span[1]} was still open: later reports are not in it"
            return max(0, round(value)), (
                f"a DP count of {when}{still} (ε = {eps:g}, Laplace scale {scale:.3g}: about ±{3 * scale:.3g})"
            )
    return None, ""


async def _dp_count(state: CuratorState, span: tuple[int, int], unit: PrivacyUnit) -> tuple[int, str]:
    """A fresh DP count of the reports in ``span`` (Laplace, sensitivity: one client's reports
    there), kept and charged ``count_epsilon`` to every window it covers."""
    eps = state.config.count_epsilon
    scale = unit.max_reports / eps
    exact = await state.store_thread.run(state.store.report_count, *span)
    rng = state.rng if state.rng is not None else secure_generator()
    value = float(np.rint((exact + rng.laplace(0.0, scale)) * 1024) / 1024)
    await state.store_thread.run(state.store.add_noisy_count, *span, value, scale, Budget(eps, 0.0), state.budget)
    return max(0, round(value)), f"a DP count taken now (ε = {eps:g} charged, Laplace scale {scale:.3g})"


async def preview(state: CuratorState, spec: ReleaseSpec, operator: bool = False) -> Preview:
    """The release's predicted accuracy (``lac.curator.runner.preview``) and the budget of each window it covers
    after it (the ledger, which GetBudget shows, plus its charge): spends nothing."""
    span, unit = await windows_of(state, spec)
    reports, source = await _known_reports(state, spec, span, operator)
    p = _predict(state, spec, unit, reports, source)
    waiting = (
        "channel" in mechanisms.get(spec.mechanism).knobs and state.channel_future and not state.channel_future.done()
    )
    if waiting:  # the release would answer UNAVAILABLE now: say how far the channel is
        p = replace(
            p, channel_progress=state.channel_progress.fraction, channel_status=state.channel_progress.describe()
        )
    if spec.data_dependent:  # never charged
        return p
    charge = spec.budget  # the mechanism's privacy map
    checked = not (spec.force or state.config.min_signal_share <= 0)
    if checked and reports is None and p.reports_needed is not None:  # the check takes a DP count first
        charge = Budget(charge.epsilon + state.config.count_epsilon, charge.delta)
    spent = await state.store_thread.run(state.store.spent)
    after = []
    for w in range(span[0], span[1] + 1):
        was = spent.get(w, Budget(0.0))
        eps, delta = was.epsilon + charge.epsilon, was.delta + charge.delta
        after.append((w, eps, delta, state.budget.epsilon - eps, state.budget.delta - delta))
    return replace(p, budget_after=tuple(after), budget=(state.budget.epsilon, state.budget.delta))


async def _check_accuracy(
    state: CuratorState, spec: ReleaseSpec, span: tuple[int, int], unit: PrivacyUnit, operator: bool
) -> None:
    """Refuse a release whose noise would swamp the signal (see ``preview``), unless forced."""
    if spec.force or spec.data_dependent or state.config.min_signal_share <= 0:
        return
    reports, source = await _known_reports(state, spec, span, operator)
    spent = "nothing was spent"
    if reports is None and _predict(state, spec, unit, None, "").reports_needed is not None:
        reports, source = await _dp_count(state, span, unit)
        spent = f"only the DP count was charged (ε = {state.config.count_epsilon:g})"
    p = _predict(state, spec, unit, reports, source)
    if p.swamped:
        raise FailedPrecondition(refusal(p, spent), error_reason=ErrorReason.RELEASE_REFUSED)


async def release(
    state: CuratorState, spec: ReleaseSpec, operator: bool = False, request_id: str | None = None
) -> ReleaseRecord:
    """Run ``spec`` over the windows it covers and charge every one of them (if it is DP).

    Idempotent by ``request_id`` (None: a fresh one): a call with the id of a release already made
    with the same ``spec`` returns that release's record and spends nothing; one still running is
    awaited, not run twice; another ``spec`` is AlreadyExists. A release runs to its end even if
    its caller goes away (a deadline), so that a retry finds it."""
    request_id = request_id or uuid.uuid4().hex
    key = spec_key(spec)
    earlier = await state.store_thread.run(state.store.release_for_request, request_id, key)
    if earlier is not None:
        log.info(
            "release request %s repeated: release %s returned again, nothing spent",
            request_id,
            earlier,
            extra={"release_id": earlier},
        )
        try:
            return (await get_release(state, earlier)).record
        except NotFound:  # its record went with a restore from an older backup; its charge did not
            raise FailedPrecondition(
                f"request id {request_id!r} made release {earlier}, whose record was lost when this "
                f"curator was restored from an older backup; its privacy spending stays in the ledger and "
                f"nothing was spent now; use a new request id for a new release"
            ) from None
    running = state.inflight.get(request_id)  # checked and registered with no await in between
    if running is not None:
        if running[0] != key:
            raise AlreadyExists(
                f"request id {request_id!r} is in use by a running release with other "
                f"parameters; use a new request id for a new release"
            )
        return await asyncio.shield(running[1])
    task = asyncio.get_running_loop().create_task(_release(state, spec, operator, request_id, key))
    state.inflight[request_id] = (key, task)
    task.add_done_callback(
        lambda t: (state.inflight.pop(request_id, None), t.cancelled() or t.exception())
    )  # retrieved: a caller may be gone
    return await asyncio.shield(task)


async def _release(state: CuratorState, spec: ReleaseSpec, operator: bool, request_id: str, key: str) -> ReleaseRecord:
    _check_mechanism(spec)
    if spec.data_dependent and not state.config.allow_data_dependent_releases:
        raise FailedPrecondition(
            "data-dependent sensitivities are NOT differentially private and are disabled; "
            "the operator can enable them with allow_data_dependent_releases"
        )
    state.storage.check()  # a release that cannot be stored is refused before it is computed or charged
    # UNAVAILABLE while the local channel is not ready: before anything (the accuracy check's DP count) is spent
    channel = state.channel() if "channel" in mechanisms.get(spec.mechanism).knobs else None
    span, unit = await windows_of(state, spec)
    preface = _perturbed_preface(state.channel_missing) if channel is None and state.channel_missing else ""
    since = state.channel_since
    if channel is not None and since is not None and span[0] < since:  # never one channel for mixed ε
        channel, preface = None, _mixed_preface(since, state.deployment.epsilon_per_word)
    windows = list(range(span[0], span[1] + 1))
    dd_cap = state.config.data_dependent_releases_per_window
    if spec.data_dependent:  # fail fast; re-checked where it is counted
        await state.store_thread.run(state.store.check_data_dependent, windows, dd_cap)
    else:
        await state.store_thread.run(
            state.store.check_budget, windows, spec.budget, state.budget
        )  # fail fast; re-checked
    dd_before = max((await state.store_thread.run(state.store.data_dependent_releases, windows)).values(), default=0)
    await _check_accuracy(state, spec, span, unit, operator)
    reports = await state.store_thread.run(state.reports, *span)
    try:
        r = await asyncio.to_thread(
            releases.run,
            reports,
            state.vocab,
            spec,
            state.caps,
            unit,
            state.rng,
            state.engine,
            channel,
            state.bootstrap,
        )
    except ArithmeticError as exc:
        raise _out_of_range(spec, exc) from None
    record = ReleaseRecord.of(
        r,
        uuid.uuid4().hex,
        dt.datetime.now(dt.UTC).isoformat(),
        state.vocab.max_n,
        span,
        unit,
        request_id=request_id,
        data_dependent_before=dd_before,
        period=state.deployment.period_loss(state.budget),
        exported=exported_windows(span, await exports.exports(state)),
        preface=preface,
    )
    stored = await state.store_thread.run(
        partial(
            state.store.add_release,
            record.release_id,
            record.to_json(),
            r.items,
            r.log_probs,
            r.pseudo_counts,
            windows,
            r.charge,
            state.budget,
            request_id=request_id,
            spec=key,
            data_dependent_cap=dd_cap if r.charge is None else None,
            errors=r.errors.arrays() if r.errors is not None else None,
        )
    )
    if stored != record.release_id:  # made meanwhile by another curator process on this state directory
        return (await get_release(state, stored)).record
    log.info(
        "release %s (%s) over windows %d..%d: %s",
        record.release_id,
        spec.mechanism,
        *span,
        record.statement if r.differentially_private else "NOT differentially private (not charged)",
        extra={
            "release_id": record.release_id,
            "mechanism": spec.mechanism,
            "first_window": span[0],
            "last_window": span[1],
            "differentially_private": r.differentially_private,
        },
    )
    tracing.set_attributes(
        {
            "lac.release_id": record.release_id,
            "lac.mechanism": spec.mechanism,
            "lac.epsilon": record.epsilon,
            "lac.delta": record.delta,
            "lac.first_window": span[0],
            "lac.last_window": span[1],
        }
    )
    return record


async def list_releases(state: CuratorState) -> list[ReleaseRecord]:
    """Every stored release's record as it is shown now (``get_release``)."""
    made = await exports.exports(state)
    return [_shown(ReleaseRecord.from_json(r), made) for r in await state.store_thread.run(state.store.releases)]


async def get_release(state: CuratorState, release_id: str) -> StoredRelease:
    """A stored release (its error bars None for a release made before releases had them) or NotFound. The record
    as it is shown now: with the caveat of exports of its windows made since it."""
    found = await state.store_thread.run(state.store.release, release_id) if release_id else None
    if found is None:
        raise NotFound(f"no release {release_id[:200]!r}")
    data, items, log_probs, pseudo, arrays = found
    record = _shown(ReleaseRecord.from_json(data), await exports.exports(state))
    bars = record.bars
    return StoredRelease(
        record, items, log_probs, pseudo, ItemErrors.stored(bars, arrays) if bars is not None else None
    )
