"""The release policy's cut of a release into batches (``lac.shuffler.policy``): at most ``max_batch_bytes``
each, and never a batch below the release threshold."""

from __future__ import annotations

from lac.shuffler.policy import Row, chunks, select_batch


def _rows(sizes: list[int]) -> list[Row]:
    return [Row(seq=i, client=bytes([i % 256, i // 256]), window=0, crowd=None, size=s) for i, s in enumerate(sizes)]


def test_a_cut_release_leaves_no_batch_below_the_threshold():
    # 103 reports of 100 bytes, at most 2,000 bytes a batch: the plain cut by bytes ends in a batch of 3.
    assert [hi - lo for lo, hi in chunks([100] * 103, 2000)] == [20, 20, 20, 20, 20, 3]
    for _ in range(20):  # any permutation: every report of the same size
        sel = select_batch(_rows([100] * 103), threshold=10, max_batch_bytes=2000)
        sizes = [len(p) for p in sel.parts]
        assert sizes == [20, 20, 20, 20, 13, 10], sizes  # the last borrows 7: both within the byte limit
        assert sorted(s for p in sel.parts for s in p) == list(range(103))


def test_the_last_batch_borrows_from_the_one_before_or_is_merged_into_it():
    # The last part of 5 entries borrows 5 from the previous part (both stay within 2,000 bytes).
    assert chunks([100] * 45, 2000, min_count=10) == [(0, 20), (20, 35), (35, 45)]
    # The previous part cannot spare them (10 + 2 < 2 x 10): the two become one part, over the byte limit
    # (52 reports cannot make 6 parts of at least 10).
    assert chunks([100] * 52, 1000, min_count=10) == [(0, 10), (10, 20), (20, 30), (30, 40), (40, 52)]
    # A threshold's entries do not fit in the limit: parts close only once they hold the threshold.
    assert chunks([300] * 25, 1000, min_count=10) == [(0, 10), (10, 25)]
    # Below the threshold in all (sub-sampling or the crowd threshold dropped reports): one part.
    assert chunks([100] * 7, 1000, min_count=10) == [(0, 7)]
    assert chunks([100] * 15, 1000, min_count=20) == [(0, 15)]
    assert chunks([100] * 30, 1000) == [(0, 10), (10, 20), (20, 30)]  # min_count 1: the plain cut by bytes
