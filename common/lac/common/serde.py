"""Proto ⇄ domain translations of the messages more than one role reads: the deployment (``reports.proto``,
every hop) and an export's local guarantee (``curator.proto``: the curator writes it, the analyst reads it)."""

from __future__ import annotations

from lac.common.deployment import LOCAL_MECHANISMS, Deployment
from lac.common.errors import InvalidArgument
from lac.common.privacy import LocalGuarantee, WindowShuffle
from lac.common.v1 import curator_pb2, reports_pb2

_MECHANISM_NAMES = {v: k for k, v in LOCAL_MECHANISMS.items()}


def mechanism_id(name: str) -> int:
    """The wire id of a local mechanism name (InvalidArgument if unknown)."""
    try:
        return LOCAL_MECHANISMS[name]
    except KeyError:
        raise InvalidArgument(f"unknown local mechanism {name!r}") from None


def mechanism_name(wire_id: int) -> str | None:
    """The local mechanism name of a wire id (None for unspecified or unknown ids)."""
    return _MECHANISM_NAMES.get(wire_id)


def deployment_to_proto(d: Deployment, server_version: str = "") -> reports_pb2.Deployment:
    """The wire form of a deployment (as the curator publishes it), with the answering server's
    ``server_version`` (``lac.common.version.server_version``; not part of the deployment itself)."""
    return reports_pb2.Deployment(
        # the generated stub types enum fields as the enum class only; protobuf takes the plain int id
        mechanism=mechanism_id(d.mechanism),  # type: ignore[arg-type]
        epsilon_per_word=d.epsilon_per_word,
        embedding=d.embedding,
        word_distance_bound=d.word_distance_bound,
        max_report_words=d.max_report_words,
        reports_per_window=d.reports_per_window,
        window_seconds=d.window_seconds,
        report_epsilon0=d.report_epsilon0,
        server_version=server_version,
        key_ids=d.key_ids,
        period_seconds=d.period_seconds,
        windows_per_period=d.windows_per_period,
        exact_epsilon=d.exact_epsilon,
    )


def deployment_from_proto(m: reports_pb2.Deployment) -> Deployment:
    """The domain value of a published deployment (InvalidArgument if it is not a valid one)."""
    name = mechanism_name(m.mechanism)
    if name is None:
        raise InvalidArgument(f"deployment names unknown local mechanism id {m.mechanism}")
    try:
        return Deployment(
            mechanism=name,
            epsilon_per_word=m.epsilon_per_word,
            embedding=m.embedding,
            word_distance_bound=m.word_distance_bound,
            max_report_words=m.max_report_words,
            reports_per_window=m.reports_per_window,
            window_seconds=m.window_seconds,
            key_ids=tuple(m.key_ids),
            period_seconds=m.period_seconds or Deployment.period_seconds,
            windows_per_period=m.windows_per_period,
            exact_epsilon=m.exact_epsilon,
        )
    except ValueError as exc:
        raise InvalidArgument(f"invalid deployment: {exc}") from None


def local_guarantee_message(g: LocalGuarantee) -> curator_pb2.LocalGuarantee:
    """The typed guarantee on the wire, with its statement."""
    return curator_pb2.LocalGuarantee(
        mechanism=g.mechanism,
        epsilon_per_word=g.epsilon_per_word,
        embedding=g.embedding,
        word_distance_bound=g.word_distance_bound,
        max_report_words=g.max_report_words,
        reports_per_window=g.reports_per_window,
        window_seconds=g.window_seconds,
        first_window=g.first_window,
        last_window=g.last_window,
        rows=g.rows,
        shuffles=[
            curator_pb2.WindowShuffle(
                window=s.window,
                batches=s.batches,
                reports=s.reports,
                smallest_batch=s.smallest_batch,
                epsilon=s.epsilon,
                delta=s.delta,
                amplified=s.amplified,
                method=s.method,
                unverified=s.unverified,
            )
            for s in g.shuffles
        ],
        statement=g.statement(),
    )


def local_guarantee_from_proto(m: curator_pb2.LocalGuarantee) -> LocalGuarantee:
    """The typed guarantee back from the wire (ValueError if its fields are not a valid guarantee)."""
    return LocalGuarantee(
        mechanism=m.mechanism,
        epsilon_per_word=m.epsilon_per_word,
        embedding=m.embedding,
        word_distance_bound=m.word_distance_bound,
        max_report_words=m.max_report_words,
        reports_per_window=m.reports_per_window,
        window_seconds=m.window_seconds,
        first_window=m.first_window,
        last_window=m.last_window,
        rows=m.rows,
        shuffles=tuple(
            WindowShuffle(
                s.window,
                s.batches,
                s.reports,
                s.smallest_batch,
                s.epsilon,
                s.delta,
                s.amplified,
                s.method,
                s.unverified,
            )
            for s in m.shuffles
        ),
    )
