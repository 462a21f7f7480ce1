"""Helpers of the client SDK's tests (blocking and asyncio clients alike)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import grpc
import numpy as np

import lac.client
from lac.client import errors


def privatized(glove200, text: str = "the king") -> lac.client.PrivatizedReport:
    """``text`` privatized over the 200 most frequent GloVe words (ε = 10, seeded)."""
    localizer = lac.client.Localizer(glove200, lac.client.MultivariateLaplace(10.0), rng=np.random.default_rng(1))
    return localizer.privatize(text)


def assert_wrapped(exc, cls, code) -> None:
    """``exc`` is the SDK's ``cls`` for status ``code``, raised from an RPC (also a grpc.RpcError)."""
    assert type(exc).__module__ == "lac.client._grpc_errors"
    assert isinstance(exc, cls) and isinstance(exc, errors.LacClientError)
    assert isinstance(exc, grpc.RpcError)  # code written against raw gRPC still catches it
    assert exc.status_code == code == exc.code() and exc.status_details == exc.details() and exc.status_details
    assert code.name in str(exc)


@contextlib.contextmanager
def silent_port() -> Iterator[str]:
    """The address of a loopback socket that listens but never accepts nor answers: a connection to it is
    neither refused nor ever ready (gRPC waits for the server's HTTP/2 settings), as with a host that is down
    behind a firewall dropping packets."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"127.0.0.1:{listener.getsockname()[1]}"
