"""The analyst API (``lac.analyst.CuratorClient``) against a real curator over mutual TLS on loopback:
DataFrame columns and dtypes, values equal to the raw RPCs', the Parquet export, the exception tree,
no exact report count anywhere, and the notebook-style quickstart (every python block executed)."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import grpc
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lac_testkit import mtls_curator_with_reports, run_lac

from lac.common import tls
from lac.common.v1 import curator_pb2, curator_pb2_grpc, reports_pb2

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "analyst" / "quickstart.md"
N_REPORTS = 23  # an exact count no analyst reply may carry


@pytest.fixture
def serve(start_curator, pki, curator_public_key):
    """Factory: a curator with mutual TLS on 127.0.0.1:0 holding N_REPORTS sealed reports (ingested as
    the shuffler identity); returns the ServerThread."""

    def start(**overrides):
        return mtls_curator_with_reports(start_curator, pki, curator_public_key, N_REPORTS, **overrides)

    return start


def _client(cur, pki, who="analyst"):
    from lac.analyst import CuratorClient

    cert, key = pki.pem(who)
    return CuratorClient(cur.address, ca=pki.ca, cert=cert, key=key)


@pytest.fixture
def raw(serve, pki):
    """(server, raw gRPC stub with the analyst certificate) for comparing with the client's values."""
    cur = serve(budget_epsilon=100.0)
    with tls.channel(cur.address, pki.client_tls("analyst")) as ch:
        yield cur, curator_pb2_grpc.CuratorStub(ch)


def _numbers(frame: pd.DataFrame) -> set[float]:
    out = set()
    for name in frame.columns:
        if pd.api.types.is_numeric_dtype(frame[name]) and not pd.api.types.is_bool_dtype(frame[name]):
            out |= {float(v) for v in frame[name]}
        elif frame[name].dtype == object:  # the params maps
            out |= {float(v) for m in frame[name] if isinstance(m, dict) for v in m.values()}
    return out


def test_three_lines_give_a_dataframe_of_the_top_ngrams(serve, pki):
    cur = serve()
    ca, (cert, key) = pki.ca, pki.pem("analyst")
    # The README's three lines, with this deployment's address and files.
    from lac.analyst import CuratorClient

    with CuratorClient(cur.address, ca=ca, cert=cert, key=key) as c:
        top = c.top(c.release(epsilon=1.0).release_id, k=20)
    assert isinstance(top, pd.DataFrame)
    assert list(top.columns) == ["ngram", "order", "probability", "noise_sd", "noise_low", "noise_high"]
    assert pd.api.types.is_string_dtype(top["ngram"])
    assert top["order"].dtype == np.int8 and top["probability"].dtype == np.float64
    assert len(top) == 20
    assert (np.diff(top["probability"]) <= 0).all()
    assert (top["order"] == top["ngram"].str.split().str.len()).all()


_BLOCK = """
import sys

class Block:  # as if {name} were not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == {name!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, Block())
"""


def _run_without(package: str, body: str) -> None:
    script = _BLOCK.format(name=package) + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_import_is_cheap_and_works_without_pandas(serve, pki):
    """``import lac.analyst`` loads no server code, pandas or pyarrow; without pandas the client imports,
    Arrow tables work and a DataFrame call names the extra to install."""
    cur = serve()
    cert, key = pki.pem("analyst")
    with _client(cur, pki) as c:
        rid = c.release(epsilon=1.0).release_id
    _run_without(
        "pandas",
        f"""
        import lac.analyst
        heavy = {{"lac.curator", "lac.shuffler", "scipy", "pandas", "pyarrow"}} & set(sys.modules)
        assert not heavy, heavy
        from lac.analyst import CuratorClient, AnalystError
        with CuratorClient({cur.address!r}, ca={pki.ca!r}, cert={cert!r}, key={key!r}) as c:
            table = c.top({rid!r}, k=5, as_arrow=True)
            assert table.num_rows == 5 and table.column_names[:3] == ["ngram", "order", "probability"], table
            try:
                c.top({rid!r}, k=5)
            except ImportError as exc:
                assert "lac-analyst[frames]" in str(exc), exc
            else:
                raise AssertionError("no ImportError without pandas")
        print("ok")
        """,
    )


def _same_frame(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """The same values and dtypes (a string column's storage, python or pyarrow, is pandas' choice: not compared)."""
    assert {c: str(t) for c, t in got.dtypes.items()} == {c: str(t) for c, t in want.dtypes.items()}
    pd.testing.assert_frame_equal(got, want, check_dtype=False, check_column_type=False, check_index_type=False)


def test_dataframes_need_no_pyarrow(serve, pki):
    """Without pyarrow (``lac-analyst[frames]``: the analyst's small install) every table comes as a DataFrame
    with the dtypes the Arrow path gives; Arrow tables and Parquet files name the extra to install."""
    cur = serve(budget_epsilon=100.0)
    cert, key = pki.pem("analyst")
    with _client(cur, pki) as c:
        rid = c.release(epsilon=1.0).release_id
        want = {name: getattr(c, name)(rid) for name in ("top", "ngrams")}
        want["releases"], want["budget"] = c.releases(), c.budget()
        for name, frame in want.items():  # the same columns and dtypes as the Arrow tables converted by pyarrow
            arrow = getattr(c, name)(*([rid] if name in ("top", "ngrams") else []), as_arrow=True)
            _same_frame(frame, arrow.to_pandas(maps_as_pydicts="strict"))
    path = tempfile.mkdtemp()
    _run_without(
        "pyarrow",
        f"""
        import pickle
        from lac.analyst import CuratorClient
        with CuratorClient({cur.address!r}, ca={pki.ca!r}, cert={cert!r}, key={key!r}) as c:
            got = {{"top": c.top({rid!r}), "ngrams": c.ngrams({rid!r}), "releases": c.releases(), "budget": c.budget()}}
            for call in (lambda: c.top({rid!r}, as_arrow=True), lambda: c.export_parquet({rid!r}, {path!r} + "/x")):
                try:
                    call()
                except ImportError as exc:
                    assert "lac-analyst[arrow]" in str(exc), exc
                else:
                    raise AssertionError("no ImportError without pyarrow")
        assert "pyarrow" not in sys.modules
        with open({path!r} + "/got.pickle", "wb") as f:
            pickle.dump(got, f)
        print("ok")
        """,
    )
    import pickle

    with open(Path(path) / "got.pickle", "rb") as f:
        got = pickle.load(f)
    for name, frame in want.items():
        _same_frame(got[name], frame)
        assert got[name].attrs.keys() == frame.attrs.keys(), name


def test_releases_frame_equals_the_rpc_and_holds_no_report_count(raw, pki):
    cur, stub = raw
    from lac.analyst import ReleaseInfo

    with _client(cur, pki) as c:
        first = c.release(epsilon=1.0)
        second = c.release(epsilon=0.5, delta=1e-7, mechanism="laplace")
        df = c.releases()
        table = c.releases(as_arrow=True)
        info = c.release_info(second.release_id)
        budget = c.budget()
    assert isinstance(first, ReleaseInfo) and first.differentially_private and "differential privacy" in first.statement
    assert second.mechanism == "laplace" and info == second
    want = stub.ListReleases(curator_pb2.ListReleasesRequest(), timeout=10).releases
    assert list(df["release_id"]) == [r.release_id for r in want] and len(df) == 2
    expected_columns = [
        "release_id",
        "created_at",
        "mechanism",
        "epsilon",
        "delta",
        "differentially_private",
        "data_dependent",
        "first_window",
        "last_window",
        "privacy_unit",
        "reports_per_user",
        "sensitivity_method",
        "calibration",
        "gamma",
        "sigma",
        "laplace_scale",
        "ledger_epsilon",
        "ledger_delta",
        "vocab_size",
        "max_n",
        "params",
        "statement",
    ]
    assert list(df.columns) == expected_columns == table.column_names
    assert str(df["created_at"].dtype) == "datetime64[us, UTC]"
    for name in ("epsilon", "delta", "gamma", "sigma", "laplace_scale", "ledger_epsilon", "ledger_delta"):
        assert df[name].dtype == np.float64, name
    for name in ("first_window", "last_window", "reports_per_user", "vocab_size", "max_n"):
        assert df[name].dtype == np.int64, name
    assert df["differentially_private"].dtype == bool and df["data_dependent"].dtype == bool
    assert table.schema.field("params").type == pa.map_(pa.string(), pa.float64())
    for row, r in zip(df.itertuples(index=False), want):
        for name in expected_columns:
            got = getattr(row, name)
            if name == "created_at":
                assert got == pd.Timestamp(r.created_at)
            elif name == "params":
                assert got == dict(r.params)
            else:
                assert got == getattr(r, name), name
    # No exact count: no such column, no such number, and the record type has no such field.
    assert not [c for c in df.columns if "n_reports" in c or c == "reports"]
    assert "n_reports" not in ReleaseInfo.__dataclass_fields__
    assert float(N_REPORTS) not in _numbers(df) | _numbers(budget)
    assert all(r.n_reports == 0 for r in want)  # the curator shows analysts none either


def test_distribution_queries_equal_the_rpcs(raw, pki, tmp_path):
    cur, stub = raw
    with _client(cur, pki) as c:
        rid = c.release(epsilon=1.0).release_id
        ngrams = c.ngrams(rid)
        ngrams_arrow = c.ngrams(rid, as_arrow=True)
        top = c.top(rid, k=7, order=2)
        prob = c.probability(rid, ["the dog", "the  sun", "zebra"])
        one = c.probability(rid, "the dog")
        nxt = c.next_word(rid, "the", k=5)
        ppl = c.perplexity(rid, "The dog sleeps in the sun. A fox is small.")
        budget = c.budget()
        dep = c.deployment()
        server = c.server_version()
        arpa = c.arpa(rid, tmp_path / "release.arpa")

    got = stub.GetRelease(curator_pb2.GetReleaseRequest(release_id=rid), timeout=10)
    assert list(ngrams.columns) == ["ngram", "order", "log_prob", "probability"]
    assert list(ngrams["ngram"]) == list(got.items)
    assert ngrams["log_prob"].to_numpy().tolist() == list(got.log_probs)
    assert np.array_equal(ngrams["probability"].to_numpy(), np.exp(np.array(got.log_probs)))
    assert ngrams["order"].dtype == np.int8 and set(ngrams["order"]) == {1, 2, 3}
    assert (ngrams["order"] == ngrams["ngram"].str.split().str.len()).all()
    assert ngrams.attrs["lac.release"]["release_id"] == rid
    assert ngrams_arrow.schema.types == [pa.string(), pa.int8(), pa.float64(), pa.float64()]
    assert json.loads(ngrams_arrow.schema.metadata[b"lac.release"])["release_id"] == rid

    want = stub.TopNgrams(curator_pb2.TopNgramsRequest(release_id=rid, k=7, order=2), timeout=10).ngrams
    assert list(zip(top["ngram"], top["probability"])) == [(g.ngram, g.probability) for g in want]
    assert (top["order"] == 2).all() and len(top) == 7

    want = stub.NgramProbabilities(
        curator_pb2.NgramProbabilitiesRequest(release_id=rid, ngrams=["the dog", "the  sun", "zebra"]), timeout=10
    ).ngrams
    assert list(zip(prob["ngram"], prob["probability"])) == [(g.ngram, g.probability) for g in want]
    assert list(prob["ngram"]) == ["the dog", "the sun", "zebra"] and list(prob["order"]) == [2, 2, 1]
    assert prob["probability"].iloc[2] == 0.0  # outside the release vocabulary
    assert one["probability"].iloc[0] == prob["probability"].iloc[0]

    want = stub.NextWord(curator_pb2.NextWordRequest(release_id=rid, context="the", k=5), timeout=10)
    assert list(nxt.columns) == ["context_used", "word", "probability"]
    # at most k: a noisy release may keep fewer than 5 continuations of "the" (3 runs in 20 did)
    assert (nxt["context_used"] == want.context_used).all() and 1 <= len(nxt) <= 5
    assert list(zip(nxt["word"], nxt["probability"])) == [(w.ngram, w.probability) for w in want.words]

    want = stub.Perplexity(
        curator_pb2.PerplexityRequest(release_id=rid, text="The dog sleeps in the sun. A fox is small."), timeout=10
    )
    assert (ppl.perplexity, ppl.n_sentences, ppl.n_tokens, ppl.n_out_of_vocabulary) == (
        want.perplexity,
        want.n_sentences,
        want.n_tokens,
        want.n_out_of_vocabulary,
    )

    want = stub.GetBudget(curator_pb2.BudgetRequest(), timeout=10)
    assert list(budget.columns) == [
        "window",
        "window_start",
        "window_end",
        "spent_epsilon",
        "spent_delta",
        "remaining_epsilon",
        "remaining_delta",
        "budget_epsilon",
        "budget_delta",
        "exports",
    ]
    assert (budget["exports"] == 0).all()  # no export of privatized reports (tests/curator/test_export.py)
    assert budget["window"].dtype == np.int64 and str(budget["window_start"].dtype) == "datetime64[us, UTC]"
    assert [
        tuple(r)
        for r in budget[["window", "spent_epsilon", "spent_delta", "remaining_epsilon", "remaining_delta"]].itertuples(
            index=False
        )
    ] == [(w.window, w.spent_epsilon, w.spent_delta, w.remaining_epsilon, w.remaining_delta) for w in want.windows]
    assert (budget["budget_epsilon"] == want.budget_epsilon).all() and budget["spent_epsilon"].iloc[0] == 1.0
    start = budget["window_start"].iloc[0]
    assert start.timestamp() == budget["window"].iloc[0] * want.window_seconds
    assert start <= pd.Timestamp.now(tz="UTC") < budget["window_end"].iloc[0]

    from lac.common.serde import deployment_from_proto

    assert dep == deployment_from_proto(stub.GetDeployment(reports_pb2.DeploymentRequest(), timeout=10))
    assert server == stub.GetDeployment(reports_pb2.DeploymentRequest(), timeout=10).server_version
    assert server == f"lac-curator {importlib.metadata.version('lac-curator')}"
    chunks = stub.ExportArpa(curator_pb2.ExportArpaRequest(release_id=rid), timeout=30)
    assert arpa.read_text(encoding="utf-8") == "".join(ch.text for ch in chunks)
    assert "\\data\\" in arpa.read_text() and arpa.read_text().rstrip().endswith("\\end\\")


def test_parquet_round_trip(raw, pki, tmp_path):
    cur, stub = raw
    with _client(cur, pki) as c:
        release = c.release(epsilon=2.0, mechanism="bayesian", S=0.02, rho=0.4)
        path = c.export_parquet(release, tmp_path / "release.parquet")
        frame = c.ngrams(release.release_id)
        info = c.release_info(release.release_id)
    assert release.params["S"] == 0.02 and release.params["rho"] == 0.4
    table = pq.read_table(path)
    assert table.schema.names == ["ngram", "order", "log_prob"]
    assert table.schema.types == [pa.string(), pa.int8(), pa.float64()]
    record = json.loads(table.schema.metadata[b"lac.release"])
    assert record == info.to_dict() and record["release_id"] == release.release_id
    assert "n_reports" not in record and record["statement"] == release.statement
    got = stub.GetRelease(curator_pb2.GetReleaseRequest(release_id=release.release_id), timeout=10)
    assert table.column("ngram").to_pylist() == list(got.items)
    assert table.column("log_prob").to_pylist() == list(got.log_probs)

    df = pd.read_parquet(path)
    pd.testing.assert_frame_equal(df, frame[["ngram", "order", "log_prob"]], check_like=False)
    assert df.attrs["lac.release"] == record
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)


def test_errors_map_to_the_exception_tree(serve, pki, tmp_path):
    from lac.analyst import AnalystError, BudgetExhausted, InvalidArgument, NotFound, PermissionDenied, Unavailable

    cur = serve(budget_epsilon=1.5)
    with _client(cur, pki) as c:
        empty = c.releases()
        assert empty.empty and "release_id" in empty.columns and str(empty["created_at"].dtype) == "datetime64[us, UTC]"
        c.release(epsilon=1.0)
        with pytest.raises(BudgetExhausted) as exc:
            c.release(epsilon=1.0)
        assert exc.value.code == "FAILED_PRECONDITION" and "budget" in exc.value.details
        assert not isinstance(exc.value, grpc.RpcError) and isinstance(exc.value, AnalystError)
        assert str(N_REPORTS) not in exc.value.details.split()
        assert c.budget()["remaining_epsilon"].iloc[0] == pytest.approx(0.5)  # the refused release spent nothing
        for call in (
            lambda: c.top("no-such-release"),
            lambda: c.ngrams("no-such-release"),
            lambda: c.next_word("no-such-release", "the"),
            lambda: c.release_info("no-such-release"),
            lambda: c.arpa("no-such-release", tmp_path / "x.arpa"),
            lambda: c.export_parquet("no-such-release", tmp_path / "x.parquet"),
        ):
            with pytest.raises(NotFound) as nf:
                call()
            assert nf.value.code == "NOT_FOUND" and "no-such-release" in nf.value.details
        assert not (tmp_path / "x.arpa").exists() and not (tmp_path / "x.parquet").exists()
        with pytest.raises(PermissionDenied) as denied:
            c.status()  # operator only
        assert denied.value.code == "PERMISSION_DENIED"
        rid = c.releases()["release_id"].iloc[0]
        with pytest.raises(InvalidArgument):
            c.top(rid, order=9)
        with pytest.raises(InvalidArgument):
            c.release(epsilon=-1.0)
        with pytest.raises(InvalidArgument):
            c.release(epsilon=0.1, first_window=3)  # both windows or neither
        with pytest.raises(TypeError, match="unknown knob"):
            c.release(epsilon=0.1, k=3)
    with _client(cur, pki, "operator") as ops:
        status = ops.status()  # the operator sees exact counts
        assert status.reports == N_REPORTS and status.releases == 1
    from lac.analyst import CuratorClient

    with CuratorClient(cur.address, ca=pki.ca) as anonymous:  # TLS without a client certificate
        with pytest.raises(Unavailable) as refused:
            anonymous.budget()
        assert refused.value.code == "UNAVAILABLE"
    with pytest.raises(ValueError):
        CuratorClient(cur.address)  # neither a CA nor insecure=True


def test_preview_and_refusal(serve, pki):
    from lac.analyst import ReleasePreview, ReleaseRefused

    cur = serve(budget_epsilon=10.0, min_signal_share=0.25, count_epsilon=2.0)  # a precise count: a stable verdict
    with _client(cur, pki) as c:
        p = c.preview(epsilon=1.0)
        assert isinstance(p, ReleasePreview) and p.reports is None and p.swamped is None and p.reports_needed > 0
        assert str(p) == p.statement and "needs at least" in p.statement
        big = c.preview(epsilon=1.0, expected_reports=10**7)
        assert big.reports == 10**7 and big.swamped is False and big.signal_share > 0.25
        assert c.budget()["spent_epsilon"].sum() == 0.0  # previews are free
        with pytest.raises(ReleaseRefused) as refused:
            c.release(epsilon=1.0)
        assert refused.value.code == "FAILED_PRECONDITION" and "force" in refused.value.details
        assert c.budget()["spent_epsilon"].iloc[0] == pytest.approx(2.0)  # the DP count, charged once
        assert c.release(epsilon=1.0, force=True).differentially_private


def test_delta_zero_is_pure_dp_or_refused(serve, pki, capsys):
    """δ = 0 is what the analyst gets where the mechanism is pure ε-DP (laplace, laplace-public), and refused,
    with nothing spent, where it is not; an unset δ keeps the release default."""
    from lac.analyst import InvalidArgument

    cur = serve(budget_epsilon=10.0)
    with _client(cur, pki) as c:
        for mechanism in (None, "bayesian"):  # the default mechanism (posterior) and another Gaussian one
            with pytest.raises(InvalidArgument) as refused:
                c.release(epsilon=0.1, delta=0.0, mechanism=mechanism, force=True)
            assert "delta = 0 is pure ε-DP" in refused.value.details
            assert "pure ε-DP mechanisms: laplace, laplace-public" in refused.value.details
            with pytest.raises(InvalidArgument):
                c.preview(epsilon=0.1, delta=0.0, mechanism=mechanism)
        assert c.releases().empty and (c.budget()["spent_delta"] == 0).all()
        for mechanism in ("laplace", "laplace-public"):
            preview = c.preview(epsilon=0.1, delta=0.0, mechanism=mechanism, expected_reports=1000)
            assert preview.delta == 0.0 and "(ε, δ) = (0.1, 0)" in preview.statement
            assert c.preview(epsilon=0.1, mechanism=mechanism, expected_reports=1000).delta == 0.0  # δ unset
            pure = c.release(epsilon=0.1, delta=0.0, mechanism=mechanism, force=True)
            assert (pure.delta, pure.ledger_delta) == (0.0, 0.0)
        with pytest.raises(InvalidArgument, match="delta must be in"):
            c.release(epsilon=0.1, delta=-1.0, mechanism="laplace", force=True)
        default = c.release(epsilon=0.1, force=True)  # δ unset: the release default, as before
        assert (default.delta, default.ledger_delta) == (1e-6, 1e-6)
    cert, key = pki.pem("analyst")
    tls_flags = ["--server", cur.address, "--ca", pki.ca, "--cert", cert, "--key", key]
    code, out, err = run_lac(
        capsys, "curator", "release", *tls_flags, "--mechanism", "laplace", "--epsilon", "0.1", "--delta", "0",
        "--expected-reports", "1000", "--dry-run",
    )  # fmt: skip
    assert code == 0 and "dry run (nothing spent): laplace at (ε, δ) = (0.1, 0):" in out, out + err
    code, out, err = run_lac(capsys, "curator", "release", *tls_flags, "--epsilon", "0.1", "--delta", "0", "--force")
    assert code == 2 and "INVALID_ARGUMENT: delta = 0 is pure ε-DP" in err and "Traceback" not in err, err


def test_an_explicit_delta_of_zero_is_told_from_unset_on_the_wire():
    """``optional double delta``: the same field number and encoding as before, so an older client's request
    (which never sent a zero δ) still gets the release default; a zero sent explicitly is δ = 0."""
    from lac.curator.service.serde import release_spec

    unset = curator_pb2.ReleaseRequest(epsilon=1.0).SerializeToString()
    assert release_spec(curator_pb2.ReleaseRequest.FromString(unset)).delta == 1e-6
    zero = curator_pb2.ReleaseRequest(epsilon=1.0, mechanism="laplace", delta=0.0).SerializeToString()
    assert b"\x19" + bytes(8) in zero  # field 3, fixed64, 0.0
    assert release_spec(curator_pb2.ReleaseRequest.FromString(zero)).delta == 0.0
    given = curator_pb2.ReleaseRequest(epsilon=1.0, delta=1e-5).SerializeToString()
    assert release_spec(curator_pb2.ReleaseRequest.FromString(given)).delta == 1e-5


SPECIAL = {"<unk>", "<s>", "</s>"}


def test_top_leaves_out_special_tokens_and_refuses_k_below_one(raw, pki, capsys):
    """``top(exclude_special=True)`` / ``--no-special`` list no n-gram with <unk>, <s> or </s> and keep the
    others' probabilities; k = 0 and k < 0 are refused with ValueError before any call (the wire's k = 0
    is refused too, and an unset k keeps the old default of 10); an order's n-grams only, however large k."""
    cur, stub = raw
    with _client(cur, pki) as c:
        rid = c.release(epsilon=1.0).release_id
        everything = c.top(rid, k=10**6)
        plain = c.top(rid, k=10**6, exclude_special=True)
        trigrams = c.top(rid, k=2**40, order=3, exclude_special=True)  # more than a uint32: as many as there are
        for bad in (0, -1, 2.5, True, None):
            with pytest.raises(ValueError, match="k must be an integer >= 1"):
                c.top(rid, k=bad)
        with pytest.raises(ValueError, match="order must be 0"):
            c.top(rid, order=-1)
    has_special = everything["ngram"].map(lambda g: bool(SPECIAL & set(g.split())))
    assert has_special.any() and not has_special.all()  # the release lists both kinds
    assert len(everything) == len(stub.GetRelease(curator_pb2.GetReleaseRequest(release_id=rid), timeout=10).items)
    kept = everything[~has_special.to_numpy()]
    # the same n-grams with the same probabilities (not renormalised); ties may list in either order
    assert dict(zip(plain["ngram"], plain["probability"])) == dict(zip(kept["ngram"], kept["probability"]))
    assert len(plain) == len(kept) and (np.diff(plain["probability"]) <= 0).all()
    assert (trigrams["order"] == 3).all() and not trigrams["ngram"].map(lambda g: bool(SPECIAL & set(g.split()))).any()
    assert len(trigrams) == sum(1 for g in plain["ngram"] if len(g.split()) == 3)

    def top(**fields):
        return stub.TopNgrams(curator_pb2.TopNgramsRequest(release_id=rid, **fields), timeout=10).ngrams

    assert len(top()) == 10  # k unset: what an older client's k = 0 always meant
    with pytest.raises(grpc.RpcError) as refused:
        top(k=0)
    assert (
        refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "k must be at least 1" in refused.value.details()
    )
    five = top(k=5, exclude_special=True)
    assert [g.probability for g in five] == plain["probability"][:5].tolist()
    assert not any(SPECIAL & set(g.ngram.split()) for g in five)

    cert, key = pki.pem("analyst")
    tls_flags = ["--server", cur.address, "--ca", pki.ca, "--cert", cert, "--key", key]
    code, out, err = run_lac(capsys, "curator", "query", "top", *tls_flags, rid, "-k", "1000", "--no-special")
    assert code == 0 and sorted(line.split(maxsplit=1)[1] for line in out.splitlines()) == sorted(plain["ngram"]), err
    for bad in ("0", "-1"):
        code, out, err = run_lac(capsys, "curator", "query", "top", *tls_flags, rid, "-k", bad)
        assert code == 2 and not out and len(err.splitlines()) == 1 and "argument -k: must be > 0" in err, err
    code, out, err = run_lac(capsys, "curator", "query", "top", *tls_flags, rid, "--order", "-1")
    assert code == 2 and len(err.splitlines()) == 1 and "argument --order" in err, err


def test_an_unset_k_is_told_from_zero_on_the_wire():
    """``optional uint32 k``: same field and encoding, so an older client's k = 0 (never sent) is unset."""
    from lac.curator.service.serde import DEFAULT_TOP_K, top_k

    old = curator_pb2.TopNgramsRequest(release_id="r").SerializeToString()
    assert top_k(curator_pb2.TopNgramsRequest.FromString(old)) == DEFAULT_TOP_K == 10
    assert top_k(curator_pb2.TopNgramsRequest.FromString(curator_pb2.TopNgramsRequest(k=7).SerializeToString())) == 7
    zero = curator_pb2.TopNgramsRequest(release_id="r", k=0).SerializeToString()
    assert zero.endswith(b"\x10\x00")  # field 2, varint 0: present
    from lac.common.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="k must be at least 1"):
        top_k(curator_pb2.TopNgramsRequest.FromString(zero))


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.S | re.M)


@pytest.mark.slow  # the whole walkthrough (a curator, 2,000 reports, releases; the RPCs are tested above): about 10 s,
# plus the first time the sampling of the clients' local channel into the data dir (the release waits for it)
def test_quickstart_runs(tmp_path, monkeypatch):
    """Every python block of docs/analyst/quickstart.md, in order, in one namespace."""
    blocks = _python_blocks(QUICKSTART.read_text(encoding="utf-8"))
    assert len(blocks) >= 5
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the walkthrough's work directory
    namespace: dict = {"__name__": "__quickstart__"}
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"{QUICKSTART}:block{i + 1}", "exec"), namespace)
    finally:
        for name in ("client", "c"):
            if hasattr(namespace.get(name), "close"):
                namespace[name].close()
        curator = namespace.get("curator")
        if curator is not None and hasattr(curator, "stop"):
            curator.stop()
    top = namespace["top"]
    assert isinstance(top, pd.DataFrame)
    assert list(top.columns) == ["ngram", "order", "probability", "noise_sd", "noise_low", "noise_high"]
    assert len(top) == 10 and (top["order"] == 1).all()
    assert namespace["ack"].accepted == 2_000 and namespace["release"].differentially_private
    assert not namespace["work"].exists()  # the last block cleans up
