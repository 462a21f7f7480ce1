"""Who may call what, over real TLS servers: every RPC of both services with every identity.

Regression tests of the review's findings 1 (pre-noise data to any certificate), 6 (exact data
statistics in status and errors) and 10 (anonymous flush and status; world-readable state).
"""

from __future__ import annotations

import os
import re
import stat

import grpc
import numpy as np
import pytest
from lac_testkit import batch_privacy, content

from lac.common import envelope, tls
from lac.common.v1 import curator_pb2, curator_pb2_grpc, reports_pb2, shuffler_pb2, shuffler_pb2_grpc
from lac.shuffler.auth import add_client
from lac.suite.procs import LocalDeployment

AUTH_ERRORS = {grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED}
TEXTS = [
    ["the", "dog", "sleeps", "in", "the", "sun"],
    ["the", "fox", "is", "a", "small", "animal"],
    ["we", "walk", "the", "dog"],
    ["the", "sun", "is", "a", "star"],
]
N_REPORTS = 23


@pytest.fixture
def pki(tmp_path):
    p = LocalDeployment.create(tmp_path / "keys")
    tls.issue(p.root / "tls", "intruder", ["localhost", "127.0.0.1"])  # signed by the CA, in no role
    tls.issue(p.root / "tls", "exporter", ["localhost", "127.0.0.1"])  # the curator's export_identities
    return p


def _code(fn):
    try:
        fn()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _curator_calls(stub, ingest, release_id):
    return {
        "IngestBatch": lambda: ingest.IngestBatch(
            curator_pb2.IngestBatchRequest(batch_id="x-" + os.urandom(4).hex()), timeout=10
        ),
        "Release": lambda: stub.Release(curator_pb2.ReleaseRequest(epsilon=0.01, delta=1e-9), timeout=60),
        "PreviewRelease": lambda: stub.PreviewRelease(curator_pb2.ReleaseRequest(epsilon=1.0), timeout=10),
        "ListReleases": lambda: stub.ListReleases(curator_pb2.ListReleasesRequest(), timeout=10),
        "GetRelease": lambda: stub.GetRelease(curator_pb2.GetReleaseRequest(release_id=release_id), timeout=10),
        "TopNgrams": lambda: stub.TopNgrams(curator_pb2.TopNgramsRequest(release_id=release_id, k=3), timeout=10),
        "GetBudget": lambda: stub.GetBudget(curator_pb2.BudgetRequest(), timeout=10),
        "GetDeployment": lambda: stub.GetDeployment(reports_pb2.DeploymentRequest(), timeout=10),
        "GetStatus": lambda: stub.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=10),
        "NgramProbabilities": lambda: stub.NgramProbabilities(
            curator_pb2.NgramProbabilitiesRequest(release_id=release_id, ngrams=["the dog"]), timeout=10
        ),
        "NextWord": lambda: stub.NextWord(
            curator_pb2.NextWordRequest(release_id=release_id, context="the"), timeout=10
        ),
        "Perplexity": lambda: stub.Perplexity(
            curator_pb2.PerplexityRequest(release_id=release_id, text="The dog."), timeout=10
        ),
        "ExportArpa": lambda: list(stub.ExportArpa(curator_pb2.ExportArpaRequest(release_id=release_id), timeout=30)),
        "ExportReports": lambda: list(
            stub.ExportReports(curator_pb2.ExportReportsRequest(first_window=0, last_window=0), timeout=30)
        ),
    }


CURATOR_ALLOWED = {
    "shuffler": {"IngestBatch", "GetDeployment"},
    "analyst": {
        "Release",
        "PreviewRelease",
        "ListReleases",
        "GetRelease",
        "TopNgrams",
        "GetBudget",
        "GetDeployment",
        "NgramProbabilities",
        "NextWord",
        "Perplexity",
        "ExportArpa",
    },
    "operator": {
        "Release",
        "PreviewRelease",
        "ListReleases",
        "GetRelease",
        "TopNgrams",
        "GetBudget",
        "GetDeployment",
        "GetStatus",
        "NgramProbabilities",
        "NextWord",
        "Perplexity",
        "ExportArpa",
    },
    "exporter": {"ExportReports"},  # only with the operator's grant (export_identities); analysts need it too
    "intruder": set(),
    "curator": set(),
}


@pytest.fixture
def curator(start_curator, pki, curator_public_key):
    cert, key = pki._pem("curator")
    cur = start_curator(
        insecure=False,
        tls_cert=cert,
        tls_key=key,
        tls_client_ca=pki.ca,
        budget_epsilon=100.0,
        export_identities="exporter",
    )
    with tls.channel(cur.address, pki.client_tls("shuffler")) as ch:
        curator_pb2_grpc.CuratorIngestStub(ch).IngestBatch(
            curator_pb2.IngestBatchRequest(
                batch_id="b1",
                reports=[envelope.seal(content(TEXTS[i % 4]), curator_public_key) for i in range(N_REPORTS)],
                privacy=batch_privacy(N_REPORTS),
            ),
            timeout=30,
        )
    with tls.channel(cur.address, pki.client_tls("analyst")) as ch:
        rid = (
            curator_pb2_grpc.CuratorStub(ch)
            .Release(curator_pb2.ReleaseRequest(epsilon=1, delta=1e-6), timeout=60)
            .release_id
        )
    return cur, rid


def test_the_readme_role_table_names_every_rpc():
    """README "Who sees what" lists every RPC of both services in its table (issue 34 item 5: ExportReports was
    missing)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("| RPC | client |") :].split("\n\n", 1)[0]
    named: dict[str, set[str]] = {"Shuffler": set(), "Curator": set()}
    for row in table.splitlines()[2:]:
        cell = row.split("|")[1].strip()
        service = cell.split()[0]
        named[service] |= set(re.findall(r"`(\w+)`", cell.split("(")[0]))
    shuffler = set(shuffler_pb2.DESCRIPTOR.services_by_name["Shuffler"].methods_by_name)
    curator = {m.name for s in ("CuratorIngest", "Curator") for m in curator_pb2.DESCRIPTOR.services_by_name[s].methods}
    assert named == {"Shuffler": shuffler, "Curator": curator}


def test_every_curator_rpc_serves_only_its_roles(curator, pki):
    """Table-driven: every RPC of CuratorIngest and Curator, with every identity; the others get
    PERMISSION_DENIED, and a caller without a certificate is refused at the TLS handshake."""
    cur, rid = curator
    names = set(curator_pb2.DESCRIPTOR.services_by_name["Curator"].methods_by_name) | {"IngestBatch"}
    assert names == set(_curator_calls(None, None, rid))  # the table covers every RPC of the proto
    for who, allowed in CURATOR_ALLOWED.items():
        with tls.channel(cur.address, pki.client_tls(who)) as ch:
            calls = _curator_calls(curator_pb2_grpc.CuratorStub(ch), curator_pb2_grpc.CuratorIngestStub(ch), rid)
            for name, call in calls.items():
                code = _code(call)
                if name in allowed:
                    assert code not in AUTH_ERRORS, (who, name, code)
                else:
                    assert code == grpc.StatusCode.PERMISSION_DENIED, (who, name, code)
    with tls.channel(cur.address, pki.client_tls()) as ch:  # TLS, but no client certificate
        for name, call in _curator_calls(
            curator_pb2_grpc.CuratorStub(ch), curator_pb2_grpc.CuratorIngestStub(ch), rid
        ).items():
            assert _code(call) == grpc.StatusCode.UNAVAILABLE, name  # refused before any RPC runs


def _numbers(message) -> list[float]:
    """Every number anywhere in a protobuf message (recursively, maps and repeated fields too)."""
    out = []
    for field, value in message.ListFields():
        values = (
            value.values()
            if field.message_type and field.message_type.GetOptions().map_entry
            else (value if field.is_repeated else [value])
        )
        for v in values:
            if hasattr(v, "ListFields"):
                out += _numbers(v)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append(float(v))
    return out


def test_no_reply_carries_pre_noise_or_exact_counts_to_an_analyst(curator, pki, public_corpus):
    """Finding 1: the pre-noise mean was returned to any certificate. Now no RPC returns it to
    anyone, and an analyst's replies hold no exact data statistic (computed here from the library)."""
    from lac.curator.base.ngrams import user_counts
    from lac.curator.base.prior import public_vocabulary
    from lac.curator.release.bayesian import BayesianParams, bayesian_dp
    from lac.curator.service.config import CuratorConfig

    cur, rid = curator
    cfg = CuratorConfig(public_corpus=public_corpus, vocab_min_count=1)
    vocab = public_vocabulary(public_corpus, 3, 1, cfg.vocab_max_items, public_corpus.parent / "prior-roles")
    U = user_counts([[TEXTS[i % 4]] for i in range(N_REPORTS)], vocab, C=1, W=100)
    mean = bayesian_dp(
        U, vocab.alpha, BayesianParams(1.0, 1e-6, S=0.01, rho=0.5, W=100, count_clip=10**6, sensitivity="bruteforce")
    ).mean
    exact = {float(N_REPORTS)} | {float(c) for c in np.asarray(U.sum(axis=0)).ravel() if c > 4}
    assert "pre_noise_mean" not in curator_pb2.GetReleaseResponse.DESCRIPTOR.fields_by_name
    assert "include_pre_noise_mean" not in curator_pb2.GetReleaseRequest.DESCRIPTOR.fields_by_name
    for who in ("analyst", "operator"):
        with tls.channel(cur.address, pki.client_tls(who)) as ch:
            stub = curator_pb2_grpc.CuratorStub(ch)
            replies = [
                stub.GetRelease(curator_pb2.GetReleaseRequest(release_id=rid), timeout=10),
                stub.ListReleases(curator_pb2.ListReleasesRequest(), timeout=10),
                stub.TopNgrams(curator_pb2.TopNgramsRequest(release_id=rid, k=50), timeout=10),
                stub.GetBudget(curator_pb2.BudgetRequest(), timeout=10),
                stub.NextWord(curator_pb2.NextWordRequest(release_id=rid, context="the", k=20), timeout=10),
            ]
            numbers = np.array([x for r in replies for x in _numbers(r)])
            assert not np.any(np.isclose(numbers[:, None], mean[None, :], rtol=0, atol=1e-12)), who
            if who == "analyst":
                assert not exact & set(numbers.tolist()), exact & set(numbers.tolist())
            else:  # the operator does see the exact count, in the record and the status
                assert replies[0].record.n_reports == N_REPORTS
                assert stub.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=10).reports == N_REPORTS


def test_errors_never_echo_data_statistics(curator, pki):
    """Finding 6: public caps came from the request (n_max) and errors said e.g. 'a user holds 119
    items'. Caps are configuration now (the request has no such field) and enforced by construction."""
    assert not {"n_max", "c", "k"} & set(curator_pb2.ReleaseRequest.DESCRIPTOR.fields_by_name)
    cur, _ = curator
    with tls.channel(cur.address, pki.client_tls("analyst")) as ch:
        stub = curator_pb2_grpc.CuratorStub(ch)
        for request in (
            curator_pb2.ReleaseRequest(epsilon=1000, delta=1e-6),
            curator_pb2.ReleaseRequest(epsilon=1, delta=1e-6, first_window=5, last_window=4),
            curator_pb2.ReleaseRequest(epsilon=1, delta=1e-6, sensitivity="bruteforce"),
        ):
            with pytest.raises(grpc.RpcError) as err:
                stub.Release(request, timeout=30)
            assert str(N_REPORTS) not in err.value.details() and "holds" not in err.value.details()


def _shuffler_calls(stub, md):
    good = shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=envelope.seal_insecure(content(["a"])))
    return {
        "Submit": lambda: stub.Submit(shuffler_pb2.SubmitRequest(reports=[good]), metadata=md, timeout=10),
        "SubmitStream": lambda: stub.SubmitStream(
            iter([shuffler_pb2.SubmitRequest(reports=[good])]), metadata=md, timeout=10
        ),
        "GetDeployment": lambda: stub.GetDeployment(reports_pb2.DeploymentRequest(), metadata=md, timeout=10),
        "GetStatus": lambda: stub.GetStatus(shuffler_pb2.ShufflerStatusRequest(), metadata=md, timeout=10),
        "Flush": lambda: stub.Flush(shuffler_pb2.FlushRequest(), metadata=md, timeout=10),
        "GetShards": lambda: stub.GetShards(shuffler_pb2.GetShardsRequest(), metadata=md, timeout=10),
        "ListDeadLetters": lambda: stub.ListDeadLetters(shuffler_pb2.ListDeadLettersRequest(), metadata=md, timeout=10),
        "RetryDeadLetters": lambda: stub.RetryDeadLetters(
            shuffler_pb2.DeadLetterSelection(all=True), metadata=md, timeout=10
        ),
        "DropDeadLetters": lambda: stub.DropDeadLetters(
            shuffler_pb2.DeadLetterSelection(all=True), metadata=md, timeout=10
        ),
    }


def test_every_shuffler_rpc_serves_only_its_roles(start_shuffler, pki, tmp_path):
    """Finding 10: an anonymous caller could Flush and read the status. Now: clients submit and read
    the deployment, operators read the status and flush, everyone else is refused; credentials are
    parsed strictly (one well-formed Bearer header)."""
    state = tmp_path / "shf"
    client = add_client(state / "clients.tokens", "alice")
    operator = add_client(state / "clients.tokens", "ops", role="operator")
    cert, key = pki._pem("shuffler")
    shf = start_shuffler(
        "127.0.0.1:1",
        insecure=False,
        auth="token",
        state_dir=state,
        tls_cert=cert,
        tls_key=key,
        curator_ca=pki.ca,
        allow_plaintext_payloads=True,
        min_batch=5,
        reports_per_window=100,
    )
    names = set(shuffler_pb2.DESCRIPTOR.services_by_name["Shuffler"].methods_by_name)
    allowed = {
        "client": {"Submit", "SubmitStream", "GetDeployment", "GetShards"},
        "operator": {
            "GetDeployment",
            "GetStatus",
            "Flush",
            "GetShards",
            "ListDeadLetters",
            "RetryDeadLetters",
            "DropDeadLetters",
        },
    }
    identities = {
        "client": (("authorization", f"Bearer {client}"),),
        "operator": (("authorization", f"Bearer {operator}"),),
        "none": None,
        "unknown token": (("authorization", "Bearer " + "x" * 43),),
        "trailing space": (("authorization", f"Bearer {client} "),),
        "two headers": (("authorization", "Bearer bad"), ("authorization", f"Bearer {client}")),
        "lower-case scheme": (("authorization", f"bearer {client}"),),
    }
    with tls.channel(shf.address, pki.client_tls()) as ch:
        stub = shuffler_pb2_grpc.ShufflerStub(ch)
        assert set(_shuffler_calls(stub, None)) == names
        for who, md in identities.items():
            for name, call in _shuffler_calls(stub, md).items():
                code = _code(call)
                if name in allowed.get(who, set()):
                    assert code not in AUTH_ERRORS, (who, name, code)
                elif who in allowed:
                    assert code == grpc.StatusCode.PERMISSION_DENIED, (who, name, code)
                else:
                    assert code == grpc.StatusCode.UNAUTHENTICATED, (who, name, code)


def test_flush_never_releases_below_the_threshold(start_shuffler, sink):
    shf = start_shuffler(sink.address, min_batch=5)
    with grpc.insecure_channel(shf.address) as ch:
        stub = shuffler_pb2_grpc.ShufflerStub(ch)
        stub.Submit(
            shuffler_pb2.SubmitRequest(
                reports=[
                    shuffler_pb2.ClientReport(
                        idempotency_id=os.urandom(16), payload=envelope.seal_insecure(content(["a"]))
                    )
                    for _ in range(4)
                ]
            ),
            timeout=10,
        )
        reply = stub.Flush(shuffler_pb2.FlushRequest(), timeout=10)
        assert not reply.released and "fewer than min_batch=5" in reply.note
    # With a randomised threshold a flush waits for the secret threshold too, not just min_batch.
    shf2 = start_shuffler(sink.address, min_batch=3, batch_threshold_noise=1e6)
    with grpc.insecure_channel(shf2.address) as ch:
        stub = shuffler_pb2_grpc.ShufflerStub(ch)
        stub.Submit(
            shuffler_pb2.SubmitRequest(
                reports=[
                    shuffler_pb2.ClientReport(
                        idempotency_id=os.urandom(16), payload=envelope.seal_insecure(content(["a"]))
                    )
                    for _ in range(10)
                ]
            ),
            timeout=10,
        )
        assert not stub.Flush(shuffler_pb2.FlushRequest(), timeout=10).released  # P(threshold <= 10) ≈ 1e-5


def test_state_and_secrets_are_private(curator, start_shuffler, sink, tmp_path, pki):
    """Finding 10: five state and key files were world-readable. Every file the services or `lac keys`
    create under their directories is now 0600 and every directory 0700."""
    state = tmp_path / "shf-perm"
    add_client(state / "clients.tokens", "alice")
    shf = start_shuffler(sink.address, state_dir=state, min_batch=1000)
    with grpc.insecure_channel(shf.address) as ch:
        shuffler_pb2_grpc.ShufflerStub(ch).Submit(
            shuffler_pb2.SubmitRequest(
                reports=[
                    shuffler_pb2.ClientReport(
                        idempotency_id=os.urandom(16), payload=envelope.seal_insecure(content(["a"]))
                    )
                ]
            ),
            timeout=10,
        )
    checked = 0
    for root in (state, tmp_path / "curator0", pki.root / "curator-keys"):
        for dirpath, dirs, files in os.walk(root):
            assert stat.S_IMODE(os.stat(dirpath).st_mode) & 0o077 == 0, dirpath
            for f in files:
                path = os.path.join(dirpath, f)
                public = f.endswith(".pub") or f.endswith(".pem")  # public keys and certificates may be read
                if not public:
                    assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0, path
                    checked += 1
    for f in (pki.root / "tls").glob("*.key"):
        assert stat.S_IMODE(os.stat(f).st_mode) & 0o077 == 0, f
    assert checked >= 8
