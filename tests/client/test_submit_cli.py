"""``lac client submit FILE`` against a real TLS shuffler and curator: it says how many lines were stored and why
the others were not (the quota, with when to submit them again; lines with no word), never drops a good line
because of a bad one, and its exit status says whether everything that could be submitted was stored."""

from __future__ import annotations

import json
import re

from lac_testkit import run_lac

from lac.shuffler.auth import add_clients


def _submit(capsys, files, messages, *extra):
    """``lac client submit`` as the README's dev line runs it, with ``files``' CA and curator key."""
    return run_lac(
        capsys,
        "client",
        "submit",
        str(messages),
        "--server",
        extra[0],
        "--curator-key",
        str(files / "curator.pub"),
        "--ca",
        str(files / "ca.pem"),
        *extra[1:],
    )


def test_lines_past_the_quota_are_named_with_when_to_submit_them(
    tls_services, data_dir, glove50k, tmp_path, capsys, monkeypatch
):
    """The README's dev line with its one token and a 3-line file: the deployment's quota is one report per client
    and window, so line 1 is stored and lines 2-3 are named, with the next window and how to submit as more
    clients (`lac dev up --clients N`); exit status 3, which ``--help`` documents."""
    address, files, token = tls_services
    monkeypatch.setenv("LAC_CLIENT_TOKEN", token)
    messages = tmp_path / "messages.txt"
    messages.write_text("hello world\nmy name is Bob\nI live in Paris\n", encoding="utf-8")
    code, out, err = _submit(capsys, files, messages, address)
    assert code == 3, (out, err)
    first, refused = out.splitlines()
    assert first == "stored 1 of 3 lines (1 report)"
    assert refused.startswith("not stored: lines 2-3: refused by the shuffler (quota of 1 report(s) per client")
    assert re.search(r"Submit these lines again after \d{4}-\d\d-\d\d \d\d:\d\d UTC", refused), refused
    assert "--tokens FILE" in refused and "`lac dev up --clients N`" in refused and "Traceback" not in err
    code, out, _ = run_lac(capsys, "client", "submit", "--help")
    assert code == 0 and "Exit status: 0 when every line with a word was stored, 3 when the quota" in " ".join(
        out.split()
    )


def test_a_line_without_words_is_skipped_and_the_lines_are_dealt_to_several_clients(
    tls_services, data_dir, glove50k, tmp_path, capsys
):
    """``--tokens`` (JSON lines, as `lac dev up` and `lac shuffler add-clients` write them; an operator's line is
    left out): the lines with words go to the three clients in turn, one report each per window. A line in
    another script is skipped and named, not the whole file refused; a line partly in another script is
    submitted on its words, with a warning naming it."""
    address, files, _ = tls_services
    ids = ["bob", "carol", "dave"]
    tokens = add_clients(tmp_path / "tls-shuffler" / "clients.tokens", ids)  # the running shuffler's tokens file
    clients = tmp_path / "clients.jsonl"
    clients.write_text(
        "".join(json.dumps({"id": i, "role": "client", "token": t}) + "\n" for i, t in zip(ids, tokens))
        + json.dumps({"id": "ops", "role": "operator", "token": "not-a-client"})
        + "\n",
        encoding="utf-8",
    )
    messages = tmp_path / "messages.txt"
    messages.write_text("the king spoke\n你好，世界。\nhello 世界 world\n\nthe queen\n", encoding="utf-8")
    code, out, err = _submit(capsys, files, messages, address, "--tokens", str(clients))
    assert code == 0, (out, err)  # every line with a word was stored
    assert out.splitlines() == [
        "stored 3 of 4 lines (3 reports)",
        f"skipped: line 2 of {messages}: no word to privatize (words are made of the letters a-z and digits 0-9): "
        "nothing to submit",
    ]
    assert f"warning: line 3 of {messages} has letters or digits outside a-z and 0-9" in err
    messages.write_text("one more line\nand another\n", encoding="utf-8")  # each client's one report is used
    code, out, err = _submit(capsys, files, messages, address, "--tokens", str(clients))
    assert code == 3 and out.startswith("stored 0 of 2 lines (0 reports)\nnot stored: lines 1-2: "), (out, err)
    assert out.rstrip().endswith("or as more clients in the --tokens file")
