"""Argument checks shared by every component: whole numbers here (ε and δ: ``lac.common.privacy``'s
``check_epsilon`` and ``check_delta``)."""

from __future__ import annotations

from numbers import Integral

__all__ = ["check_int"]


def check_int(value: object, name: str, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an int if it is a whole number (not a bool; numpy integers too) in [``minimum``,
    ``maximum``], else ValueError "<name> must be an integer >= <minimum>, got <value>"."""
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and int(value) > maximum:
        raise ValueError(f"{name} must be an integer in [{minimum}, {maximum}], got {value!r}")
    return int(value)
