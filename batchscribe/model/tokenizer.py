"""Whisper's tokenizer: a `tokenizers.Tokenizer` (tokenizer.json) plus the special ids decoding needs.

Every special id is read from the vocabulary, never hard-coded: the ids move between vocabularies
(the first timestamp token is 50363 for tiny.en, 50364 for multilingual base, 50365 for large-v3).
The rules that build suppress lists and sot sequences follow openai/whisper (`tokenizer.py`,
`decoding.py`), so the ids equal openai's for the same model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

import tokenizers

from batchscribe.config import ConfigError
from batchscribe.bpe_merges import restore_missing_merges
from batchscribe.model.languages import LANGUAGES, language_code, language_name

# openai's vocabularies: 51864 ids for English-only models, 51865 (99 languages) or 51866
# (100 languages, large-v3) for multilingual ones.
_FIRST_MULTILINGUAL_VOCAB = 51865
_N_TIMESTAMPS = 1501  # <|0.00|> .. <|30.00|> in steps of 0.02 s

# Symbols whose tokens openai suppresses with suppress_tokens="-1": speaker tags, music notes and
# bracketed annotations ("[MUSIC]", "(laughs)") that are not speech; plain punctuation stays allowed.
_NON_SPEECH_SYMBOLS: tuple[str, ...] = (
    *'"#()*+/:;<=>@[\\]^_`{|}~「」『』',
    *"<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split(),
)
# U+2640..U+267F music symbols: when one spans several tokens, suppressing its first token is safe
# because all of them share their first two UTF-8 bytes (openai's reasoning, same rule).
_MUSIC_SYMBOLS: tuple[str, ...] = tuple("♩♪♫♬♭♮♯")

_LANGUAGE_TOKEN = re.compile(r"<\|([a-z]{2,3})\|>")
# Older English-only vocabularies (tiny.en's) spell Hebrew with the retired ISO code "iw".
_LEGACY_CODES = {"iw": "he"}
_TASKS = ("transcribe", "translate")


class TokenizerError(ValueError):
    """A tokenizer.json that cannot serve Whisper decoding, or a language/task it cannot encode."""


class LanguageError(TokenizerError, ConfigError):
    """A language or task the model cannot decode: a usage error (the CLI exits 2), raised before
    the weights load."""


class Tokenizer:
    """Whisper token ids and text <-> token conversion (openai semantics, HF tokenizer.json)."""

    def __init__(
        self,
        inner: tokenizers.Tokenizer,
        *,
        multilingual: bool | None = None,
        source: str = "tokenizer.json",
    ) -> None:
        self._inner = inner
        self._source = source
        self.n_vocab: int = inner.get_vocab_size(with_added_tokens=True)

        self.eot = self._special("<|endoftext|>")
        self.sot = self._special("<|startoftranscript|>")
        self.sot_prev = self._special("<|startofprev|>")
        self.sot_lm = self._special("<|startoflm|>")
        self.transcribe = self._special("<|transcribe|>")
        self.translate = self._special("<|translate|>")
        self.no_timestamps = self._special("<|notimestamps|>")
        # openai renamed <|nocaptions|> to <|nospeech|>; older tokenizer.json files keep the old name.
        self.no_speech = self._special("<|nospeech|>", "<|nocaptions|>")
        self.timestamp_begin = self._timestamp_begin()

        # Language tokens sit between <|startoftranscript|> and <|translate|>, in LANGUAGES order.
        # English-only vocabularies (tiny.en) still hold them; the model never uses them.
        self.language_tokens: dict[str, int] = {}
        for token_id in range(self.sot + 1, self.translate):
            match = _LANGUAGE_TOKEN.fullmatch(inner.id_to_token(token_id) or "")
            code = _LEGACY_CODES.get(match.group(1), match.group(1)) if match else None
            if code in LANGUAGES:
                self.language_tokens[code] = token_id

        # The vocabulary size is the reliable signal: tiny.en's vocabulary has language tokens too.
        self.is_multilingual: bool = (
            self.n_vocab >= _FIRST_MULTILINGUAL_VOCAB if multilingual is None else multilingual
        )
        if self.is_multilingual and not self.language_tokens:
            raise TokenizerError(
                f"{source}: multilingual model but no <|xx|> language tokens between "
                f"<|startoftranscript|> ({self.sot}) and <|translate|> ({self.translate})"
            )

    @classmethod
    def from_folder(cls, path: str | Path, *, multilingual: bool | None = None) -> Tokenizer:
        """Load `path/tokenizer.json`; `multilingual` overrides detection from the vocabulary size."""
        file = Path(path) / "tokenizer.json"
        if not file.is_file():
            raise TokenizerError(
                f"{file} does not exist; pass a Hugging Face Whisper model folder "
                "(convert CTranslate2 folders with batchscribe.weights.resolve_model)"
            )
        text = file.read_text(encoding="utf-8")
        data = json.loads(text)
        inner = tokenizers.Tokenizer.from_str(json.dumps(data) if restore_missing_merges(data) else text)
        return cls(inner, multilingual=multilingual, source=str(file))

    # -- special ids ---------------------------------------------------------------------------

    def _special(self, *names: str) -> int:
        for name in names:
            token_id = self._inner.token_to_id(name)
            if token_id is not None:
                return token_id
        raise TokenizerError(
            f"{self._source} has no {' or '.join(names)} token; it is not a Whisper tokenizer"
        )

    def _timestamp_begin(self) -> int:
        first = self._inner.token_to_id("<|0.00|>")
        last = self._inner.token_to_id("<|30.00|>")
        if first is None:
            raise TokenizerError(
                f"{self._source} lacks the timestamp tokens <|0.00|>..<|30.00|>; CTranslate2 "
                "packages ship it that way: load the model through batchscribe.weights.resolve_model "
                "(loading converts it and adds the 1501 tokens after <|notimestamps|>)"
            )
        # The logit rules treat every id >= timestamp_begin as a timestamp: they must be contiguous.
        if last != first + _N_TIMESTAMPS - 1:
            raise TokenizerError(
                f"{self._source}: timestamp tokens are not contiguous (<|0.00|>={first}, "
                f"<|30.00|>={last}, expected {first + _N_TIMESTAMPS - 1}); regenerate tokenizer.json"
            )
        return first

    # -- language and task ---------------------------------------------------------------------

    def language_code(self, language: str) -> str:
        """Validate a code ("en") or English name ("English") against this vocabulary's languages."""
        code = language_code(language)
        if code is None or code not in self.language_tokens:
            valid = ", ".join(self.language_tokens) or "en"
            what = "is not a Whisper language" if code is None else f"({language_name(code)}) is not in this model's vocabulary"
            raise LanguageError(f"language {language!r} {what}; use 'auto' to detect it, or one of: {valid}")
        return code

    def language_name(self, code: str) -> str:
        return language_name(code)

    def sot_sequence(
        self, language: str | None = None, task: str = "transcribe", without_timestamps: bool = False
    ) -> tuple[int, ...]:
        """The forced decoder prefix, as openai's Tokenizer.sot_sequence (+ <|notimestamps|>).

        English-only models: (sot,). Multilingual: (sot, language, task); with language=None the
        language token is left out, as openai does (detect the language first to decode).
        """
        if task not in _TASKS:
            raise LanguageError(f"task {task!r} is not supported; use 'transcribe' or 'translate'")
        sequence = [self.sot]
        if self.is_multilingual:
            if language is not None:
                sequence.append(self.language_tokens[self.language_code(language)])
            sequence.append(self.transcribe if task == "transcribe" else self.translate)
        else:
            code = None if language is None else language_code(language)
            if language is not None and code != "en":
                what = ("is not a Whisper language, and this model is English-only" if code is None
                        else f"({language_name(code)}) cannot be decoded by an English-only model")  # fmt: skip
                raise LanguageError(
                    f"language {language!r} {what}; use 'en' or 'auto' (--language en, or leave it out), "
                    "or a multilingual model (e.g. 'base')"
                )
            if task != "transcribe":
                raise LanguageError(
                    "task 'translate' needs a multilingual model (e.g. 'base'); "
                    "English-only models only transcribe"
                )
        if without_timestamps:
            sequence.append(self.no_timestamps)
        return tuple(sequence)

    # -- text ----------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Text -> ids without the template's special tokens (tiktoken's byte-level BPE result)."""
        return self._inner.encode(text, add_special_tokens=False).ids

    def decode(self, tokens: Sequence[int]) -> str:
        """Ids -> text, dropping every special and timestamp token (ids >= eot)."""
        text = _join(self._decode_table, tokens)
        if text is not None:
            return text
        eot = self.eot  # an id outside the vocabulary (or negative): `tokenizers` decides
        return self._inner.decode([t for t in tokens if t < eot], skip_special_tokens=False)

    def decode_without_timestamps(self, tokens: Sequence[int]) -> str:
        """Ids -> text, dropping timestamps but writing special tokens inline (openai's Tokenizer.decode)."""
        text = _join(self._without_timestamps_table, tokens)
        if text is not None:
            return text
        tb = self.timestamp_begin  # a special token (or an unknown id): decoded run by run
        return self.decode_with_timestamps([t for t in tokens if t < tb])

    def decode_with_timestamps(self, tokens: Sequence[int]) -> str:
        """Ids -> text with special and timestamp tokens written inline, e.g. "<|1.08|> Hello<|2.00|>"."""
        parts: list[str] = []
        run: list[int] = []
        for token in tokens:
            if token < self.eot:
                run.append(token)
                continue
            if run:
                parts.append(self.decode(run))
                run = []
            parts.append(self._inner.id_to_token(token) or f"<|id:{token}|>")
        if run:
            parts.append(self.decode(run))
        return "".join(parts)

    # The GPU engine's one host thread decodes every window and segment. A Rust call per decode
    # cost more than the decoding itself, so text is decoded here from these tables of bytes.

    def build_decode_tables(self) -> None:
        """Build the tables now (a few tenths of a second), not at the run's first decoded window:
        the Transcriber does it while the GPU libraries load."""
        _ = self._without_timestamps_table

    @cached_property
    def _decode_table(self) -> dict[int, bytes] | None:
        """decode's: each text token's bytes, and b"" for every special and timestamp id it drops.
        None where the decoder is not byte-level BPE (`tokenizers` decodes then)."""
        text = self._text_token_bytes()
        return None if text is None else text | dict.fromkeys(range(self.eot, self.n_vocab), b"")

    @cached_property
    def _without_timestamps_table(self) -> dict[int, bytes] | None:
        """decode_without_timestamps': text tokens and timestamps (b""); specials are absent, so a
        window that sampled one (rare) is decoded run by run, with the special written inline."""
        table, eot, tb = self._decode_table, self.eot, self.timestamp_begin
        return None if table is None else {i: b for i, b in table.items() if not eot <= i < tb}

    def _text_token_bytes(self) -> dict[int, bytes] | None:
        """The bytes of every text token (ids < eot), as `tokenizers`' ByteLevel decoder sees them.

        That decoder maps each character of each token to the byte it stands for (a token with a
        character outside the 256-symbol alphabet keeps its UTF-8 bytes), joins the bytes and
        decodes them with replacement characters, as openai's Tokenizer.decode does with tiktoken's
        bytes; `_join` does the same.
        """
        if not isinstance(self._inner.decoder, tokenizers.decoders.ByteLevel):
            return None
        symbols = _byte_level_symbols()
        if set(symbols) != set(tokenizers.pre_tokenizers.ByteLevel.alphabet()):
            return None
        added = self._inner.get_added_tokens_decoder()  # decoded as they are, not byte by byte
        # Symbol -> the code point of its byte: str.translate then latin-1 give a token's bytes in C,
        # not a generator per character (start-up builds this for every one of ~50k tokens).
        to_bytes, alphabet = str.maketrans(symbols), frozenset(symbols)
        table: dict[int, bytes] = {}
        for token, token_id in self._inner.get_vocab(with_added_tokens=False).items():
            if token_id < self.eot and token_id not in added:
                if alphabet.issuperset(token):
                    table[token_id] = token.translate(to_bytes).encode("latin-1")
                else:
                    table[token_id] = token.encode("utf-8")
        return table

    # -- suppression lists ---------------------------------------------------------------------

    @cached_property
    def _non_speech(self) -> tuple[int, ...]:
        # Hyphen and apostrophe stay allowed between words, never at the start of one.
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in _NON_SPEECH_SYMBOLS + _MUSIC_SYMBOLS:
            for ids in (self.encode(symbol), self.encode(" " + symbol)):
                if len(ids) == 1 or symbol in _MUSIC_SYMBOLS:
                    result.add(ids[0])
        return tuple(sorted(result))

    def non_speech_tokens(self) -> tuple[int, ...]:
        """openai's non-speech set (what suppress_tokens="-1" adds), sorted."""
        return self._non_speech

    def suppress_token_ids(
        self, spec: str | Sequence[int], model_suppress: Sequence[int] = ()
    ) -> tuple[int, ...]:
        """Resolve a suppress_tokens setting as openai DecodingTask._get_suppress_tokens does.

        `spec` is "-1", "1,2,-1", "" or a sequence of ids. -1 stands for the non-speech set plus
        the model's own list (generation_config suppress_tokens / CT2 suppress_ids). The task,
        sot, sot_prev, sot_lm and no_speech tokens are always added; no_speech_prob is read from
        the logits separately, so <|nospeech|> is never sampled.
        """
        ids = _parse_ids(spec) if isinstance(spec, str) else [int(t) for t in spec]
        bad = [t for t in [*ids, *model_suppress] if t < -1 or t >= self.n_vocab]
        if bad:
            raise TokenizerError(
                f"suppress_tokens {bad} are outside 0..{self.n_vocab - 1} (or -1 for the non-speech set)"
            )
        result = {t for t in ids if t >= 0}
        if -1 in ids:
            result.update(self.non_speech_tokens())
            result.update(model_suppress)
        result.update(
            (self.transcribe, self.translate, self.sot, self.sot_prev, self.sot_lm, self.no_speech)
        )
        return tuple(sorted(result))

    def blank_tokens(self) -> tuple[int, ...]:
        """Suppressed at the first sampled position (openai SuppressBlank): a space and eot."""
        return (*self.encode(" "), self.eot)


def _join(table: dict[int, bytes] | None, tokens: Sequence[int]) -> str | None:
    """The tokens' bytes joined and decoded as UTF-8, invalid bytes as U+FFFD (both loops run in C);
    None without a table or for an id the table lacks (the caller then decodes another way)."""
    if table is None:
        return None
    try:
        return b"".join(map(table.__getitem__, tokens)).decode("utf-8", "replace")
    except KeyError:
        return None


def _byte_level_symbols() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, symbol -> the byte it stands for: printable Latin-1 bytes
    stand for themselves, the other 68 bytes take the code points from U+0100 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols = {chr(b): b for b in printable}
    others = [b for b in range(256) if chr(b) not in symbols]
    symbols.update({chr(0x100 + n): b for n, b in enumerate(others)})
    return symbols


def _parse_ids(spec: str) -> list[int]:
    items = [item.strip() for item in spec.split(",") if item.strip()]
    try:
        return [int(item) for item in items]
    except ValueError:
        raise TokenizerError(
            f"suppress_tokens {spec!r} is not a comma-separated list of token ids; e.g. '-1' or '-1,220'"
        ) from None
