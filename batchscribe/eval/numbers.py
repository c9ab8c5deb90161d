"""Spelled-out English numbers -> digits, with the same results as Whisper's EnglishNumberNormalizer.

The rules (and their quirks, which WER comparisons with published figures depend on) follow
openai-whisper's `whisper/normalizers/english.py`; tests compare this module with it word for word.
The state machine keeps one pending `value`: an int while the words still form a cardinal number
("two hundred" -> 200), a digit string once they can only be read digit by digit ("one oh one" ->
"101") or carry a decimal point, and None between numbers.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator
from fractions import Fraction

_ONES = ("one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen").split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_MULTIPLIERS = ("hundred thousand million billion trillion quadrillion quintillion sextillion "
                "septillion octillion nonillion decillion").split()

ZEROS = frozenset({"o", "oh", "zero"})
ONES = {name: i for i, name in enumerate(_ONES, start=1)}
TENS = {name: 10 * i for i, name in enumerate(_TENS, start=2)}
MULTIPLIERS = {name: 10 ** (2 if i == 0 else 3 * i) for i, name in enumerate(_MULTIPLIERS)}

# word -> (value, suffix written after the digits: "1960s", "21st")
_IRREGULAR_ORDINALS = {"first": 1, "second": 2, "third": 3, "fifth": 5, "twelfth": 12}
ONES_SUFFIXED: dict[str, tuple[int, str]] = {
    **{("sixes" if w == "six" else w + "s"): (v, "s") for w, v in ONES.items()},
    "zeroth": (0, "th"),
    **{w: (v, {1: "st", 2: "nd", 3: "rd"}.get(v, "th")) for w, v in _IRREGULAR_ORDINALS.items()},
    **{w + ("h" if w.endswith("t") else "th"): (v, "th")
       for w, v in ONES.items() if v not in _IRREGULAR_ORDINALS.values()},
}
TENS_SUFFIXED: dict[str, tuple[int, str]] = {
    **{w.replace("y", "ies"): (v, "s") for w, v in TENS.items()},
    **{w.replace("y", "ieth"): (v, "th") for w, v in TENS.items()},
}
MULTIPLIERS_SUFFIXED: dict[str, tuple[int, str]] = {
    **{w + "s": (v, "s") for w, v in MULTIPLIERS.items()},
    **{w + "th": (v, "th") for w, v in MULTIPLIERS.items()},
}
DECIMALS = frozenset({*ONES, *TENS, *ZEROS})

PRECEDING_PREFIXERS = {"minus": "-", "negative": "-", "plus": "+", "positive": "+"}
FOLLOWING_PREFIXERS = {"pound": "£", "pounds": "£", "euro": "€", "euros": "€",
                       "dollar": "$", "dollars": "$", "cent": "¢", "cents": "¢"}
PREFIX_SYMBOLS = frozenset({*PRECEDING_PREFIXERS.values(), *FOLLOWING_PREFIXERS.values()})
SPECIALS = frozenset({"and", "double", "triple", "point"})
_CARDINAL_WORDS = frozenset({*ZEROS, *ONES, *ONES_SUFFIXED, *TENS, *TENS_SUFFIXED, *MULTIPLIERS,
                             *MULTIPLIERS_SUFFIXED})
NUMBER_WORDS = frozenset({*_CARDINAL_WORDS, *PRECEDING_PREFIXERS, *FOLLOWING_PREFIXERS, "per", "percent",
                          *SPECIALS})

_NUMERIC = re.compile(r"^\d+(\.\d+)?$")
Value = int | str | None


def _fraction(value: int | str) -> Fraction | None:
    try:
        return Fraction(value)
    except ValueError:
        return None


def _add_ones(value: Value, ones: int, prev: str | None) -> int | str:
    """Append a 1-19 word to the pending number ("twenty" + "one" = 21, "one" + "one" = "11")."""
    if value is None:
        return ones
    if isinstance(value, str) or prev in ONES:
        if prev in TENS and ones < 10:
            assert str(value)[-1] == "0", value  # "...twenty" always ends in 0
            return str(value)[:-1] + str(ones)
        return f"{value}{ones}"
    unit = 10 if ones < 10 else 100  # "twenty" + "one" adds; "twenty" + "eleven" is read as digits
    return value + ones if value % unit == 0 else f"{value}{ones}"


def _add_tens(value: Value, tens: int) -> int | str:
    if value is None:
        return tens
    if isinstance(value, int) and value % 100 == 0:
        return value + tens
    return f"{value}{tens}"


def _scale(value: Value, multiplier: int) -> tuple[list[Value], int | str]:
    """Apply "hundred", "million", ...: returns (numbers finished first, the new pending value)."""
    if value is None:
        return [], multiplier
    if isinstance(value, str) or value == 0:
        f = _fraction(value)
        if f is not None and (f * multiplier).denominator == 1:
            return [], (f * multiplier).numerator  # "1.5 million" -> 1500000
        return [value], multiplier
    # only the last three digits are scaled: "two thousand three hundred" -> 2000 + 3 * 100
    return [], value // 1000 * 1000 + value % 1000 * multiplier


class EnglishNumberNormalizer:
    """Digits for spelled-out numbers, ordinal/plural suffixes kept, currency symbols before numbers."""

    def __call__(self, s: str) -> str:
        s = self.preprocess(s)
        s = " ".join(self.process_words(s.split()))
        return self.postprocess(s)

    def process_words(self, words: list[str]) -> Iterator[str]:
        state = _State()
        padded: list[str | None] = [None, *words, None]
        skip = False
        for prev, current, nxt in zip(padded, padded[1:], padded[2:]):
            assert current is not None
            if skip:
                skip = False
                continue
            skip = yield from state.step(prev, current, nxt)
        if state.value is not None:
            yield state.emit(state.value)

    @staticmethod
    def preprocess(s: str) -> str:
        # "<number> and a half" -> "<number> point five"; segments that are blank are dropped
        # (whisper does the same, "and a half" included).
        parts = re.split(r"\band\s+a\s+half\b", s)
        out: list[str] = []
        for i, part in enumerate(parts):
            if not part.strip():
                continue
            out.append(part)
            if i < len(parts) - 1:
                last = part.rsplit(maxsplit=2)[-1]
                out.append("point five" if last in DECIMALS or last in MULTIPLIERS else "and a half")
        s = " ".join(out)
        s = re.sub(r"([a-z])([0-9])", r"\1 \2", s)
        s = re.sub(r"([0-9])([a-z])", r"\1 \2", s)
        return re.sub(r"([0-9])\s+(st|nd|rd|th|s)\b", r"\1\2", s)  # re-attach "1960 s"

    @staticmethod
    def postprocess(s: str) -> str:
        def join_cents(m: re.Match[str]) -> str:
            return f"{m.group(1)}{m.group(2)}.{int(m.group(3)):02d}"

        s = re.sub(r"([€£$])([0-9]+) (?:and )?¢([0-9]{1,2})\b", join_cents, s)  # "$2 and ¢7" -> "$2.07"
        # NOTE: the unescaped "." matches any character, exactly as in whisper.
        s = re.sub(r"[€£$]0.([0-9]{1,2})\b", lambda m: f"¢{int(m.group(1))}", s)
        return re.sub(r"\b1(s?)\b", r"one\1", s)  # "one(s)" reads better than "1(s)"


class _State:
    """The pending number and prefix symbol while walking the words of one string."""

    def __init__(self) -> None:
        self.value: Value = None
        self.prefix: str | None = None

    def emit(self, item: int | str) -> str:
        out = f"{self.prefix or ''}{item}"
        self.value = None
        self.prefix = None
        return out

    def flush(self) -> Iterator[str]:
        if self.value is not None:
            yield self.emit(self.value)

    def step(self, prev: str | None, cur: str, nxt: str | None) -> Generator[str, None, bool]:
        """Consume one word; the generator's return value says whether to skip the next word."""
        next_numberlike = nxt in NUMBER_WORDS or (nxt is not None and _NUMERIC.match(nxt) is not None)
        has_prefix = cur[0] in PREFIX_SYMBOLS
        bare = cur[1:] if has_prefix else cur
        if _NUMERIC.match(bare):  # digits, maybe with a sign/currency and a decimal part
            yield from self._digits(cur, bare, has_prefix)
        elif cur not in NUMBER_WORDS:
            yield from self.flush()
            yield self.emit(cur)
        elif cur in _CARDINAL_WORDS:
            yield from self._cardinal(prev, cur)
        elif cur in PRECEDING_PREFIXERS:  # "minus five" -> "-5", only before a number
            yield from self.flush()
            if next_numberlike:
                self.prefix = PRECEDING_PREFIXERS[cur]
            else:
                yield self.emit(cur)
        elif cur in FOLLOWING_PREFIXERS:  # "five dollars" -> "$5", only after a number
            if self.value is not None:
                self.prefix = FOLLOWING_PREFIXERS[cur]
                yield self.emit(self.value)
            else:
                yield self.emit(cur)
        elif cur in ("per", "percent"):
            return (yield from self._percent(cur, nxt))
        else:
            return (yield from self._special(prev, cur, nxt, next_numberlike))
        return False

    def _digits(self, cur: str, bare: str, has_prefix: bool) -> Iterator[str]:
        if isinstance(self.value, str) and self.value.endswith("."):
            self.value += cur  # "3 point 14", or IP-address-like runs
            return
        yield from self.flush()
        if has_prefix:
            self.prefix = cur[0]
        f = _fraction(bare)
        assert f is not None
        self.value = f.numerator if f.denominator == 1 else bare

    def _cardinal(self, prev: str | None, cur: str) -> Iterator[str]:
        """zero..nineteen, the tens and the multipliers, with their plural and ordinal forms."""
        if cur in ZEROS:
            self.value = f"{self.value or ''}0"
        elif cur in ONES:
            self.value = _add_ones(self.value, ONES[cur], prev)
        elif cur in ONES_SUFFIXED:
            ones, suffix = ONES_SUFFIXED[cur]
            yield self.emit(f"{_add_ones(self.value, ones, prev)}{suffix}")
        elif cur in TENS:
            self.value = _add_tens(self.value, TENS[cur])
        elif cur in TENS_SUFFIXED:
            tens, suffix = TENS_SUFFIXED[cur]
            yield self.emit(f"{_add_tens(self.value, tens)}{suffix}")
        elif cur in MULTIPLIERS:
            scaled = yield from self._apply_scale(MULTIPLIERS[cur])
            self.value = scaled  # after emit(), which clears the pending value
        else:
            multiplier, suffix = MULTIPLIERS_SUFFIXED[cur]
            scaled = yield from self._apply_scale(multiplier)
            yield self.emit(f"{scaled}{suffix}")

    def _apply_scale(self, multiplier: int) -> Generator[str, None, int | str]:
        done, scaled = _scale(self.value, multiplier)
        for item in done:
            assert item is not None
            yield self.emit(item)
        return scaled

    def _percent(self, cur: str, nxt: str | None) -> Generator[str, None, bool]:
        if self.value is None:
            yield self.emit(cur)
        elif cur == "percent":
            yield self.emit(f"{self.value}%")
        elif nxt == "cent":  # "per cent"
            yield self.emit(f"{self.value}%")
            return True
        else:
            yield from self.flush()
            yield self.emit(cur)
        return False

    def _special(self, prev: str | None, cur: str, nxt: str | None,
                 next_numberlike: bool) -> Generator[str, None, bool]:
        """"and", "double", "triple", "point": numeric only when a number word follows."""
        if not next_numberlike:
            yield from self.flush()
            yield self.emit(cur)
        elif cur == "and":
            if prev not in MULTIPLIERS:  # "hundred and five" keeps counting; otherwise a plain word
                yield from self.flush()
                yield self.emit(cur)
        elif cur in ("double", "triple"):
            if nxt in ONES or nxt in ZEROS:
                digit = ONES.get(nxt, 0) if nxt is not None else 0
                self.value = f"{self.value or ''}{str(digit) * (2 if cur == 'double' else 3)}"
                return True
            yield from self.flush()
            yield self.emit(cur)
        elif nxt in DECIMALS or (nxt is not None and _NUMERIC.match(nxt)):  # "point"
            self.value = f"{self.value or ''}."
        return False
