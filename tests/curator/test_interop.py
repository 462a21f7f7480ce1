"""The curator's segments are the input table other DP libraries take: one privacy id per report.

Here PipelineDP (its pure-Python LocalBackend) reads the stored Parquet segments as a dataset and
counts, per public n-gram, the reports that contain it, with its own Laplace mechanism and
contribution bounding, the privacy id being (segment file, ``report``). Tumult Analytics would
take the same table through ``Session.from_dataframe(..., protected_change=AddRowsWithID("id"))``
after ``spark.read.parquet(<segments directory>)``.
"""

from __future__ import annotations

import numpy as np
import pipeline_dp
import pyarrow.compute as pc
import pyarrow.dataset as ds

from lac.curator.base.ngrams import report_items
from lac.curator.store import segments

REPORTS = [
    [["the", "cat", "sat"], ["the", "dog"]],
    [["the", "cat"]],
    [["a", "dog", "ran"]],
    [["the", "cat", "ran", "the", "cat"]],
    [["a", "cat"]],
]


def _segments_dir(tmp_path):
    root = tmp_path / "segments"
    for k, (first, batch) in enumerate([(0, REPORTS[:3]), (1, REPORTS[3:])]):
        segments.write(
            root / segments.segment_name(f"b{k}", 100 + first),
            report_items(batch, 2),
            {"batch_id": f"b{k}", "first_window": 100 + first, "last_window": 100 + first},
        )
    return root


def _rows(root):
    """Every row of every segment, with the file as part of the privacy id (reports never span files)
    and the window from the Hive-style partition directory."""
    data = ds.dataset(root, format="parquet", partitioning="hive")
    out = []
    for fragment in data.get_fragments():
        t = fragment.to_table()
        window = ds.get_partition_keys(fragment.partition_expression)["window"]
        for report, ngram, count in zip(
            t.column("report").to_pylist(), t.column("ngram").to_pylist(), t.column("count").to_pylist()
        ):
            out.append({"id": (fragment.path, report), "ngram": ngram, "count": count, "window": window})
    return out


def test_segments_read_as_one_partitioned_dataset(tmp_path):
    root = _segments_dir(tmp_path)
    data = ds.dataset(root, format="parquet", partitioning="hive")
    t = data.to_table()
    assert set(t.schema.names) == {"report", "pos", "ngram", "count", "window"}  # no words (issue 34 item 6)
    assert sorted(set(t.column("window").to_pylist())) == [100, 101]
    rows = _rows(root)
    assert len({r["id"] for r in rows}) == len(REPORTS)  # one privacy id per report
    cat = pc.sum(pc.equal(t.column("ngram").cast("string"), "the cat")).as_py()
    assert cat == 3  # reports containing "the cat" (a row per distinct n-gram per report)


def test_pipelinedp_counts_reports_per_ngram_from_the_segments(tmp_path):
    rows = _rows(_segments_dir(tmp_path))
    public = ["the cat", "a dog", "the", "never seen"]
    exact = {p: len({r["id"] for r in rows if r["ngram"] == p}) for p in public}
    assert exact == {"the cat": 3, "a dog": 1, "the": 3, "never seen": 0}

    def run(epsilon):
        accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=0)
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
        params = pipeline_dp.AggregateParams(
            noise_kind=pipeline_dp.NoiseKind.LAPLACE,
            metrics=[pipeline_dp.Metrics.PRIVACY_ID_COUNT],
            max_partitions_contributed=8,
            max_contributions_per_partition=1,
        )
        extractors = pipeline_dp.DataExtractors(
            partition_extractor=lambda r: r["ngram"],
            privacy_id_extractor=lambda r: r["id"],
            value_extractor=lambda r: 0,
        )
        result = engine.aggregate(rows, params, extractors, public_partitions=public)
        accountant.compute_budgets()
        return {key: m.privacy_id_count for key, m in result}

    released = run(1e5)  # negligible noise (scale 8e-5): the released counts are the exact ones
    assert set(released) == set(public)
    assert all(abs(released[p] - exact[p]) < 0.05 for p in public)
    noisy = run(0.5)  # the real setting: Laplace noise of scale 8 / 0.5 per partition
    assert set(noisy) == set(public) and any(abs(noisy[p] - exact[p]) > 0.05 for p in public)


def _map_words_reference(items, words):
    """map_words spelled out in plain Python: unknown words read as <unk>, equal n-grams merged per report
    at their first occurrence, the mapped n-grams numbered in sorted order."""
    from lac.common.text import BOS, EOS, UNK

    known = words | {BOS, EOS, UNK}
    mapped = [" ".join(w if w in known else UNK for w in it.split(" ")) for it in items.items]
    if mapped == list(items.items):
        return items.indptr, items.item_ids, items.counts, items.items
    names = sorted(set(mapped))
    index = {name: i for i, name in enumerate(names)}
    indptr, ids, counts = [0], [], []
    for r in range(items.n_reports):
        merged: dict[int, int] = {}
        for j in range(items.indptr[r], items.indptr[r + 1]):
            k = index[mapped[items.item_ids[j]]]
            merged[k] = merged.get(k, 0) + int(items.counts[j])
        ids += merged
        counts += merged.values()
        indptr.append(len(ids))
    return np.array(indptr), np.array(ids), np.array(counts), tuple(names)


def test_map_words_matches_its_plain_python_reading():
    """The vectorized map_words (Arrow) against the plain reading, on random reports with unknown,
    special and non-ASCII words (sorted order must be code-point order)."""
    from lac.curator.base.ngrams import ReportItems, item_names
    from lac.curator.store.segments import map_words

    rng = np.random.default_rng(5)
    vocab = [f"w{i}" for i in range(60)] + ["é", "ünï", "z"]
    other = [f"x{i}" for i in range(40)] + ["ß", "日本", "a", "<s>", "</s>", "<unk>"]
    pool = vocab + other
    for _ in range(100):
        items = sorted(
            {" ".join(rng.choice(pool, size=int(rng.integers(1, 4)))) for _ in range(int(rng.integers(1, 80)))}
        )
        lens = rng.integers(0, min(len(items), 12) + 1, size=int(rng.integers(0, 15)))
        ids = [rng.choice(len(items), size=int(k), replace=False) for k in lens]
        block = ReportItems(
            np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
            np.concatenate(ids).astype(np.int32) if ids else np.empty(0, np.int32),
            rng.integers(1, 5, size=int(lens.sum())).astype(np.int32),
            tuple(items),
        )
        got = map_words(block, frozenset(vocab))
        want = _map_words_reference(block, frozenset(vocab))
        assert np.array_equal(got.indptr, want[0]) and np.array_equal(got.item_ids, want[1])
        assert np.array_equal(got.counts, want[2]) and item_names(got.items) == want[3]
