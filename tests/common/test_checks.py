"""lac.common.checks.check_int: the one whole-number check of every component."""

from __future__ import annotations

import numpy as np
import pytest

from lac.common.checks import check_int


def test_accepts_whole_numbers_in_range():
    assert check_int(3, "k") == 3 and type(check_int(np.int64(3), "k")) is int
    assert check_int(0, "n", minimum=0) == 0
    assert check_int(200, "k", 1, 200) == 200


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "3", None, np.float64(3)])
def test_refuses_with_one_message(bad):
    with pytest.raises(ValueError) as e:
        check_int(bad, "k")
    assert str(e.value) == f"k must be an integer >= 1, got {bad!r}"
    with pytest.raises(ValueError):
        check_int(bad, "k")


def test_refuses_above_the_maximum():
    with pytest.raises(ValueError, match=r"^k must be an integer in \[1, 200\], got 201$"):
        check_int(201, "k", 1, 200)
