"""One grammar across ``lac``: the whole argparse tree of every installed subcommand is walked (so
commands added later are covered too): lower-case kebab-case flags, ``--server`` wherever a command
talks to a service, no duplicate subcommands, and every leaf given bad input (an unknown flag, a bad
value, a missing file, an unreachable server) ends in exactly one line on stderr and exit code 2,
never a traceback. A plugin that fails to load breaks only its own command."""

from __future__ import annotations

import argparse
import inspect
import re
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from lac.common import cli

FLAG = re.compile(r"^(--[a-z][a-z0-9]*(-[a-z0-9]+)*|-[a-z])$")
UNREACHABLE = "127.0.0.1:1"  # nothing listens on port 1: refused at once


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subs[0].choices) if subs else {}


def _walk(parser, path=()):
    """Every parser of the tree as (path, parser), leaves last."""
    yield path, parser
    for name, child in _children(parser).items():
        yield from _walk(child, (*path, name))


PARSERS = list(_walk(cli.build_parser()))
LEAVES = {path: p for path, p in PARSERS if not _children(p)}


def _visible(parser):
    return [a for a in parser._actions if a.help is not argparse.SUPPRESS]


def _options(parser) -> set[str]:
    return {s for a in _visible(parser) for s in a.option_strings}


def test_the_tree_is_complete():
    names = {path[0] for path in LEAVES}
    assert {"client", "shuffler", "curator", "keys", "health"} <= names
    assert not [" ".join(k) for k, p in LEAVES.items() if not callable(p.get_default("func"))]


def test_flags_are_lower_case_kebab_case():
    bad = [(" ".join(path), flag) for path, p in PARSERS for flag in _options(p) if not FLAG.match(flag)]
    assert not bad, bad


def test_every_command_that_talks_to_a_service_takes_server():
    # A command reaching a service takes the client TLS flags (--ca); its address is --server.
    talking = [path for path, p in LEAVES.items() if "--ca" in _options(p)]
    assert ("client", "submit") in talking and ("health",) in talking
    for path in talking:
        p = LEAVES[path]
        assert "--server" in _options(p), " ".join(path)
        positional = [a.dest for a in _visible(p) if not a.option_strings]
        assert not {"address", "target", "server"} & set(positional), " ".join(path)


def test_no_duplicate_subcommands():
    for path, p in PARSERS:
        children = _children(p)
        assert len({id(c) for c in children.values()}) == len(children), f"aliases under {' '.join(path)}"
    by_func: dict = {}
    for path, p in LEAVES.items():
        by_func.setdefault(inspect.unwrap(p.get_default("func")), []).append(" ".join(path))
    assert not [paths for paths in by_func.values() if len(paths) > 1]


# ------------------------------------------------------------------------------------------------ bad input


@pytest.fixture(scope="module")
def material(tmp_path_factory):
    """A real CA and curator key (so a command gets as far as dialling), a text file, and a missing path."""
    from lac.common import envelope, tls

    d = tmp_path_factory.mktemp("cli")
    tls.make_ca(d / "tls")
    envelope.generate_key(d / "curator")
    text = d / "messages.txt"
    text.write_text("hello world\n")
    return {
        "ca": str(d / "tls" / "ca.pem"),
        "pub": str(d / "curator" / "curator.pub"),
        "text": str(text),
        "missing": str(d / "no-such-file"),
        "out": str(d / "out"),
    }


def _required(parser, m) -> list[str]:
    """Values for the arguments argparse requires: options first, then positionals."""
    opts, pos = [], []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction) or a.help is argparse.SUPPRESS:
            continue
        if a.option_strings and a.required:
            opts += [a.option_strings[0], m["out"] if a.type in (None, str, Path) else "1"]
        elif not a.option_strings and a.nargs not in ("?", "*"):
            pos.append(m["text"])
    return opts + pos


# Arguments a leaf needs (beyond what argparse requires) to get as far as the service.
TO_THE_SERVICE = {
    ("client", "submit"): lambda m: ["--curator-key", m["pub"], "--attempts", "1", "--timeout", "0.5"],
    # --dry-run: PreviewRelease fails at once; Release itself retries UNAVAILABLE for seconds (same one line)
    ("curator", "release"): lambda m: ["--epsilon", "1", "--dry-run"],
    ("health",): lambda m: ["--timeout", "1"],
    ("curator", "export"): lambda m: ["--window", "0"],
    ("shuffler", "dead-letter", "retry"): lambda m: ["--all"],
    ("shuffler", "dead-letter", "drop"): lambda m: ["--all"],
}

# Files read by leaves whose file arguments are not --config, --ca or a positional FILE.
MISSING_FILE = {
    ("keys", "show"): lambda m: ["--dir", m["missing"]],
    ("shuffler", "restore"): lambda m: [m["missing"], "--state-dir", m["out"]],
    ("shuffler", "backup"): lambda m: [m["out"] + "-backup", "--state-dir", m["missing"]],
    ("curator", "migrate-segments"): lambda m: ["--state-dir", m["missing"]],
    ("curator", "backup"): lambda m: [m["out"] + "-backup", "--state-dir", m["missing"]],
    ("curator", "restore"): lambda m: [m["missing"], "--state-dir", m["out"]],
    ("curator", "release"): lambda m: ["--counts", m["missing"], "--public", m["missing"], "--epsilon", "1"],
    ("curator", "query", "perplexity"): lambda m: ["--insecure", "rid", "@" + m["missing"]],
    ("client", "calibrate"): lambda m: ["--embedding", m["missing"]],
    ("client", "embedding-info"): lambda m: ["--embedding", m["missing"]],
    ("dev", "status"): lambda m: ["--dir", m["missing"]],
}


def _cases(path, parser, m):
    """(what, argv, a fragment the message must contain) for each bad input this leaf can be given."""
    opts = _options(parser)
    yield "unknown flag", ["--no-such-flag", *_required(parser, m)], "unrecognized arguments: --no-such-flag"
    typed = [
        a
        for a in _visible(parser)
        if a.option_strings and ((a.type is not None and a.type not in (str, Path)) or a.choices)
    ]
    if typed:
        flag = typed[0].option_strings[0]
        yield "bad value", [flag, "not-a-valid-value"], f"argument {flag}"
    elif [a for a in _visible(parser) if a.required or (not a.option_strings and a.nargs not in ("?", "*"))]:
        yield "missing argument", [], "required"
    missing = m["missing"].rsplit("/", 1)[1]
    if "--config" in opts:  # a server: its settings are checked before it binds anything
        yield "missing --config", ["--config", m["missing"]], missing
        yield "bad setting", ["--port", "not-a-port"], "--port"
    if "file" in {a.dest for a in parser._actions if not a.option_strings}:
        extra = TO_THE_SERVICE.get(path, lambda m: [])(m) + (["--ca", m["ca"]] if "--ca" in opts else [])
        yield "missing FILE", [*extra, m["missing"]], missing
    if path in MISSING_FILE:
        yield "missing file", MISSING_FILE[path](m), missing
    if "--server" in opts:
        extra = TO_THE_SERVICE.get(path, lambda m: [])(m)
        yield (
            "unreachable server",
            ["--server", UNREACHABLE, "--ca", m["ca"], *extra, *_required(parser, m)],
            "UNAVAILABLE|DEADLINE_EXCEEDED",
        )
        yield "missing --ca", ["--server", UNREACHABLE, "--ca", m["missing"], *extra, *_required(parser, m)], missing


def _run(argv, capfd) -> tuple[object, list[str], str]:
    capfd.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capfd.readouterr().err
    return exc.value.code, [line for line in err.splitlines() if line.strip()], err


@pytest.mark.parametrize("path", sorted(LEAVES), ids=["-".join(p) for p in sorted(LEAVES)])
def test_bad_input_is_one_line_and_exit_code_2(path, material, capfd):
    failures = []
    cases = list(_cases(path, LEAVES[path], material))
    for what, args, expect in cases:
        argv = [*path, *args]
        code, lines, err = _run(argv, capfd)
        ok = (
            code == 2
            and len(lines) == 1
            and "Traceback" not in err
            and lines[0].startswith("lac")
            and re.search(expect, lines[0])
        )
        if not ok:
            failures.append(f"{what}: lac {' '.join(argv)} -> exit {code!r}, stderr {err!r}")
    assert not failures, "\n".join(failures)
    assert len(cases) >= 2


def test_no_command_and_unknown_command(capfd):
    for argv, expect in (
        ([], "required"),
        (["no-such-command"], "invalid choice"),
        (["curator"], "required"),
        (["--no-such-flag", "keys", "show", "--dir", "k"], "unrecognized"),
    ):
        code, lines, err = _run(argv, capfd)
        assert code == 2 and len(lines) == 1 and expect in lines[0], (argv, err)


def test_no_hidden_aliases():
    """Every option is listed in --help: the old spellings (--shuffler, --S/--W/--C/--K, a positional address of
    `lac health`) were removed before the first release (CHANGELOG)."""
    for path, p in PARSERS:
        hidden = [a.option_strings or [a.dest] for a in p._actions if a.help is argparse.SUPPRESS]
        assert not [h for h in hidden if h != ["--help"]], (" ".join(path), hidden)
    parser = cli.build_parser()
    assert parser.parse_args(["client", "submit", "f"]).server == "127.0.0.1:50051"
    assert parser.parse_args(["health", "--server", "h:2"]).server == "h:2"
    args = parser.parse_args(["curator", "release", "--max-items-per-report", "3", "--decay-slope", "0.5"])
    assert (args.w, args.s) == (3, 0.5)
    for argv in (
        ["client", "submit", "f", "--shuffler", "h:1"],
        ["health", "h:2"],
        ["curator", "release", "--W", "3"],
        ["curator", "release", "--S", "0.5"],
        ["curator", "release", "--C", "2"],
        ["curator", "release", "--K", "4"],
    ):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        assert e.value.code == 2, argv


# ------------------------------------------------------------------------------------------- broken plugins


def _register_then_fail(subparsers) -> None:
    """A plugin that adds its command and then fails."""
    subparsers.add_parser("halfway", help="never finished")
    raise RuntimeError("boom while registering")


def test_a_broken_plugin_breaks_only_its_own_command(monkeypatch, capfd):
    real = cli.entry_points
    fakes = [
        EntryPoint("broken", "lac_no_such_plugin_module:register", "lac.commands"),
        EntryPoint("halfway", f"{__name__}:_register_then_fail", "lac.commands"),
        EntryPoint("keys", "lac_no_such_plugin_module:register", "lac.commands"),
    ]  # a duplicate name
    monkeypatch.setattr(cli, "entry_points", lambda group: [*real(group=group), *fakes])

    code, lines, err = _run(["broken", "--anything", "x"], capfd)
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "'broken'" in lines[0] and "ModuleNotFoundError" in lines[0] and "lac_no_such_plugin_module" in lines[0]
    code, lines, err = _run(["halfway"], capfd)
    assert code == 2 and len(lines) == 1 and "RuntimeError: boom while registering" in lines[0], err

    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    assert capfd.readouterr().out.count("(failed to load") == 2
    # The other commands work, the first `keys` included.
    code, lines, err = _run(
        ["shuffler", "amplification", "--eps0", "1", "--n", "1000", "--delta", "1e-6", "--json"], capfd
    )
    assert code == 0 and not lines, err
    code, lines, err = _run(["keys", "show", "--dir", "/nonexistent-lac-keys"], capfd)
    assert code == 2 and "keyring.json" in lines[0], err
