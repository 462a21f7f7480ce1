"""The analyst's Python API: releases and queries of a curator as pandas DataFrames (or Arrow tables).

Three lines from a running curator to a DataFrame of the top n-grams::

    from lac.analyst import CuratorClient
    with CuratorClient("localhost:50052", ca="ca.pem", cert="analyst.pem", key="analyst.key") as c:
        top = c.top(c.release(epsilon=1.0).release_id, k=20)

``CuratorClient`` is a thin, synchronous wrapper over the ``lac.v1.Curator`` gRPC service: every
number it returns is one the service returned (differentially private outputs and public
configuration). What an analyst may see is decided by the curator, per caller: an analyst's release
record carries no report count, and for a data-dependent release no sensitivity or noise scale, so
nothing here has a column for them.

Errors of the service arrive as ``AnalystError`` (``.status``: the gRPC status code, ``.code``: its name,
``.details``: the curator's message), or one of its subclasses, chosen by the status code (and, for the two
kinds of FAILED_PRECONDITION, the ``lac-error-reason`` trailing metadata the curator sends), never by the
message text: ``PermissionDenied``, ``NotFound``, ``InvalidArgument``, ``FailedPrecondition`` (and its
``BudgetExhausted``, ``ReleaseRefused``), ``ResourceExhausted``, ``Unavailable`` (and its ``ChannelNotReady``).
No raw gRPC exception escapes.

DataFrames need pandas (``lac-analyst[frames]``), Arrow tables (``as_arrow=True``), Parquet files and exports
of privatized reports need pyarrow (``lac-analyst[arrow]``), plots matplotlib (``lac-analyst[plots]``);
``lac-analyst[notebook]`` takes all three. Each is imported on first use, so ``import lac.analyst`` works
without them.

The client's rooms: ``errors`` (the error tree), ``transport`` (request ids and a release's retries), ``records``
(what the calls return), ``frames`` (DataFrames and Arrow tables) and this module (``CuratorClient``); every public
name is importable from here and from ``lac.analyst``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import numbers
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from lac.analyst.errors import (
    AnalystError,
    BudgetExhausted,
    ChannelNotReady,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ReleaseRefused,
    ResourceExhausted,
    Unavailable,
    error_from_rpc,
)
from lac.analyst.frames import (
    BOOL,
    FLOAT64,
    INT8,
    INT64,
    NULLABLE_INT64,
    PARAMS,
    STRING,
    TIMESTAMP,
    _arrow_table,
    _frame,
    _orders,
    _pandas,
    _pyarrow,
)
from lac.analyst.records import (
    Budget,
    CuratorStatus,
    ExportedReports,
    PerplexityResult,
    ReleaseInfo,
    ReleasePreview,
    WindowBudget,
    _timestamp,
    read_export,
)
from lac.analyst.transport import new_request_id, release_with_retries
from lac.common import tls
from lac.common.privacy import ERROR_BAR_LEVEL
from lac.common.v1 import curator_pb2, curator_pb2_grpc, reports_pb2

if TYPE_CHECKING:  # pragma: no cover
    import pandas
    import pyarrow

    from lac.common.deployment import Deployment

__all__ = [
    "CuratorClient",
    "ReleaseInfo",
    "ReleasePreview",
    "WindowBudget",
    "PerplexityResult",
    "CuratorStatus",
    "AnalystError",
    "FailedPrecondition",
    "BudgetExhausted",
    "ReleaseRefused",
    "NotFound",
    "PermissionDenied",
    "InvalidArgument",
    "ResourceExhausted",
    "Unavailable",
    "ChannelNotReady",
    "PARQUET_RECORD_KEY",
    "Budget",
    "ExportedReports",
    "read_export",
    "error_from_rpc",
    "new_request_id",
    "release_with_retries",
]

PARQUET_RECORD_KEY = "lac.release"  # Parquet key-value metadata: the release record as JSON
PARQUET_FORMAT_KEY = "lac.format"
PARQUET_FORMAT = "lac-release/1"
# A release's knobs: every ReleaseRequest field but the common ones, read from the message itself so that a knob
# the curator gains is one here without an edit; "S" is the curator's spelling of the field s.
_RELEASE_COMMON = frozenset({"mechanism", "epsilon", "delta", "first_window", "last_window", "request_id"})
_KNOBS = {
    **{f.name: f.name for f in curator_pb2.ReleaseRequest.DESCRIPTOR.fields if f.name not in _RELEASE_COMMON},
    "S": "s",
}


_UINT32_MAX = 2**32 - 1  # the largest k or order a TopNgramsRequest carries
ERROR_BARS_KEY = "lac.error_bars"  # top()'s metadata: the intervals' level and what the error bars describe


# -- the client -----------------------------------------------------------------------------------


class CuratorClient:
    """A synchronous client of a LAC curator for analysts (and operators).

    ``target`` is ``host:port``. Production curators require mutual TLS: ``ca`` is the CA to trust
    (``ca.pem`` from ``lac keys tls``), ``cert``/``key`` the caller's certificate (common name
    ``analyst`` for the analyst role). ``insecure=True`` uses a plaintext channel, for a local demo
    curator started with ``--insecure`` only. ``timeout`` bounds each query (seconds),
    ``release_timeout`` each release and export.

    Use it as a context manager (or call ``close()``). Methods returning tables give a pandas
    DataFrame, or a ``pyarrow.Table`` with ``as_arrow=True``.
    """

    def __init__(
        self,
        target: str,
        *,
        ca: str | os.PathLike | None = None,
        cert: str | os.PathLike | None = None,
        key: str | os.PathLike | None = None,
        insecure: bool = False,
        timeout: float = 60.0,
        release_timeout: float = 600.0,
    ):
        channel_tls = tls.client_tls(
            str(ca or ""), str(cert or ""), str(key or ""), insecure=insecure, name="CuratorClient"
        )
        self._open(target, channel_tls, timeout, release_timeout)

    @classmethod
    def with_tls(
        cls, target: str, channel_tls: tls.ClientTls | None, *, timeout: float = 60.0, release_timeout: float = 600.0
    ) -> CuratorClient:
        """A client over transport settings already checked (``lac.common.tls.client_tls``; None: plaintext,
        for a curator started with ``--insecure``), as the ``lac curator`` commands hold them."""
        self = cls.__new__(cls)
        self._open(target, channel_tls, timeout, release_timeout)
        return self

    def _open(self, target: str, channel_tls: tls.ClientTls | None, timeout: float, release_timeout: float) -> None:
        self.target = target
        self.timeout = timeout
        self.release_timeout = release_timeout
        self._channel = tls.channel(target, channel_tls)
        self._stub = curator_pb2_grpc.CuratorStub(self._channel)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> CuratorClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CuratorClient({self.target!r})"

    # -- the RPCs themselves (typed errors), and plumbing

    def call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        """The lower level: one unary RPC of ``lac.v1.Curator`` (``method``, e.g. ``"GetBudget"``, with its
        request message), returning the reply message as the curator sent it; a failure raises the
        ``AnalystError`` of its status code. ``timeout`` defaults to ``self.timeout``. The other methods are
        built on it; ``lac curator`` uses it to print the replies themselves (``--json``)."""
        try:
            return getattr(self._stub, method)(request, timeout=timeout or self.timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    def stream(self, method: str, request: Any, timeout: float | None = None) -> Iterator[Any]:
        """One server-streaming RPC (``"ExportArpa"``, ``"ExportReports"``): its reply messages, a failure at any
        point raised as ``AnalystError``. ``timeout`` (the whole stream) defaults to ``self.release_timeout``."""
        try:
            yield from getattr(self._stub, method)(request, timeout=timeout or self.release_timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    def send_release(
        self, request: curator_pb2.ReleaseRequest, timeout: float | None = None
    ) -> curator_pb2.ReleaseRecord:
        """The lower level of ``release``: send a ``ReleaseRequest`` (given a fresh ``request_id`` if it has
        none) with ``release_with_retries`` and return the curator's ``ReleaseRecord`` message (an operator's
        holds the report count, which ``ReleaseInfo`` does not keep). Failures raise ``AnalystError``."""
        if not request.request_id:
            request.request_id = new_request_id()
        try:
            return release_with_retries(self._stub.Release, request, timeout or self.release_timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    @staticmethod
    def _deps(as_arrow: bool) -> None:
        """Check that what the result needs is installed (before any RPC): pyarrow for an Arrow table,
        pandas for a DataFrame."""
        if as_arrow:
            _pyarrow()
        else:
            _pandas()

    def _ngram_table(self, ngrams, as_arrow: bool, errors: curator_pb2.TopNgramsResponse | None = None):
        """The table of released n-grams (``NgramProbability`` messages): ngram, order, probability, and with
        the ``errors`` of a TopNgrams reply noise_sd, noise_low, noise_high (NaN where unset) and their level and
        description as metadata (see ``top``)."""
        grams = [g.ngram for g in ngrams]
        columns = {
            "ngram": (grams, STRING),
            "order": (_orders(grams), INT8),
            "probability": ([g.probability for g in ngrams], FLOAT64),
        }
        if errors is None:
            return self._table(columns, as_arrow)
        for name in ("noise_sd", "noise_low", "noise_high"):
            columns[name] = ([getattr(g, name) if g.HasField(name) else math.nan for g in ngrams], FLOAT64)
        described = {"level": errors.level, "statement": errors.error_bars}
        return self._table(columns, as_arrow, {ERROR_BARS_KEY: json.dumps(described)}, {ERROR_BARS_KEY: described})

    def _table(
        self,
        columns: Mapping[str, tuple[Any, str]],
        as_arrow: bool,
        metadata: Mapping[str, str] | None = None,
        attrs: Mapping[str, Any] | None = None,
    ):
        """A typed Arrow table of ``columns`` (name -> (values, column type: ``STRING``, ``INT8``...)) with the
        schema ``metadata``, or a DataFrame of the same columns and dtypes (built without pyarrow) with
        ``attrs``."""
        self._deps(as_arrow)
        if as_arrow:
            return _arrow_table(columns, metadata)
        return _frame(columns, attrs)

    @staticmethod
    def _id(release: str | ReleaseInfo) -> str:
        return release.release_id if isinstance(release, ReleaseInfo) else str(release)

    # -- releases

    def release(
        self,
        epsilon: float,
        delta: float | None = None,
        mechanism: str | None = None,
        first_window: int | None = None,
        last_window: int | None = None,
        *,
        request_id: str | None = None,
        **knobs: Any,
    ) -> ReleaseInfo:
        """Release the n-gram distribution of the stored reports: spends (ε, δ) from the privacy budget
        of every accounting window the release covers, and returns its record.

        ``mechanism``: ``"posterior"`` (default), ``"bayesian"``, ``"endtoend"``, ``"laplace"`` or
        ``"laplace-public"``; ``delta`` defaults to the curator's release default (1e-6) for the
        mechanisms that need δ > 0 (0 is refused for them); laplace and laplace-public are pure ε-DP
        (δ = 0 whatever is asked).
        ``first_window``/``last_window`` (both or neither; inclusive) select accounting windows; by
        default every window with stored reports. ``knobs``: ``discovery`` (posterior), ``S``
        (BayesianDP decay slope), ``rho``, ``sensitivity`` (``"sound"``; the data-dependent ones are
        NOT differentially private and only run if the operator enabled them), ``calibration``,
        ``public_sensitivity``, ``force`` and ``expected_reports`` (see ``preview``). Raises
        ``BudgetExhausted`` when a window's budget would be overspent (nothing is spent then),
        ``ReleaseRefused`` (a ``FailedPrecondition``) when the accuracy check predicts the noise would swamp
        the signal (unless ``force=True``), ``InvalidArgument`` for a bad request.

        The call is idempotent: it carries ``request_id`` (default: a fresh random one) and is sent
        again with it after UNAVAILABLE or an expired deadline (``RELEASE_ATTEMPTS`` in all), so a
        release is made and charged once however often it is sent; ``Unavailable`` if every attempt
        failed. Pass the same ``request_id`` again later to fetch the release a lost call made.

        On a fresh deployment the curator first samples its local channel (about a minute on 2 cores):
        meanwhile the default release answers at once with UNAVAILABLE, its progress and the time left,
        and this method waits that long (a warning is logged with the progress before each wait) and asks
        again, up to ``CHANNEL_WAIT`` seconds in all, then raises ``ChannelNotReady`` (an ``Unavailable``,
        with ``retry_after``). ``preview`` says how far the sampling is without waiting.
        """
        req = self._release_request(epsilon, delta, mechanism, first_window, last_window, knobs, "release")
        req.request_id = request_id or new_request_id()
        return self._own(ReleaseInfo.from_proto(self.send_release(req)))

    def preview(
        self,
        epsilon: float,
        delta: float | None = None,
        mechanism: str | None = None,
        first_window: int | None = None,
        last_window: int | None = None,
        **knobs: Any,
    ) -> ReleasePreview:
        """What ``release`` with the same arguments would give: its noise and the predicted share of
        the text's words that stand out of it (``lac.curator.runner.preview``). Reads no report, spends
        nothing. ``expected_reports=N`` assumes N reports; without it the prediction uses a DP count
        the curator already holds, if any, and otherwise says how many reports the release needs."""
        req = self._release_request(epsilon, delta, mechanism, first_window, last_window, knobs, "preview")
        return ReleasePreview.from_proto(self.call("PreviewRelease", req))

    def _own(self, record: ReleaseInfo) -> ReleaseInfo:
        """``record``, remembering this client for its ``plot_top`` (not a field: not compared, printed or saved)."""
        object.__setattr__(record, "_client", self)
        return record

    @staticmethod
    def _release_request(epsilon, delta, mechanism, first_window, last_window, knobs, what: str):
        unknown = set(knobs) - set(_KNOBS)
        if unknown:
            raise TypeError(
                f"{what}() got unknown knob(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_KNOBS))}"
            )
        req = curator_pb2.ReleaseRequest(epsilon=float(epsilon), mechanism=mechanism or "")
        if delta is not None:  # 0 is sent as 0 (pure ε-DP), not as unset
            req.delta = float(delta)
        for name, value in knobs.items():
            if value is not None:
                setattr(req, _KNOBS[name], value)
        if first_window is not None:
            req.first_window = int(first_window)
        if last_window is not None:
            req.last_window = int(last_window)
        return req

    def release_info(self, release_id: str | ReleaseInfo) -> ReleaseInfo:
        """The record of one release (``NotFound`` for an unknown id)."""
        rid = self._id(release_id)
        for r in self.call("ListReleases", curator_pb2.ListReleasesRequest()).releases:
            if r.release_id == rid:
                return self._own(ReleaseInfo.from_proto(r))
        raise NotFound("NOT_FOUND", f"no release {rid!r}")

    def releases(self, as_arrow: bool = False) -> pandas.DataFrame | pyarrow.Table:
        """Every release, one row each: release_id, created_at (UTC), mechanism, epsilon, delta,
        differentially_private, data_dependent, first_window, last_window (the accounting windows
        covered), privacy_unit, reports_per_user, sensitivity_method, calibration, gamma, sigma,
        laplace_scale (0 when the curator does not show them), ledger_epsilon, ledger_delta (spent from
        each covered window), vocab_size, max_n, params (the public knobs and caps) and statement."""
        self._deps(as_arrow)
        recs = [
            ReleaseInfo.from_proto(r) for r in self.call("ListReleases", curator_pb2.ListReleasesRequest()).releases
        ]
        f64, i64, s, b = FLOAT64, INT64, STRING, BOOL

        def col(name):
            return [getattr(r, name) for r in recs]

        return self._table(
            {
                "release_id": (col("release_id"), s),
                "created_at": (col("created_at"), TIMESTAMP),
                "mechanism": (col("mechanism"), s),
                "epsilon": (col("epsilon"), f64),
                "delta": (col("delta"), f64),
                "differentially_private": (col("differentially_private"), b),
                "data_dependent": (col("data_dependent"), b),
                "first_window": (col("first_window"), i64),
                "last_window": (col("last_window"), i64),
                "privacy_unit": (col("privacy_unit"), s),
                "reports_per_user": (col("reports_per_user"), i64),
                "sensitivity_method": (col("sensitivity_method"), s),
                "calibration": (col("calibration"), s),
                "gamma": (col("gamma"), f64),
                "sigma": (col("sigma"), f64),
                "laplace_scale": (col("laplace_scale"), f64),
                "ledger_epsilon": (col("ledger_epsilon"), f64),
                "ledger_delta": (col("ledger_delta"), f64),
                "vocab_size": (col("vocab_size"), i64),
                "max_n": (col("max_n"), i64),
                "params": ([list(p.items()) for p in col("params")], PARAMS),
                "statement": (col("statement"), s),
            },
            as_arrow,
        )

    # -- the released distribution

    def _release_table(self, release_id: str | ReleaseInfo, probability: bool, as_arrow: bool):
        self._deps(as_arrow)
        reply = self.call(
            "GetRelease", curator_pb2.GetReleaseRequest(release_id=self._id(release_id)), self.release_timeout
        )
        record = ReleaseInfo.from_proto(reply.record)
        items = list(reply.items)
        log_probs = np.asarray(reply.log_probs, dtype=np.float64)
        columns = {
            "ngram": (items, STRING),
            "order": (_orders(items), INT8),
            "log_prob": (log_probs, FLOAT64),
        }
        if probability:
            columns["probability"] = (np.exp(log_probs), FLOAT64)
        meta = {PARQUET_RECORD_KEY: record.to_json(), PARQUET_FORMAT_KEY: PARQUET_FORMAT}
        return self._table(columns, as_arrow, meta, {PARQUET_RECORD_KEY: record.to_dict()}), record

    def ngrams(self, release_id: str | ReleaseInfo, as_arrow: bool = False) -> pandas.DataFrame | pyarrow.Table:
        """The whole released distribution, one row per n-gram of the release vocabulary, in the
        release's order: ngram (tokens joined by spaces; ``<s>``/``</s>`` mark sentence boundaries),
        order (its n, int8), log_prob (the released joint log-probability over the whole vocabulary)
        and probability (``exp(log_prob)``). The release record is in ``df.attrs["lac.release"]``
        (an Arrow table's schema metadata, as JSON)."""
        return self._release_table(release_id, True, as_arrow)[0]

    def top(
        self,
        release_id: str | ReleaseInfo,
        k: int = 20,
        order: int = 0,
        as_arrow: bool = False,
        *,
        exclude_special: bool = False,
        level: float = ERROR_BAR_LEVEL,
    ) -> pandas.DataFrame | pyarrow.Table:
        """The ``k`` most probable n-grams of a release, most probable first: ngram, order, probability,
        noise_sd, noise_low, noise_high.

        ``k`` is an integer >= 1 (``ValueError`` otherwise, before any call: 0 is not read as a
        default); fewer rows come back when the release has fewer n-grams to list. ``order`` = n
        restricts to n-grams of that n, with probabilities renormalised within the order (the joint
        distribution of n-grams); 0 = any order, joint over the whole vocabulary.
        ``exclude_special=True`` leaves out every n-gram with a special token (``<unk>``, a word
        outside the vocabulary; ``<s>``/``</s>``, sentence boundaries); the others keep their
        probabilities (not renormalised), the same as ``probability()`` gives.

        ``noise_sd`` and [``noise_low``, ``noise_high``] are the n-gram's error bar on the scale of
        ``probability`` (the joint, or within the order asked for), computed by the curator when it made the
        release from its DP outputs and public data only: the standard deviation due to the DP noise, and the
        interval at ``level`` (0.9 unless given; a float in (0, 1), ``ValueError`` otherwise) of what the same
        release would say without the noise, given its public prior (and channel). For the default release they
        come from a parametric bootstrap of the noise through the release's post-processing, for Laplace from
        its scale (centred on an unbiased estimate, so the interval can lie above a released probability the
        noise pulled down). They do not cover the prior's bias nor the channel model's error. The level and
        the curator's description of the error bars are in ``df.attrs["lac.error_bars"]`` (``{"level": ...,
        "statement": ...}``; an Arrow table's schema metadata, as JSON). NaN where the release has none: one
        that is not differentially private (its noise scale is data-derived; the description says so) or one
        made before releases had error bars (an empty description).
        """
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"k must be an integer >= 1 (how many n-grams to list), got {k!r}")
        if isinstance(order, bool) or not isinstance(order, numbers.Integral) or order < 0:
            raise ValueError(f"order must be 0 (any) or an n >= 1, got {order!r}")
        if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0 < level < 1:
            raise ValueError(f"level must be a number in (0, 1) (the intervals' coverage), got {level!r}")
        self._deps(as_arrow)  # a missing dependency fails before the RPC
        request = curator_pb2.TopNgramsRequest(
            release_id=self._id(release_id),
            k=min(int(k), _UINT32_MAX),  # more than the wire holds: as many as there are
            order=min(int(order), _UINT32_MAX),  # (refused by the curator as no such order)
            exclude_special=bool(exclude_special),
            level=float(level),
        )
        reply = self.call("TopNgrams", request)
        return self._ngram_table(reply.ngrams, as_arrow, reply)

    def probability(
        self, release_id: str | ReleaseInfo, ngrams: str | Iterable[str], as_arrow: bool = False
    ) -> pandas.DataFrame | pyarrow.Table:
        """The released probability of each n-gram (a string ``"the dog"`` or several): ngram
        (normalised spacing), order, probability (joint within its order; 0 outside the vocabulary)."""
        self._deps(as_arrow)  # a missing dependency fails before the RPC
        asked = [ngrams] if isinstance(ngrams, str) else list(ngrams)
        reply = self.call(
            "NgramProbabilities", curator_pb2.NgramProbabilitiesRequest(release_id=self._id(release_id), ngrams=asked)
        )
        return self._ngram_table(reply.ngrams, as_arrow)

    def next_word(
        self, release_id: str | ReleaseInfo, context: str, k: int = 10, as_arrow: bool = False
    ) -> pandas.DataFrame | pyarrow.Table:
        """The ``k`` most probable next words after ``context`` (preceding words separated by spaces;
        ``"<s>"`` = sentence start), most probable first: context_used (the suffix of the context the
        release conditions on, shorter when it backs off; empty = unigrams), word, probability
        (P(word | context_used) from the released joint)."""
        self._deps(as_arrow)
        reply = self.call(
            "NextWord", curator_pb2.NextWordRequest(release_id=self._id(release_id), context=context, k=int(k))
        )
        n = len(reply.words)
        return self._table(
            {
                "context_used": ([reply.context_used] * n, STRING),
                "word": ([w.ngram for w in reply.words], STRING),
                "probability": ([w.probability for w in reply.words], FLOAT64),
            },
            as_arrow,
        )

    def perplexity(self, release_id: str | ReleaseInfo, text: str) -> PerplexityResult:
        """Perplexity of ``text`` (split into sentences and words by the LAC tokeniser) under the
        release's smoothed back-off trigram model, with the token and out-of-vocabulary counts."""
        r = self.call(
            "Perplexity",
            curator_pb2.PerplexityRequest(release_id=self._id(release_id), text=text),
            self.release_timeout,
        )
        return PerplexityResult(r.perplexity, r.n_sentences, r.n_tokens, r.n_out_of_vocabulary)

    # -- budget and configuration

    def budget(self, as_arrow: bool = False) -> pandas.DataFrame | pyarrow.Table:
        """The privacy budget per accounting window (windows with stored reports or spending), one row
        each: window, window_start, window_end (UTC), spent_epsilon, spent_delta, remaining_epsilon,
        remaining_delta, budget_epsilon, budget_delta (the per-window budget; basic composition), exports (how
        many exports of privatized reports covered the window: listed, never charged; see ``exports``; where it is
        not 0 the remaining budget bounds central releases only: ``budget_summary().statement`` says how they
        compose)."""
        self._deps(as_arrow)
        b = self.call("GetBudget", curator_pb2.BudgetRequest())
        ws = b.window_seconds
        utc = dt.UTC

        def at(seconds: float) -> dt.datetime:
            return dt.datetime.fromtimestamp(seconds, utc)

        f64, n = FLOAT64, len(b.windows)
        ts = TIMESTAMP
        return self._table(
            {
                "window": ([w.window for w in b.windows], INT64),
                "window_start": ([at(w.window * ws) for w in b.windows], ts),
                "window_end": ([at((w.window + 1) * ws) for w in b.windows], ts),
                "spent_epsilon": ([w.spent_epsilon for w in b.windows], f64),
                "spent_delta": ([w.spent_delta for w in b.windows], f64),
                "remaining_epsilon": ([w.remaining_epsilon for w in b.windows], f64),
                "remaining_delta": ([w.remaining_delta for w in b.windows], f64),
                "budget_epsilon": ([b.budget_epsilon] * n, f64),
                "budget_delta": ([b.budget_delta] * n, f64),
                "exports": ([w.exports for w in b.windows], INT64),
            },
            as_arrow,
            attrs={"window_seconds": ws, "reports_per_window": b.reports_per_window},
        )

    def budget_summary(self) -> Budget:
        """The privacy budget per accounting window as a ``Budget`` (a table and its statement in a notebook,
        ``.plot()`` for a chart); ``budget`` gives the same windows as a DataFrame."""
        b = self.call("GetBudget", curator_pb2.BudgetRequest())
        return Budget(
            windows=tuple(
                WindowBudget(
                    w.window, w.spent_epsilon, w.spent_delta, w.remaining_epsilon, w.remaining_delta, w.exports
                )
                for w in b.windows
            ),
            budget_epsilon=b.budget_epsilon,
            budget_delta=b.budget_delta,
            window_seconds=b.window_seconds,
            reports_per_window=b.reports_per_window,
        )

    def exports(self, as_arrow: bool = False) -> pandas.DataFrame | pyarrow.Table:
        """Every export of privatized reports the curator's ledger lists (never charged), oldest first:
        export_id, identity (the exporter's certificate common name), exported_at (UTC), first_window,
        last_window, rows (an exact count: shown to operators and to the identity that exported, else null)."""
        self._deps(as_arrow)
        e = self.call("GetBudget", curator_pb2.BudgetRequest()).exports
        return self._table(
            {
                "export_id": ([x.export_id for x in e], STRING),
                "identity": ([x.identity for x in e], STRING),
                "exported_at": ([_timestamp(x.exported_at) for x in e], TIMESTAMP),
                "first_window": ([x.first_window for x in e], INT64),
                "last_window": ([x.last_window for x in e], INT64),
                "rows": ([x.rows if x.HasField("rows") else None for x in e], NULLABLE_INT64),
            },
            as_arrow,
        )

    def deployment(self) -> Deployment:
        """The local-privacy configuration the curator publishes to clients (``lac.common.deployment.
        Deployment``: mechanism, ε per word, embedding, L words per report, k reports per client per
        window of ``window_seconds``; ``report_epsilon0`` and ``report_guarantee().statement()``)."""
        from lac.common.errors import LacError
        from lac.common.serde import deployment_from_proto

        m = self.call("GetDeployment", reports_pb2.DeploymentRequest())
        try:
            return deployment_from_proto(m)
        except LacError as exc:
            raise AnalystError("UNKNOWN", f"the curator published an invalid deployment: {exc}") from None

    def server_version(self) -> str:
        """The curator's name and version as it publishes them with its deployment, e.g.
        ``"lac-curator 0.1.0"`` (empty from curators older than this field)."""
        return str(self.call("GetDeployment", reports_pb2.DeploymentRequest()).server_version)

    def status(self) -> CuratorStatus:
        """Operators only (an analyst's certificate gets ``PermissionDenied``): stored batches and
        reports (exact), releases, quarantined reports, rejects by reason, reports per window."""
        s = self.call("GetStatus", curator_pb2.CuratorStatusRequest())
        return CuratorStatus(
            batches=s.batches,
            reports=s.reports,
            releases=s.releases,
            quarantined=s.quarantined,
            rejects=dict(sorted(s.rejects.items())),
            reports_by_window=dict(sorted(s.reports_by_window.items())),
            budget_epsilon=s.budget_epsilon,
            budget_delta=s.budget_delta,
            replay_window_days=s.replay_window_days,
        )

    # -- exports

    def _write(self, path: str | os.PathLike, write: Callable) -> Path:
        from lac.common.files import atomic_file

        path = Path(path)
        with atomic_file(path) as f:
            write(f)
        return path

    def arpa(self, release_id: str | ReleaseInfo, path: str | os.PathLike) -> Path:
        """Write the release as an ARPA back-off language model (for KenLM, SRILM) to ``path``
        (atomically: a reader sees the old file or the complete new one); returns the path."""
        chunks = self.stream("ExportArpa", curator_pb2.ExportArpaRequest(release_id=self._id(release_id)))

        def write(f):
            for c in chunks:
                f.write(c.text.encode("utf-8"))

        return self._write(path, write)

    def export_reports(
        self, windows: int | tuple[int, int] | range, path: str | os.PathLike | None = None
    ) -> ExportedReports:
        """The privatized reports of closed accounting ``windows`` (one window, an inclusive (first, last) pair,
        or a range), if the curator's operator granted this identity export (``export_identities``; off by
        default): one row per report, its words only, in a fresh uniformly random order. Returns
        ``ExportedReports`` with the rows as a ``pyarrow.Table``, or, with ``path``, written to that Parquet file
        (streamed, bounded memory). Its ``guarantee``/``statement`` says what the rows are: local DP only (per-word
        metric DP, at most L words per report, k reports per client per window, shuffled), no central DP; the
        curator records the export with its ledger and charges nothing. Open windows: ``AnalystError``
        (FAILED_PRECONDITION); unknown ones: ``InvalidArgument``; no grant: ``PermissionDenied``."""
        if isinstance(windows, range):
            if not len(windows) or windows.step != 1:
                raise ValueError("windows: a non-empty range of consecutive windows")
            first, last = windows[0], windows[-1]
        elif isinstance(windows, tuple):
            first, last = windows
        else:
            first = last = int(windows)
        _pyarrow()
        request = curator_pb2.ExportReportsRequest(first_window=int(first), last_window=int(last))
        return read_export(self.stream("ExportReports", request), path)

    def export_parquet(self, release_id: str | ReleaseInfo, path: str | os.PathLike) -> Path:
        """Write the released distribution to a Parquet file (atomically) readable by pyarrow, pandas,
        DuckDB or Spark: columns ngram (string), order (int8), log_prob (float64), one row per n-gram
        of the release vocabulary. The key-value metadata holds the release record as JSON under
        ``"lac.release"`` (pandas ``read_parquet`` also restores it as ``df.attrs["lac.release"]``).
        Returns the path."""
        pq = _pyarrow().parquet
        table, record = self._release_table(release_id, False, True)
        meta = dict(table.schema.metadata or {})
        meta[b"PANDAS_ATTRS"] = json.dumps({PARQUET_RECORD_KEY: record.to_dict()}, allow_nan=False).encode()
        table = table.replace_schema_metadata(meta)
        return self._write(path, lambda f: pq.write_table(table, f))
