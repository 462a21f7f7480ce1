"""Export of privatized reports (issue 22, item 2): the words kept in segments, the uniform order with
bounded memory, the typed guarantee, the grant per identity over real mTLS, the errors, the ledger, the
CLI, and backup/restore carrying the exports."""

from __future__ import annotations

import itertools
import json
import math
import time
from collections import Counter

import grpc
import numpy as np
import pyarrow.parquet as pq
import pytest
from lac_testkit import DEPLOYMENT, Pki, batch_privacy, content, mtls_curator_with_reports, run_lac

from lac.analyst.client import CuratorClient
from lac.analyst.client import FailedPrecondition as Refused
from lac.common import envelope, tls
from lac.common.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from lac.common.privacy import VACUOUS_EPSILON, LocalGuarantee
from lac.common.rpc import Role
from lac.common.v1 import curator_pb2, curator_pb2_grpc
from lac.curator.base.ngrams import item_names, report_items
from lac.curator.service.handlers import status
from lac.curator.store import export
from lac.curator.store import segments as seg
from lac.curator.store.store import CuratorStore

TEXTS = [
    ["the", "dog", "sleeps", "in", "the", "sun"],
    ["the", "fox", "is", "a", "small", "animal"],
    ["we", "walk", "the", "dog"],
    ["the", "sun", "is", "a", "star"],
]
# a settled window: closed for more than the default shuffler_release_interval_seconds + forward_horizon_seconds
CLOSED = DEPLOYMENT.window(time.time()) - 3
IDENTITIES = ("shuffler", "analyst", "operator", "exporter", "intruder")


def _words_files(root, reports_per_batch, rng):
    """The words files of batches of random reports (1-6 words), numbered words so rows are distinct."""
    paths, k = [], 0
    for i, n in enumerate(reports_per_batch):
        reps = []
        for _ in range(n):
            reps.append([[f"w{k}", *(f"x{int(x)}" for x in rng.integers(0, 50, size=int(rng.integers(0, 5))))]])
            k += 1
        path = root / f"window=0/s{i}.parquet"
        assert export.write_words(path, report_items(reps, 3).texts) == n
        paths.append(path)
    return paths


def _rows(shuffled: export.ShuffledReports) -> list[tuple[str, ...]]:
    return [tuple(w) for col in shuffled.chunks(chunk_bytes=64) for w in col.to_pylist()]


# -- storage and the order of the rows ---------------------------------------------------------------


def test_a_words_file_keeps_each_reports_words_once_and_segments_none(tmp_path):
    reps = [[["a", "b", "a"], ["c"]], [], [["d"]], [[]]]
    items = report_items(reps, 3)
    assert export.write_words(tmp_path / "w.parquet", items.texts) == 2
    col = pq.read_table(tmp_path / "w.parquet").column("words").to_pylist()
    assert col == [["a", "b", "a", "c"], ["d"]]  # empty reports have no row
    seg.write(tmp_path / "s.parquet", items, {"batch_id": "b"})  # the segment: n-grams only
    assert not seg.has_words(tmp_path / "s.parquet")
    back = seg.read(tmp_path / "s.parquet")
    assert back.texts is None and back.n_reports == 4 and "a b a" in item_names(back.items)


@pytest.mark.parametrize("bucket_rows", [10_000, 7])  # one bucket in memory; several spooled to disk
def test_every_row_exactly_once_in_a_fresh_order(tmp_path, bucket_rows):
    rng = np.random.default_rng(3)
    paths = _words_files(tmp_path, [40, 1, 25, 0, 30], rng)
    stored = [tuple(w) for p in paths for w in pq.read_table(p).column("words").to_pylist()]
    orders = []
    for _ in range(2):
        with export.ShuffledReports(paths, rng, len(stored), tmp_path / "spool", bucket_rows) as s:
            assert s.rows == len(stored) and (s.buckets > 1) == (bucket_rows == 7)
            rows = _rows(s)
        assert Counter(rows) == Counter(stored)
        orders.append(rows)
    assert orders[0] != stored and orders[0] != orders[1]
    spool = tmp_path / "spool"
    assert not spool.exists() or not any(spool.iterdir())  # the spool is gone after each export


@pytest.mark.slow
@pytest.mark.parametrize("bucket_rows", [100, 2])
def test_the_order_is_a_uniform_permutation(tmp_path, bucket_rows):
    """All 4! orders of 4 reports in 2 segments (two batches) are equally likely, spooled or not:
    chi-square over 4,800 exports; and the two reports of one batch are adjacent 1/2 of the time, as in a
    uniform permutation (a per-segment shuffle in a random segment order would make it always)."""
    rng = np.random.default_rng(11)
    paths = _words_files(tmp_path, [2, 2], rng)
    trials = 4800
    seen: Counter = Counter()
    adjacent = 0
    for _ in range(trials):
        with export.ShuffledReports(paths, rng, 4, tmp_path / "spool", bucket_rows) as s:
            order = tuple(int(r[0][1:]) for r in _rows(s))
        seen[order] += 1
        adjacent += abs(order.index(0) - order.index(1)) == 1
    assert set(seen) == set(itertools.permutations(range(4)))
    expected = trials / 24
    chi2 = sum((seen[p] - expected) ** 2 / expected for p in itertools.permutations(range(4)))
    assert chi2 < 49.7  # 23 degrees of freedom: the 0.999 quantile is 49.73
    assert abs(adjacent / trials - 0.5) < 4 * math.sqrt(0.25 / trials)


# -- the guarantee -----------------------------------------------------------------------------------


def _privacy(n, *, window=CLOSED, amplified=False, eps=None, eps0=DEPLOYMENT.report_epsilon0):
    p = batch_privacy(n, window=window)
    p.report_epsilon0 = eps0
    p.amplified = amplified
    p.central_epsilon = eps0 if eps is None else eps
    p.delta = 1e-6 if amplified else 0.0
    p.method = "numerical" if amplified else "none"
    return p.SerializeToString()


def test_the_guarantee_is_local_only_and_says_when_its_bounds_are_vacuous():
    batches = [(CLOSED, CLOSED, 500, _privacy(500)), (CLOSED, CLOSED, 40, _privacy(40))]
    g = export.local_guarantee(
        DEPLOYMENT, CLOSED, CLOSED, 540, export.window_shuffles(batches, CLOSED, CLOSED, DEPLOYMENT)
    )
    (w,) = g.shuffles
    assert (w.batches, w.reports, w.smallest_batch, w.amplified) == (2, 540, 40, False)
    assert g.report_epsilon0 == pytest.approx(40 * 8 * DEPLOYMENT.word_distance_bound) and g.vacuous
    text = g.statement()
    for phrase in (
        "local differential privacy only",
        "NOT a central differential-privacy release",
        "charged nothing",
        "ε = 8 per unit of distance",
        "at most 40 words",
        "vacuous",
        "at most 1 report per accounting window",
        "no amplification",
        "uniformly random order",
        "Central releases over these windows compose with it",  # issue 34 item 1
    ):
        assert phrase in text, phrase
    # small ε per word and short reports: ε0 below the vacuous level, amplified by the shuffler's accountant
    small = DEPLOYMENT.__class__(epsilon_per_word=0.05, max_report_words=2, word_distance_bound=2.0)
    batches = [(CLOSED, CLOSED, 10_000, _privacy(10_000, amplified=True, eps=0.02, eps0=small.report_epsilon0))]
    g = export.local_guarantee(small, CLOSED, CLOSED, 10_000, export.window_shuffles(batches, CLOSED, CLOSED, small))
    assert g.report_epsilon0 < VACUOUS_EPSILON and not g.vacuous and g.amplified
    assert "vacuous" not in g.statement() and "(0.02, 1e-06)-DP" in g.statement()
    # a statement computed for a smaller ε0 than the deployment's overstates the amplification: not counted
    batches = [(CLOSED, CLOSED, 10_000, _privacy(10_000, amplified=True, eps=0.02, eps0=0.01))]
    (w,) = export.window_shuffles(batches, CLOSED, CLOSED, small)
    assert not w.amplified and w.unverified == 1 and w.epsilon == small.report_epsilon0


def test_the_grant_and_the_windows_are_checked():
    with pytest.raises(PermissionDenied, match="off on this curator.*export_identities"):
        export.check_grant(frozenset(), frozenset(Role))
    with pytest.raises(PermissionDenied, match="grants it by adding"):
        export.check_grant(frozenset({"exporter"}), frozenset({Role.ANALYST}))
    export.check_grant(frozenset({"exporter"}), frozenset({Role.EXPORT}))
    now = (CLOSED + 2.5) * DEPLOYMENT.window_seconds
    for first, last in ((-1, 3), (5, 4), (CLOSED, CLOSED + 3)):
        with pytest.raises(InvalidArgument):
            export.check_windows(first, last, DEPLOYMENT, now)
    with pytest.raises(FailedPrecondition, match="still open"):
        export.check_windows(CLOSED, CLOSED + 2, DEPLOYMENT, now)
    export.check_windows(CLOSED, CLOSED + 1, DEPLOYMENT, now)
    # issue 34 item 3: closed half a window ago; settled only once closed for longer than the settling time
    half = DEPLOYMENT.window_seconds / 2
    with pytest.raises(FailedPrecondition, match="not settled"):
        export.check_windows(CLOSED, CLOSED + 1, DEPLOYMENT, now, settle_seconds=half + 1)
    export.check_windows(CLOSED, CLOSED + 1, DEPLOYMENT, now, settle_seconds=half - 1)


# -- over a real mTLS server ---------------------------------------------------------------------------


@pytest.fixture
def exporting_curator(start_curator, tmp_path, curator_public_key):
    """A curator with mTLS (export granted to "exporter") holding 30 sealed reports of a closed window in two
    batches and 3 of the current (open) window; returns (server, pki)."""
    pki = Pki(tmp_path / "pki", ("curator", *IDENTITIES))
    cert, key = pki.pem("curator")
    cur = start_curator(insecure=False, tls_cert=cert, tls_key=key, tls_client_ca=pki.ca, export_identities="exporter")
    with tls.channel(cur.address, pki.client_tls("shuffler")) as ch:
        stub = curator_pb2_grpc.CuratorIngestStub(ch)
        for batch_id, n, window in (("b1", 18, CLOSED), ("b2", 12, CLOSED), ("b3", 3, None)):
            reply = stub.IngestBatch(
                curator_pb2.IngestBatchRequest(
                    batch_id=batch_id,
                    reports=[envelope.seal(content(TEXTS[i % 4]), curator_public_key) for i in range(n)],
                    privacy=batch_privacy(n, window=window),
                ),
                timeout=30,
            )
            assert reply.accepted == n
    return cur, pki


def _client(cur, pki, who):
    cert, key = pki.pem(who)
    return CuratorClient(cur.address, ca=pki.ca, cert=cert, key=key)


def test_every_identity_against_export(exporting_curator):
    """Only the granted identity exports; the analyst and the operator need the grant too; the ingest identity
    and an identity in no role are refused before the request is read."""
    cur, pki = exporting_curator
    codes = {}
    for who in IDENTITIES:
        with tls.channel(cur.address, pki.client_tls(who)) as ch:
            try:
                stream = curator_pb2_grpc.CuratorStub(ch).ExportReports(
                    curator_pb2.ExportReportsRequest(first_window=CLOSED, last_window=CLOSED), timeout=30
                )
                codes[who] = (grpc.StatusCode.OK, len(list(stream)))
            except grpc.RpcError as exc:
                codes[who] = (exc.code(), exc.details())
    assert codes["exporter"][0] == grpc.StatusCode.OK and codes["exporter"][1] >= 2
    for who in ("shuffler", "analyst", "operator", "intruder"):
        assert codes[who][0] == grpc.StatusCode.PERMISSION_DENIED, (who, codes[who])
    assert "export_identities" in codes["analyst"][1] and "export_identities" in codes["operator"][1]


def test_export_end_to_end_with_its_guarantee_and_the_ledger(exporting_curator, tmp_path):
    cur, pki = exporting_curator
    with _client(cur, pki, "exporter") as c:
        got = c.export_reports(CLOSED)
        written = c.export_reports((CLOSED, CLOSED), path=tmp_path / "reports.parquet")
    assert got.rows == 30 and got.table.num_rows == 30 and got.table.column_names == ["words"]
    assert Counter(tuple(w) for w in got.table.column("words").to_pylist()) == Counter(
        tuple(TEXTS[i % 4]) for i in [*range(18), *range(12)]
    )
    assert isinstance(got.guarantee, LocalGuarantee) and got.statement == got.guarantee.statement()
    assert "NOT a central differential-privacy release" in got.statement and got.guarantee.rows == 30
    (w,) = got.guarantee.shuffles
    assert (w.window, w.batches, w.reports) == (CLOSED, 2, 30)
    meta = pq.read_schema(written.path).metadata
    assert json.loads(meta[b"lac.export.guarantee"])["rows"] == 30
    assert meta[b"lac.export.statement"].decode() == written.statement
    assert pq.read_table(written.path).num_rows == 30 and sorted(written.texts()) == sorted(got.texts())
    with _client(cur, pki, "operator") as c:  # listed with the ledger, nothing charged
        exports = c.exports(as_arrow=True).to_pylist()
        budget = c.budget(as_arrow=True).to_pylist()
    assert [(e["identity"], e["first_window"], e["last_window"], e["rows"]) for e in exports] == [
        ("exporter", CLOSED, CLOSED, 30)
    ] * 2
    row = next(b for b in budget if b["window"] == CLOSED)
    assert row["exports"] == 2 and row["spent_epsilon"] == 0.0


def test_export_errors_have_their_status_codes(exporting_curator):
    cur, pki = exporting_curator
    current = DEPLOYMENT.window(time.time())
    with tls.channel(cur.address, pki.client_tls("exporter")) as ch:
        stub = curator_pb2_grpc.CuratorStub(ch)
        for request, code, fragment in (
            (dict(first_window=CLOSED, last_window=current), grpc.StatusCode.FAILED_PRECONDITION, "still open"),
            (dict(first_window=-3, last_window=CLOSED), grpc.StatusCode.INVALID_ARGUMENT, "count from 0"),
            (dict(first_window=CLOSED - 5, last_window=CLOSED - 4), grpc.StatusCode.INVALID_ARGUMENT, "no reports"),
            (dict(first_window=CLOSED), grpc.StatusCode.INVALID_ARGUMENT, "last_window"),
            (dict(first_window=CLOSED, last_window=current + 9), grpc.StatusCode.INVALID_ARGUMENT, "after the current"),
        ):
            with pytest.raises(grpc.RpcError) as exc:
                list(stub.ExportReports(curator_pb2.ExportReportsRequest(**request), timeout=30))
            assert exc.value.code() == code and fragment in exc.value.details(), (request, exc.value.details())
    assert not cur.curator.store.exports()  # a refused export is not recorded


def test_export_is_off_by_default(start_curator):
    cur = start_curator()  # insecure (every caller has every role), export_identities empty
    with grpc.insecure_channel(cur.address) as ch:
        with pytest.raises(grpc.RpcError) as exc:
            list(
                curator_pb2_grpc.CuratorStub(ch).ExportReports(
                    curator_pb2.ExportReportsRequest(first_window=CLOSED, last_window=CLOSED), timeout=30
                )
            )
    assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED and "--export-identities" in exc.value.details()


def test_cli_export_prints_the_guarantee_and_budget_lists_it(exporting_curator, tmp_path, capsys):
    cur, pki = exporting_curator
    out = tmp_path / "cli.parquet"
    cert, key = pki.pem("exporter")
    tls_flags = ["--server", cur.address, "--ca", pki.ca, "--cert", cert, "--key", key]
    code, stdout, err = run_lac(capsys, "curator", "export", "--window", str(CLOSED), "--out", str(out), *tls_flags)
    assert code == 0, err
    assert f"wrote {out}: 30 privatized reports" in stdout and "local differential privacy only" in stdout
    assert pq.read_table(out).num_rows == 30
    code, stdout, err = run_lac(capsys, "curator", "budget", *tls_flags[:2], "--ca", pki.ca, *_pem(pki, "analyst"))
    assert code == 0, err
    assert "exported 1x (not charged)" in stdout
    assert f"exporter exported windows {CLOSED}..{CLOSED}, rows shown to operators and the exporter only" in stdout
    code, stdout, err = run_lac(capsys, "curator", "budget", *tls_flags[:2], "--ca", pki.ca, *_pem(pki, "operator"))
    assert code == 0 and f"exporter exported windows {CLOSED}..{CLOSED}, 30 rows" in stdout, err
    code, _, err = run_lac(capsys, "curator", "export", "--window", str(CLOSED), "--out", str(out), *_all(cur, pki))
    assert code == 2 and "PERMISSION_DENIED" in err


def _pem(pki, who):
    cert, key = pki.pem(who)
    return ["--cert", cert, "--key", key]


def _all(cur, pki):
    return ["--server", cur.address, "--ca", pki.ca, *_pem(pki, "analyst")]


def test_backup_and_restore_carry_the_exports(tmp_path):
    from lac.curator.service.backup import backup, restore

    state = tmp_path / "state"
    store = CuratorStore(state)
    store.add_export("e1", "exporter", 3, 4, 17, json.dumps({"rows": 17}))
    store.close()
    backup(state, tmp_path / "bak")
    restore(tmp_path / "bak", tmp_path / "restored")
    store = CuratorStore(tmp_path / "restored")
    try:
        assert [(e, who, a, b, n) for e, who, _, a, b, n in store.exports()] == [("e1", "exporter", 3, 4, 17)]
    finally:
        store.close()


def test_a_curator_start_clears_an_interrupted_exports_spool(tmp_path):
    left = tmp_path / export.SPOOL_DIR / "export-x"
    left.mkdir(parents=True)
    (left / "0.arrow").write_bytes(b"rows")
    export.clear_spool(tmp_path)
    assert not (tmp_path / export.SPOOL_DIR).exists()


def test_the_guarantee_survives_the_wire():
    from lac.common import serde

    batches = [(CLOSED, CLOSED + 1, 9, _privacy(9)), (CLOSED + 1, CLOSED + 1, 4, None)]
    g = export.local_guarantee(
        DEPLOYMENT, CLOSED, CLOSED + 1, 13, export.window_shuffles(batches, CLOSED, CLOSED + 1, DEPLOYMENT)
    )
    m = serde.local_guarantee_message(g)
    back = serde.local_guarantee_from_proto(curator_pb2.LocalGuarantee.FromString(m.SerializeToString()))
    assert back == g and m.statement == g.statement()
    assert [(s.window, s.batches, s.unverified) for s in g.shuffles] == [(CLOSED + 1, 2, 1)]  # by their last window


def test_the_docs_example_runs(exporting_curator, tmp_path, monkeypatch):
    """The first Python block of docs/analyst/export.md, against this curator and its exporter certificate."""
    import re
    from pathlib import Path

    cur, pki = exporting_curator
    page = (Path(__file__).resolve().parents[2] / "docs" / "analyst" / "export.md").read_text(encoding="utf-8")
    code = re.findall(r"```python\n(.*?)```", page, re.S)[0]
    cert, key = pki.pem("exporter")
    for old, new in (
        ('"localhost:50052"', repr(cur.address)),
        ('"ca.pem"', repr(pki.ca)),
        ('"exporter.pem"', repr(cert)),
        ('"exporter.key"', repr(key)),
        ("20_400", str(CLOSED)),
    ):
        assert old in code, old
        code = code.replace(old, new)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "export.md", "exec"), scope)
    assert scope["got"].rows == 30 and (tmp_path / "window-20400.parquet").is_file()


def test_export_row_counts_are_shown_to_operators_and_the_exporter_only(start_curator, tmp_path, curator_public_key):
    """Issue 34 item 2: GetBudget showed every analyst each export's exact row count (an un-noised number
    derived from the data). Over real mTLS with the real roles: an analyst without the grant, and one with the
    grant who did not make that export, see no count; the identity that exported and an operator see it."""
    pki = Pki(tmp_path / "pki", ("curator", "shuffler", "analyst", "operator", "exporter", "exporter2"))
    cur = mtls_curator_with_reports(
        start_curator,
        pki,
        curator_public_key,
        7,
        window=CLOSED,
        analyst_identities="analyst,exporter,exporter2",
        export_identities="exporter,exporter2",
    )
    with _client(cur, pki, "exporter") as c:
        assert c.export_reports(CLOSED).rows == 7
    seen = {}
    for who in ("analyst", "exporter2", "exporter", "operator"):
        with tls.channel(cur.address, pki.client_tls(who)) as ch:
            (record,) = curator_pb2_grpc.CuratorStub(ch).GetBudget(curator_pb2.BudgetRequest(), timeout=30).exports
        seen[who] = (record.identity, record.rows if record.HasField("rows") else None)
    assert seen == {
        "analyst": ("exporter", None),
        "exporter2": ("exporter", None),
        "exporter": ("exporter", 7),
        "operator": ("exporter", 7),
    }
    with _client(cur, pki, "analyst") as c:
        assert c.exports(as_arrow=True).column("rows").to_pylist() == [None]


def test_a_batch_counts_in_one_window_so_no_set_of_exports_isolates_it(start_curator, curator_public_key):
    """Issue 34 item 3: a batch spanning windows w..w+1 was in the export of w..w+1 but in neither w's nor w+1's,
    so those three exports isolated it. Each batch belongs to its last window for exports: the export of a range
    is the union of its windows' exports."""
    cur = start_curator(export_identities="exporter")  # insecure: every caller holds every role
    w = CLOSED - 1
    with grpc.insecure_channel(cur.address) as ch:
        stub = curator_pb2_grpc.CuratorIngestStub(ch)
        for batch_id, n, first, last, text in (("a", 3, w, w, 0), ("span", 2, w, w + 1, 1), ("b", 4, w + 1, w + 1, 2)):
            privacy = batch_privacy(n, window=last)
            privacy.first_window = first
            reports = [envelope.seal(content(TEXTS[text]), curator_public_key) for _ in range(n)]
            request = curator_pb2.IngestBatchRequest(batch_id=batch_id, reports=reports, privacy=privacy)
            assert stub.IngestBatch(request, timeout=30).accepted == n
    with CuratorClient(cur.address, insecure=True) as c:
        rows = {r: Counter(c.export_reports(r).texts()) for r in (w, w + 1, (w, w + 1))}
    assert rows[(w, w + 1)] == rows[w] + rows[w + 1]
    assert rows[w] == Counter({" ".join(TEXTS[0]): 3}) and rows[w + 1][" ".join(TEXTS[1])] == 2


@pytest.mark.slow  # two real shufflers and windows of two seconds that must settle
def test_exports_of_a_settled_window_stay_equal_when_a_late_batch_comes(
    start_curator, start_shuffler, sink, caplog, curator_public_key
):
    """Issue 34 item 3, with live shufflers: two exports of a closed window taken before and after a late batch
    differed by exactly that batch. A window is exported only once settled (closed for longer than the release
    interval plus the forwarding horizon), and a batch for a window already exported is refused with
    FAILED_PRECONDITION and the reason window_exported (the shuffler keeps it), so the exports stay equal."""
    import os

    from lac_testkit import wait_until

    from lac.common.deployment import Deployment
    from lac.common.v1 import shuffler_pb2, shuffler_pb2_grpc

    ws, settle = 2.0, 6.0  # settle: shuffler_release_interval_seconds + forward_horizon_seconds
    cur = start_curator(
        export_identities="exporter",
        window_seconds=ws,
        shuffler_release_interval_seconds=2.0,
        forward_horizon_seconds=4.0,
    )
    sink.deployment = Deployment(window_seconds=ws)
    prompt = start_shuffler(cur.address, min_batch=1, window_seconds=ws, release_interval_seconds=0.2)
    late = start_shuffler(sink.address, min_batch=1, window_seconds=ws, release_interval_seconds=0.2)
    sink.refuse_batches = True  # the late shuffler's curator is unreachable: its batch waits
    while time.time() % ws > ws / 2:  # both submit early in one window
        time.sleep(0.05)
    window = int(time.time() // ws)
    for shuffler, words in ((prompt, ["the", "dog"]), (late, ["a", "fox"])):
        sealed = envelope.seal(content(words), curator_public_key)
        with grpc.insecure_channel(shuffler.address) as ch:
            request = shuffler_pb2.SubmitRequest(
                reports=[shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=sealed)]
            )
            shuffler_pb2_grpc.ShufflerStub(ch).Submit(request, timeout=30)
    assert int(time.time() // ws) == window
    wait_until(lambda: cur.call(status.status(cur.curator)).batches == 1)
    wait_until(lambda: sink.raw)  # the late batch was tried once
    with CuratorClient(cur.address, insecure=True) as c:
        time.sleep(max(0.0, (window + 1) * ws - time.time()) + 0.05)  # closed; settled 6 s later
        with pytest.raises(Refused, match="not settled"):
            c.export_reports(window)
        time.sleep(max(0.0, (window + 1) * ws + settle - time.time()) + 0.05)
        first = Counter(c.export_reports(window).texts())
        assert first == Counter({"the dog": 1})
        late.stop()
        late = start_shuffler(cur.address, state_dir=late.shuffler.config.state_dir, window_seconds=ws)
        wait_until(  # the shuffler tried it and the curator refused it
            lambda: any(
                "FAILED_PRECONDITION" in r.getMessage() and "were exported" in r.getMessage()
                for r in caplog.records
                if r.name == "lac.shuffler.forward"
            )
        )
        assert Counter(c.export_reports(window).texts()) == first
    assert cur.call(status.status(cur.curator)).batches == 1


def test_central_releases_over_exported_windows_say_how_they_compose(start_curator, curator_public_key, capsys):
    """Issue 34 item 1: after an export, a central release over the same windows ended with its bound over a
    period and never mentioned the export, and the budget showed "remaining" as if nothing had been released.
    Central releases over exported windows stay allowed (README, privacy model: why); every statement over them
    carries how the two compose (rendered from the typed ExportedWindows), those made before the export too when
    shown now, and the budget view marks the exported windows (its proto field, the client, the CLI)."""
    cur = start_curator(export_identities="exporter")  # insecure: every caller holds every role
    with grpc.insecure_channel(cur.address) as ch:
        for batch_id, window in (("older", CLOSED - 1), ("exported", CLOSED)):
            reports = [envelope.seal(content(TEXTS[i % 4]), curator_public_key) for i in range(12)]
            privacy = batch_privacy(12, window=window)
            request = curator_pb2.IngestBatchRequest(batch_id=batch_id, reports=reports, privacy=privacy)
            curator_pb2_grpc.CuratorIngestStub(ch).IngestBatch(request, timeout=30)
    span = dict(first_window=CLOSED - 1, last_window=CLOSED)
    with CuratorClient(cur.address, insecure=True) as c:
        before = c.release(epsilon=1.0, mechanism="laplace", **span)
        assert "Composition with exports" not in before.statement
        c.export_reports(CLOSED)
        after = c.release(epsilon=1.0, mechanism="laplace", **span)
        budget = c.budget_summary()
    caveat = f"Composition with exports: the privatized reports of window {CLOSED} were also exported (1 export)"
    assert caveat in after.statement and "count central releases only" in after.statement, after.statement
    with grpc.insecure_channel(cur.address) as ch:
        stub = curator_pb2_grpc.CuratorStub(ch)
        shown = {r.release_id: r.statement for r in stub.ListReleases(curator_pb2.ListReleasesRequest()).releases}
        again = stub.GetRelease(curator_pb2.GetReleaseRequest(release_id=before.release_id), timeout=30).record
    later = f"the privatized reports of window {CLOSED} were later also exported (1 export)"
    assert later in shown[before.release_id] and later in again.statement  # shown now with the caveat
    assert shown[after.release_id] == after.statement  # no second caveat
    assert [(w.window, w.exports) for w in budget.windows] == [(CLOSED - 1, 0), (CLOSED, 1)]
    assert f"The privatized reports of window {CLOSED} were exported" in budget.statement
    assert "exported 1x (remaining: central releases only)" in str(budget)
    code, stdout, err = run_lac(capsys, "curator", "budget", "--server", cur.address, "--insecure")
    assert code == 0 and "the remaining budget bounds central releases only" in stdout, err
    assert f"The privatized reports of window {CLOSED} were exported" in stdout
