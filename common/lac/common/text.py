"""Tokenisation shared by the client (before perturbation) and the curator (after).

One definition of "word" and "sentence" for the whole system, so that the words
the client perturbs are exactly the units the curator counts.
"""

from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
# Penn-Treebank-style clitics, as in GloVe's vocabulary: "don't" -> "do", "n't"; "it's" -> "it", "'s".
_WORD = re.compile(r"[a-z0-9]+(?=n't\b)|n't\b|'(?:s|re|ve|ll|d|m)\b|[a-z0-9]+")

# What ``words`` reads, in words (for messages): everything else separates words or is dropped.
WORD_CHARACTERS = (
    "the basic Latin letters a-z (any case) and the digits 0-9, as in English; other scripts "
    "(e.g. Chinese, Cyrillic, Arabic), emoji and punctuation are not part of any word"
)

BOS = "<s>"
EOS = "</s>"
UNK = "<unk>"  # a word outside a vocabulary (never produced by ``words``)


def words(text: str) -> list[str]:
    """Lower-cased word tokens of ``text``: runs of letters/digits and split-off clitics."""
    return _WORD.findall(text.lower())


def sentences(text: str) -> list[list[str]]:
    """Split ``text`` into sentences of word tokens; empty sentences are dropped."""
    out = []
    for chunk in _SENTENCE_END.split(text):
        toks = words(chunk)
        if toks:
            out.append(toks)
    return out
