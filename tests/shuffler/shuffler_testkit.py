"""Shuffler test helpers: plaintext reports, a free loopback port, and the shared helpers the shuffler
tests use (a real gRPC CuratorIngest that records the wire, a real ``lac shuffler serve`` process), and a
shuffler's state without gRPC for the handler tests (``handler_state``)."""

from __future__ import annotations

import asyncio
import os
from contextlib import asynccontextmanager
from pathlib import Path

from lac_testkit import ServeProc, Sink, content, free_port, tag_of  # noqa: F401 - re-exported for the shuffler tests
from lac_testkit import wait_until as wait_for  # noqa: F401

from lac.common.v1 import reports_pb2, shuffler_pb2


def payload(tag: bytes, size: int = 0) -> reports_pb2.SealedPayload:
    """A plaintext payload whose content is a ReportContent with report_id = ``tag``."""
    c = content(["x" * size or "w"], report_id=tag)
    return reports_pb2.SealedPayload(
        encoding=reports_pb2.PAYLOAD_ENCODING_PLAINTEXT_INSECURE, data=c.SerializeToString()
    )


def report(tag: bytes | None = None, crowd: str = "", idem: bytes | None = None) -> shuffler_pb2.ClientReport:
    """A client report carrying ``payload(tag)`` (random tag and idempotency id unless given)."""
    return shuffler_pb2.ClientReport(
        idempotency_id=idem or os.urandom(16), payload=payload(tag or os.urandom(16)), crowd_id=crowd
    )


def submission(n: int = 1, crowd: str | None = None):
    """A Submit message's ``n`` plaintext reports as the intake handler takes them (``serde.Submission``)."""
    from lac.shuffler.serde import Submission

    items = tuple((os.urandom(16), crowd, payload(os.urandom(16)).SerializeToString()) for _ in range(n))
    return Submission(n, tuple(i[0] for i in items), items)


@asynccontextmanager
async def handler_state(state_dir: Path, loops=(), **overrides):
    """A ``ShufflerState`` over ``state_dir`` as ``lac.shuffler.lifecycle`` opens it, with no gRPC server and only
    the background ``loops`` given running (e.g. ``intake.commit_loop``, which a Submit waits for); stopped at the
    end. Its curator (127.0.0.1:1) is never called: no forward loop runs unless given."""
    from lac.shuffler import lifecycle
    from lac.shuffler.config import ShufflerConfig

    for key, value in {"auth": "none", "insecure": True, "allow_plaintext_payloads": True, "port": 0}.items():
        overrides.setdefault(key, value)
    state = lifecycle.open_state(ShufflerConfig(curator="127.0.0.1:1", state_dir=state_dir, **overrides))
    state.tasks = [asyncio.create_task(loop(state)) for loop in loops]
    try:
        yield state
    finally:
        await lifecycle.stop(state)
