"""A dependency-free progress line for long steps (stderr; one line when not a terminal)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Counts steps of a long task and writes a throttled progress line to ``stream`` (stderr)."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None, min_interval: float = 0.2) -> None:
        self.label, self.total = label, max(total, 1)
        self.stream = stream or sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.done = 0
        self.start = self._last = time.perf_counter()
        self.min_interval = min_interval
        self._last_pct = -10

    def update(self, n: int = 1) -> None:
        """Count ``n`` more steps; redraw the line (terminal, throttled) or log every 25% (otherwise)."""
        self.done += n
        now = time.perf_counter()
        pct = 100 * self.done // self.total
        if self.tty and now - self._last >= self.min_interval:
            self._last = now
            self.stream.write(f"\r  {self.label}: {self.done}/{self.total} ({pct}%) {now - self.start:.1f}s")
            self.stream.flush()
        elif not self.tty and pct >= self._last_pct + 25:
            self._last_pct = pct
            self.stream.write(f"  {self.label}: {self.done}/{self.total} ({pct}%)\n")
            self.stream.flush()

    def close(self) -> None:
        """Write the final line: steps done and elapsed time."""
        elapsed = time.perf_counter() - self.start
        end = "\r" if self.tty else ""
        self.stream.write(f"{end}  {self.label}: {self.done}/{self.total} done in {elapsed:.1f}s\n")
        self.stream.flush()
