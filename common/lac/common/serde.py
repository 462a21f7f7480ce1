"""Proto ⇄ domain translations of the messages every hop shares (``reports.proto``)."""

from __future__ import annotations

from lac.common.deployment import LOCAL_MECHANISMS, Deployment
from lac.common.errors import InvalidArgument
from lac.common.v1 import reports_pb2

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
        )
    except ValueError as exc:
        raise InvalidArgument(f"invalid deployment: {exc}") from None
