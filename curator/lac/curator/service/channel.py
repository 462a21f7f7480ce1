"""The local channel while a curator gets it ready: read from the cache, or sampled and then built into
its n-gram products (``lac.curator.release.channel``). What a release, a preview, the metrics and the logs
say meanwhile comes from one ``ChannelProgress``: how far the sampling is and the time left, estimated from
the rate so far. Public information only (the deployment's channel depends on no report)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lac.common.errors import ErrorReason, Unavailable
from lac.common.statelock import waiting_lock

if TYPE_CHECKING:
    from lac.curator.base.ngrams import NgramVocabulary
    from lac.curator.service.config import CuratorConfig

log = logging.getLogger(__name__)

BUILD_RETRY_SECONDS = 5.0  # the retry-after while the n-gram products are built or the cache is read (no rate)


@dataclass
class ChannelProgress:
    """The state of one curator's local channel: ``phase`` is "loading" (reading the cache or starting),
    "sampling" (``done`` of ``total`` perturbations), "building" (the n-gram products), "ready" or "failed".
    Written by the thread that gets the channel, read by the event loop."""

    phase: str = "loading"
    done: int = 0
    total: int = 0
    sampled: bool = False  # this curator sampled the word channel (False: read from the cache)
    started: float = field(default_factory=time.monotonic)
    sampling_started: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def update(self, done: int, total: int) -> None:
        """The sampling's progress callback: ``done`` of ``total`` perturbations."""
        with self._lock:
            if self.sampling_started is None:
                self.sampling_started = time.monotonic()
                self.sampled = True
            self.done, self.total = int(done), int(total)
            self.phase = "building" if done >= total else "sampling"

    def finish(self, ready: bool) -> None:
        with self._lock:
            self.phase = "ready" if ready else "failed"

    @property
    def ready(self) -> bool:
        return self.phase == "ready"

    @property
    def fraction(self) -> float:
        """The sampling's progress, 0..1 (1 once sampled or read from the cache)."""
        if self.phase in ("ready", "building"):
            return 1.0
        return self.done / self.total if self.total else 0.0

    def seconds_left(self) -> float | None:
        """The sampling's time left at its rate so far (None before the first pass, or when not sampling)."""
        with self._lock:
            if self.phase != "sampling" or self.sampling_started is None or self.done <= 0:
                return None
            rate = self.done / max(time.monotonic() - self.sampling_started, 1e-9)
            return (self.total - self.done) / rate

    def describe(self) -> str:
        """Where the channel is, in one sentence."""
        elapsed = time.monotonic() - self.started
        if self.phase == "sampling":
            left = self.seconds_left()
            eta = f", about {math.ceil(left)} s left" if left is not None else ""
            return (
                f"the curator is sampling the deployment's local channel (once per deployment; "
                f"{100 * self.fraction:.0f}% of {self.total:,} perturbations done after {elapsed:.0f} s{eta})"
            )
        if self.phase == "building":
            return f"the curator is building the local channel's n-gram products (started {elapsed:.0f} s ago)"
        if self.phase == "loading":
            return "the curator is reading its local channel (cached or about to be sampled)"
        return f"the local channel is {self.phase}"

    def unavailable(self) -> Unavailable:
        """What a release that needs the channel answers while it is not ready: UNAVAILABLE with the progress,
        the time left and a ``retry-after-seconds`` to match."""
        left = self.seconds_left()
        wait = max(1.0, left if left is not None else BUILD_RETRY_SECONDS)
        return Unavailable(
            f"{self.describe()}; the release needs it: retry in {math.ceil(wait)} s (nothing was spent)",
            retry_after=wait,
            error_reason=ErrorReason.CHANNEL_NOT_READY,
        )


def load_channel(
    config: CuratorConfig,
    vocab: NgramVocabulary,
    progress: Callable[[int, int], None] | None = None,
    stop: Callable[[], bool] = lambda: False,
):
    """The deployment's n-gram channel over ``vocab`` as ``config`` names it: read from ``config.channel_dir``,
    or sampled (``progress(done, total)`` meanwhile) and cached there. Needs ``lac-curator[channel]``.

    Replicas share the cache (by default the shared directory's ``prior/``): each reads or builds it holding the
    cache's lock (the file ``<cache>.lock`` beside it), so while one samples and builds, another waits
    (``InterruptedError`` once ``stop()``) and then reads what the first wrote; the files are written atomically
    either way."""
    from lac.curator.base.prior import default_public_corpus
    from lac.curator.release.channel import deployment_channel

    cache = config.channel_dir
    if not cache.parent.exists():
        cache.parent.mkdir(parents=True, mode=0o700)
    with waiting_lock(cache.with_name(cache.name + ".lock"), stop) as waited:
        if waited:
            log.info("waited for another curator to read or build the local channel in %s", cache)
        return deployment_channel(
            cache,
            vocab,
            config.public_corpus or default_public_corpus(),
            config.embedding,
            config.local_mechanism,
            config.epsilon_per_word,
            progress=progress,
        )
