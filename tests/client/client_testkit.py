"""Helpers of the client SDK's tests (blocking and asyncio clients alike)."""

from __future__ import annotations

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
