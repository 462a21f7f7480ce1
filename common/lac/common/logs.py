"""Logging of the ``lac`` command: text lines (default) or JSON lines (the services' ``log_format``).

With JSON lines on the process's stderr, every line written there is JSON, not only Python's log
records: gRPC's C core (and any C library, a Python warning, a worker process's traceback) writes
to file descriptor 2 directly, so ``configure`` points descriptor 2 at a pipe read by a small relay
process (``python -m lac.common.logs``), which passes JSON lines on unchanged and writes every other
line as a JSON record of logger ``grpc.core`` (gRPC's own line format, with its level and
``source`` file:line) or ``stderr`` (anything else: a Python traceback as one record at ERROR, a fatal
interpreter error at CRITICAL, other lines at WARNING) to the original stderr. A ``serve`` that cannot start
logs why as one record at CRITICAL of logger ``lac`` (``lac.common.cli``), JSON even when the failure was in
loading the settings that asked for JSON lines. One writer keeps the
lines whole and in order; the relay ends when the last process holding the pipe does, so what gRPC
writes while the interpreter shuts down is relayed too. Structured values go in ``extra=`` and come
out as keys of the object.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import signal
import subprocess
import sys
from typing import Any, TextIO

__all__ = ["LOG_FORMATS", "JsonFormatter", "configure"]

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, then the
    record's extra fields (``log.info(..., extra={"batch_id": b})``) and ``exception`` / ``stack`` text."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out.setdefault(key, value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure(
    log_format: str = "text", verbose: bool = False, stream: TextIO | None = None, route_stderr: bool | None = None
) -> None:
    """Log to ``stream`` (default stderr) as ``log_format`` lines, at DEBUG if ``verbose`` else INFO,
    replacing the root logger's handlers. ``route_stderr`` (default: JSON lines to the process's stderr)
    also turns everything else written to file descriptor 2 into JSON records (see the module docstring)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    if route_stderr is None:
        route_stderr = log_format == "json" and stream is None
    if route_stderr:
        _route_stderr()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], force=True)


# gRPC's C core (absl) logs "E1125 17:20:01.123456   4242 chttp2_server.cc:1234] message".
_NATIVE = re.compile(r"^([IWEF])\d{4} \d{2}:\d{2}:\d{2}\.\d+\s+\d+ ([^\s\]]+:\d+)\] ?(.*)$")
_NATIVE_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_TRACEBACK = "Traceback (most recent call last):"
_FATAL = "Fatal Python error:"
_relay: subprocess.Popen[bytes] | None = None


def native_record(line: str, now: float | None = None) -> dict[str, Any]:
    """The JSON record of one line written to stderr outside Python's logging: logger ``grpc.core`` for
    gRPC's C core (its level, and ``source``: file:line), else logger ``stderr`` at WARNING."""
    when = dt.datetime.now(dt.UTC) if now is None else dt.datetime.fromtimestamp(now, dt.UTC)
    out: dict[str, Any] = {"time": when.isoformat(timespec="milliseconds")}
    m = _NATIVE.match(line)
    if m is not None:
        out.update(level=_NATIVE_LEVELS[m.group(1)], logger="grpc.core", message=m.group(3), source=m.group(2))
    elif line.startswith(_ABSL_NOTICE):
        out.update(level="WARNING", logger="grpc.core", message=line)
    elif line.startswith(_FATAL):
        out.update(level="CRITICAL", logger="stderr", message=line)
    else:
        out.update(level="WARNING", logger="stderr", message=line)
    return out


def traceback_record(lines: list[str], now: float | None = None) -> dict[str, Any]:
    """The JSON record of a Python traceback written to stderr (a worker process's, say): level ERROR, logger
    ``stderr``, the exception's line (the last) as ``message`` and the whole traceback as ``exception``."""
    return {**native_record(lines[-1], now), "level": "ERROR", "exception": "\n".join(lines)}


def relay_line(line: str) -> str:
    """``line`` as the relay writes it: a JSON object as it is, anything else as ``native_record`` JSON."""
    if line.startswith("{"):
        try:
            if isinstance(json.loads(line), dict):
                return line
        except ValueError:
            pass
    return json.dumps(native_record(line), ensure_ascii=False)


def relay(source: TextIO, sink: TextIO) -> None:
    """Copy ``source`` to ``sink`` line by line through ``relay_line`` until ``source`` ends; the lines of a Python
    traceback (from its first line to the exception's, the first one not indented) become one ``traceback_record``."""
    traceback: list[str] = []

    def write(record: str) -> None:
        sink.write(record + "\n")
        sink.flush()

    for raw in source:
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        if traceback:
            if line.startswith("{") or _NATIVE.match(line):  # another writer's line: the traceback was cut short
                write(json.dumps(traceback_record(traceback), ensure_ascii=False))
                traceback = []
            else:
                traceback.append(line)
                if not line.startswith((" ", "\t")):  # the exception's own line ends it
                    write(json.dumps(traceback_record(traceback), ensure_ascii=False))
                    traceback = []
                continue
        if line.startswith(_TRACEBACK):
            traceback = [line]
        else:
            write(relay_line(line))
    if traceback:
        write(json.dumps(traceback_record(traceback), ensure_ascii=False))


def _route_stderr() -> None:
    """Point file descriptor 2 at a pipe read by the relay process (once per process)."""
    global _relay
    if _relay is not None:
        return
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    try:
        _relay = subprocess.Popen(
            [sys.executable, "-m", "lac.common.logs"],
            stdin=read_end,
            stdout=2,  # the original stderr
            stderr=2,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C in a terminal reaches the server, which logs its shutdown here
        )
    finally:
        os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)


if __name__ == "__main__":  # the relay: ends when every writer of the pipe has closed it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    relay(
        open(0, encoding="utf-8", errors="replace", closefd=False),  # noqa: SIM115 - the process's stdin
        open(1, "w", encoding="utf-8", errors="replace", closefd=False),  # noqa: SIM115 - and stdout
    )
