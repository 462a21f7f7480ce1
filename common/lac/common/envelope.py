"""Sealing report content for the curator and opening it again.

Only the plaintext encoding exists so far: it is labelled INSECURE on the wire because
the shuffler could read it. HPKE sealing to the curator's key replaces it (issue 4).
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from lac.common.errors import InvalidArgument
from lac.common.v1 import reports_pb2

REPORT_ID_BYTES = 16


def seal(content: reports_pb2.ReportContent) -> reports_pb2.SealedPayload:
    return reports_pb2.SealedPayload(
        encoding=reports_pb2.PAYLOAD_ENCODING_PLAINTEXT_INSECURE, data=content.SerializeToString())


def open_payload(sealed: reports_pb2.SealedPayload) -> reports_pb2.ReportContent:
    """The report content, or InvalidArgument naming what is wrong."""
    if sealed.encoding != reports_pb2.PAYLOAD_ENCODING_PLAINTEXT_INSECURE:
        raise InvalidArgument(f"unsupported payload encoding {sealed.encoding}")
    content = reports_pb2.ReportContent()
    try:
        content.ParseFromString(sealed.data)
    except DecodeError as exc:
        raise InvalidArgument(f"payload is not a ReportContent: {exc}") from None
    if len(content.report_id) != REPORT_ID_BYTES:
        raise InvalidArgument(f"report_id must be {REPORT_ID_BYTES} bytes, got {len(content.report_id)}")
    return content
