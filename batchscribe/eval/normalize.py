"""Text normalisers for WER: `english` and `basic` give the same strings as Whisper's
EnglishTextNormalizer and BasicTextNormalizer (openai-whisper, tested against it), `none` is identity.

Written here rather than imported: openai-whisper pulls in torch, numba and tiktoken just for these
few regexes, transformers is test-only in this project, and the `whisper-normalizer` PyPI package
adds rules of its own ("kinda", "cause"), which would shift WERs away from published figures.
The British->American spelling table is openai-whisper's `english.json` (MIT), stored with its
licence notice in `english_spelling.json`.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from functools import cache
from importlib.resources import files

from batchscribe.eval.numbers import EnglishNumberNormalizer

Normalizer = Callable[[str], str]
NORMALIZERS = ("english", "basic", "none")

# Letters that NFKD does not split into base + combining mark.
_EXTRA_DIACRITICS = {"œ": "oe", "Œ": "OE", "ø": "o", "Ø": "O", "æ": "ae", "Æ": "AE", "ß": "ss",
                     "ẞ": "SS", "đ": "d", "Đ": "D", "ð": "d", "Ð": "D", "þ": "th", "Þ": "th",
                     "ł": "l", "Ł": "L"}
_BRACKETED = re.compile(r"[<\[][^>\]]*[>\]]")  # "[laughs]", "<unk>"
_PARENTHESISED = re.compile(r"\(([^)]+?)\)")
_SPACES = re.compile(r"\s+")
_FILLERS = re.compile(r"\b(hmm|mm|mhm|mmm|uh|um)\b")
_WORD_RUNS = re.compile(r"\w+")

# Applied in this order (later, general rules must not fire before the specific ones).
_CONTRACTIONS: tuple[tuple[str, str], ...] = (
    (r"\bwon't\b", "will not"), (r"\bcan't\b", "can not"), (r"\blet's\b", "let us"),
    (r"\bain't\b", "aint"), (r"\by'all\b", "you all"), (r"\bwanna\b", "want to"),
    (r"\bgotta\b", "got to"), (r"\bgonna\b", "going to"), (r"\bi'ma\b", "i am going to"),
    (r"\bimma\b", "i am going to"), (r"\bwoulda\b", "would have"), (r"\bcoulda\b", "could have"),
    (r"\bshoulda\b", "should have"), (r"\bma'am\b", "madam"),
    # titles and abbreviations; the trailing space is whisper's too
    *((rf"\b{short}\b", f"{long} ") for short, long in (
        ("mr", "mister"), ("mrs", "missus"), ("st", "saint"), ("dr", "doctor"),
        ("prof", "professor"), ("capt", "captain"), ("gov", "governor"), ("ald", "alderman"),
        ("gen", "general"), ("sen", "senator"), ("rep", "representative"), ("pres", "president"),
        ("rev", "reverend"), ("hon", "honorable"), ("asst", "assistant"), ("assoc", "associate"),
        ("lt", "lieutenant"), ("col", "colonel"), ("jr", "junior"), ("sr", "senior"),
        ("esq", "esquire"))),
    # perfect tenses first, so "'s been" is not read as "is been"
    (r"'d been\b", " had been"), (r"'s been\b", " has been"), (r"'d gone\b", " had gone"),
    (r"'s gone\b", " has gone"), (r"'d done\b", " had done"), (r"'s got\b", " has got"),
    (r"n't\b", " not"), (r"'re\b", " are"), (r"'s\b", " is"), (r"'d\b", " would"),
    (r"'ll\b", " will"), (r"'t\b", " not"), (r"'ve\b", " have"), (r"'m\b", " am"),
)


@cache
def _ascii_symbols(keep: str) -> dict[int, str]:
    """str.translate's table for ASCII text: each mark, symbol or punctuation character -> space."""
    return {c: " " for c in range(128) if chr(c) not in keep and unicodedata.category(chr(c))[0] in "MSP"}


def remove_symbols_and_diacritics(s: str, keep: str = "") -> str:
    """Marks, symbols and punctuation -> space (except `keep`); accents dropped (NFKD)."""
    if s.isascii():  # NFKD leaves ASCII as it is, and no ASCII character is a combining mark
        return s.translate(_ascii_symbols(keep))
    out = []
    for c in unicodedata.normalize("NFKD", s):
        category = unicodedata.category(c)
        if c in keep:
            out.append(c)
        elif c in _EXTRA_DIACRITICS:
            out.append(_EXTRA_DIACRITICS[c])
        elif category == "Mn":
            continue
        else:
            out.append(" " if category[0] in "MSP" else c)
    return "".join(out)


def remove_symbols(s: str) -> str:
    """Marks, symbols and punctuation -> space, accents kept (NFKC)."""
    return "".join(" " if unicodedata.category(c)[0] in "MSP" else c for c in unicodedata.normalize("NFKC", s))


def basic_normalize(s: str) -> str:
    """Whisper's BasicTextNormalizer(): lower case, no bracketed asides, no punctuation or symbols."""
    s = _PARENTHESISED.sub("", _BRACKETED.sub("", s.lower()))
    return _SPACES.sub(" ", remove_symbols(s).lower())


@cache
def spelling_mapping() -> dict[str, str]:
    """British -> American spellings (openai-whisper's table; see `english_spelling.json`)."""
    data = json.loads(files("batchscribe.eval").joinpath("english_spelling.json").read_text("utf-8"))
    return data["mapping"]


class EnglishTextNormalizer:
    """Whisper's English normaliser: fillers, contractions, titles, numbers/currencies, spellings."""

    def __init__(self) -> None:
        self._contractions = [(re.compile(p), r) for p, r in _CONTRACTIONS]
        # Where none of them can match, each substitution would leave the text as it is: every
        # pattern has an apostrophe or is one whole word (r"\bmr\b" matches where "mr" is a whole
        # run of word characters), and most texts have neither.
        self._contraction_words = {p[2:-2] for p, _ in _CONTRACTIONS if "'" not in p}
        assert all(w.isalpha() for w in self._contraction_words), self._contraction_words
        self._numbers = EnglishNumberNormalizer()
        self._spelling = spelling_mapping()

    def __call__(self, s: str) -> str:
        s = _PARENTHESISED.sub("", _BRACKETED.sub("", s.lower()))
        s = _FILLERS.sub("", s)
        s = re.sub(r"\s+'", "'", s)  # "don 't" -> "don't"
        if "'" in s or not self._contraction_words.isdisjoint(_WORD_RUNS.findall(s)):
            for pattern, replacement in self._contractions:
                s = pattern.sub(replacement, s)
        s = re.sub(r"(\d),(\d)", r"\1\2", s)  # "1,000" -> "1000"
        s = re.sub(r"\.([^0-9]|$)", r" \1", s)  # periods go, decimal points stay
        s = remove_symbols_and_diacritics(s, keep=".%$¢€£")
        s = self._numbers(s)
        s = " ".join(self._spelling.get(word, word) for word in s.split())
        s = re.sub(r"[.$¢€£]([^0-9])", r" \1", s)  # symbols not attached to a number
        s = re.sub(r"([^0-9])%", r"\1 ", s)
        return _SPACES.sub(" ", s)


def get_normalizer(name: str) -> Normalizer:
    """`english` | `basic` | `none` -> a function str -> str."""
    if name == "english":
        return EnglishTextNormalizer()
    if name == "basic":
        return basic_normalize
    if name == "none":
        return lambda s: s
    raise ValueError(f"unknown normalizer {name!r}: choose one of {', '.join(NORMALIZERS)}")
