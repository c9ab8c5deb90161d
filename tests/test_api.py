"""The Python API (api.Transcriber) on real tiny.en: paths, bytes, arrays with their rate, lists and
pairs, records against the OpenAI SDK's types; the README's own snippet, run as written."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from batchscribe.audio.decode import decode_audio
from tests.engine.helpers import greedy_transcriber
from tests.engine.helpers import openai_wer as _wer
from tests.engine.helpers import check_record as _check_record

pytest.importorskip("openai.types.audio")

DEMO = Path(__file__).resolve().parents[1] / "batchscribe" / "demo"


@pytest.fixture(scope="module")
def transcriber(tiny_en_dir):
    return greedy_transcriber(tiny_en_dir)


def test_jfk(transcriber, shared_data) -> None:
    record = transcriber.transcribe(decode_audio(shared_data / "misc" / "jfk.flac"), sample_rate=16000)
    _check_record(record)
    expected = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
    assert _wer(expected, record["text"]) == 0.0
    assert record["language"] == "english" and record["duration"] == pytest.approx(11.0)
    assert record["segments"][0]["start"] == 0.0
    seg = record["segments"][0]
    assert 0.0 <= seg["no_speech_prob"] < 0.2 and -1.0 < seg["avg_logprob"] < 0.0


def test_engine_options_are_resolved_once_and_described(tiny_en_dir) -> None:
    """EngineOptions (or the same fields as keywords, not both) resolve into the transcriber's
    EngineConfig; describe() reports it and the identity a resume checks."""
    from batchscribe.api import Transcriber
    from batchscribe.config import ConfigError, EngineOptions

    t = Transcriber(str(tiny_en_dir), engine=EngineOptions(device="cpu", batch_size=3, cuda_graphs=False))
    assert t.config.device.type == "cpu" and t.config.n_slots == t.n_slots == 3 and not t.config.cuda_graphs
    described = t.describe()
    weights = hashlib.sha256((tiny_en_dir / "model.safetensors").read_bytes()).hexdigest()
    assert described["identity"] == {"dtype": "float32", "attention": "sdpa/sdpa/float32", "batch_invariant": False,
                                     "weights_sha256": hashlib.sha256(f"model.safetensors\0{weights}\n".encode()).hexdigest()}
    assert described["engine"]["batch_size"] == 3 and described["engine"]["device"] == "cpu"
    from batchscribe.engine.sizing import host_audio_bytes

    assert described["engine"]["audio_memory_gb"] == round(host_audio_bytes() / 1e9, 3)  # the budget in force
    assert t.scheduler().engine.n_slots == 3
    with pytest.raises(ConfigError, match="not both"):
        Transcriber(str(tiny_en_dir), device="cpu", engine=EngineOptions(device="cpu"))
    with pytest.raises(ConfigError, match="not a device"):
        Transcriber(str(tiny_en_dir), device="gpu0")
    invariant = Transcriber(str(tiny_en_dir), device="cpu", batch_invariant=True)
    assert invariant.describe()["identity"] == {**described["identity"], "batch_invariant": True}
    if importlib.util.find_spec("silero_vad") is not None:  # --vad's detector: at fixed shapes only then
        assert invariant.speech_detector()._sequence.rows and t.speech_detector()._sequence.rows is None


README = Path(__file__).resolve().parents[1] / "README.md"


def _reference(shared_data: Path, item_id: str) -> str:
    rows = [json.loads(line) for line in (shared_data / "extras.jsonl").read_text().splitlines() if line.strip()]
    return next(r["text"] for r in rows if r["id"] == item_id)


def test_readme_python_snippet_runs_as_written(tiny_en_dir, model_cache, shared_data, tmp_path, monkeypatch) -> None:
    """The README's Python API block, unedited, on an ordinary file: jfk.flac is 44.1 kHz stereo."""
    import soundfile as sf

    section = README.read_text().split("## Python API", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    shutil.copy(shared_data / "misc" / "jfk.flac", tmp_path / "clip.flac")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BATCHSCRIBE_CACHE", str(model_cache))  # "tiny.en" is then a cache hit
    printed = io.StringIO()
    namespace: dict = {}
    with contextlib.redirect_stdout(printed):
        exec(compile(snippet, "README.md", "exec"), namespace)
    info = sf.info(tmp_path / "clip.flac")
    assert (info.channels, info.samplerate) == (2, 44100)  # the case the snippet must survive
    reference = _reference(shared_data, "jfk")
    record, records = namespace["record"], namespace["records"]
    _check_record(record)
    assert record["duration"] == pytest.approx(info.duration, abs=0.01)
    assert _wer(reference, record["text"]) < 0.1
    assert [r["id"] for r in records] == ["a", "b"]
    for r in records:
        assert _wer(reference, r["text"]) < 0.1 and r["duration"] == pytest.approx(info.duration, abs=0.01)
    lines = printed.getvalue().splitlines()
    assert lines[0] == record["text"]
    streamed = dict(line.rsplit(" ", 1) for line in lines[1:])
    assert {k: float(v) for k, v in streamed.items()} == pytest.approx({"a": info.duration, "b": 5.0}, abs=0.01)


def test_paths_bytes_and_resampled_arrays_agree(transcriber, shared_data) -> None:
    """A path, its bytes and soundfile's 44.1 kHz samples (mixed to mono, with their rate) are one audio."""
    import soundfile as sf

    path = shared_data / "misc" / "jfk.flac"
    frames, rate = sf.read(path, dtype="float32", always_2d=True)
    by_path, by_bytes, by_array = transcriber.transcribe(
        [str(path), ("bytes", path.read_bytes()), ("array", frames.mean(axis=1))], sample_rate=rate)
    assert by_path["id"] == str(path)
    reference = _reference(shared_data, "jfk")
    for r in (by_path, by_bytes, by_array):
        _check_record(r)
        assert r["duration"] == pytest.approx(frames.shape[0] / rate, abs=0.01)
        assert _wer(reference, r["text"]) < 0.1
    assert by_bytes["text"] == by_path["text"]


@pytest.mark.parametrize("audio, kwargs, message", [
    (np.zeros((485100, 2), np.float32), dict(sample_rate=44100), r"shape \(485100, 2\).*mono.*audio.mean\(axis=1\)"),
    (np.zeros((2, 48000), np.float32), dict(sample_rate=48000), r"shape \(2, 48000\).*audio.mean\(axis=0\)"),
    ([("x", np.zeros((16000, 2), np.float32))], dict(sample_rate=16000), r"audio for 'x' has shape \(16000, 2\)"),
    (np.zeros(16000, np.float32), {}, r"no sample rate; pass sample_rate="),
    (np.zeros(16000, np.int16), dict(sample_rate=16000), r"dtype int16.*astype\(np.float32\) / 32768"),
    (np.full(16000, np.nan, np.float32), dict(sample_rate=16000), r"16000 NaN or Inf"),
    (np.zeros(16000, np.float32), dict(sample_rate=0), r"sample_rate=0 must be a positive"),
])
def test_audio_that_is_not_mono_float_with_a_rate_is_refused(transcriber, audio, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        transcriber.transcribe(audio, **kwargs)


def test_missing_path_names_it(transcriber, tmp_path) -> None:
    from batchscribe.audio.decode import AudioDecodeError

    with pytest.raises(AudioDecodeError, match="nope.flac.*does not exist"):
        transcriber.transcribe(str(tmp_path / "nope.flac"))


def test_a_file_that_cannot_be_decoded_costs_a_batch_only_its_own_record(transcriber, tmp_path) -> None:
    """As in `batchscribe run`: among several items, a missing or corrupt file becomes its error
    record and the others are transcribed (the whole call raised, losing them). Reference: each
    good item transcribed alone."""
    from openai.types.audio import TranscriptionVerbose

    good = sorted(str(p) for p in DEMO.glob("*.flac"))[:2]
    corrupt = tmp_path / "corrupt.flac"
    corrupt.write_bytes(b"fLaC" + bytes(300))
    missing = str(tmp_path / "nope.flac")
    records = transcriber.transcribe([good[0], missing, str(corrupt), good[1]])
    assert [r["id"] for r in records] == [good[0], missing, str(corrupt), good[1]]
    assert "does not exist" in records[1]["error"] and records[2]["error"]
    for k in (0, 3):
        assert "error" not in records[k]
        assert records[k]["text"] == transcriber.transcribe(records[k]["id"])["text"]
        TranscriptionVerbose.model_validate(records[k])
    streamed = list(transcriber.transcribe_stream([("a", missing), ("b", good[0])]))
    assert sorted(r["id"] for r in streamed) == ["a", "b"] and "error" in {r["id"]: r for r in streamed}["a"]
    with pytest.raises(TypeError, match="a path, bytes, an array or a list"):
        transcriber.transcribe(5)


@pytest.mark.parametrize("audio, message", [
    ({"array": np.zeros(16000, np.float32), "sampling_rate": 16000, "path": "a.wav"},
     r"argument is a dict with 'array' \(a Hugging Face datasets audio cell\).*sample_rate=audio\['sampling_rate'\]"),
    ({"a": "clip.flac"}, r"argument is a dict; pass a list of \(id, item\) pairs"),
    ([{"array": np.zeros(16000, np.float32), "sampling_rate": 16000}], r"audio for '0' is a dict with 'array'"),
])
def test_a_dict_is_refused_naming_what_to_pass(transcriber, audio, message) -> None:
    """A dict was iterated as a list of items: a Hugging Face audio cell {array, sampling_rate,
    path} came back as three error records for missing files 'array', 'sampling_rate', 'path'."""
    with pytest.raises(TypeError, match=message):
        transcriber.transcribe(audio)


def test_nan_audio_becomes_its_error_record_in_a_stream_or_a_list(transcriber) -> None:
    """float32 16 kHz arrays take the stream's fast path (no copy); one holding NaN went through
    it and came back as a confident transcript of nothing. Now it is its own error record and the
    other items are transcribed (reference: the good item alone)."""
    good = np.zeros(16000, np.float32)
    good[::50] = 0.5
    bad = good.copy()
    bad[100] = np.nan
    streamed = {r["id"]: r for r in transcriber.transcribe_stream([("bad", bad), ("good", good)])}
    assert "1 NaN or Inf samples" in streamed["bad"]["error"] and "error" not in streamed["good"]
    assert streamed["good"]["text"] == transcriber.transcribe([("good", good)], sample_rate=16000)[0]["text"]
    listed = transcriber.transcribe([("bad", bad.astype(np.float64)), ("good", good)], sample_rate=16000)
    assert "1 NaN or Inf samples" in listed[0]["error"] and listed[1]["text"] == streamed["good"]["text"]
    with pytest.raises(ValueError, match="sample_rate=0 must be a positive"):
        list(transcriber.transcribe_stream([("good", good)], sample_rate=0))


def test_a_bare_id_audio_tuple_is_refused_naming_the_list_to_pass(transcriber) -> None:
    """transcribe(("utt1", samples)) was read as two items: a missing file 'utt1' and item '1'."""
    with pytest.raises(TypeError, match=r"got a tuple \('utt1', ndarray\).*\[\('utt1', audio\)\]"):
        transcriber.transcribe(("utt1", np.zeros(16000, np.float32)), sample_rate=16000)


@pytest.mark.parametrize("entry, named", [
    ("clip.flac", r"the bare path 'clip.flac'"),
    (np.zeros(16000, np.float32), r"a ndarray"),
    (("a", "b", "c", "d"), r"a tuple of 4 elements"),
])
def test_a_stream_entry_that_is_not_an_id_audio_pair_is_refused(transcriber, entry, named) -> None:
    """transcribe_stream takes (id, audio) pairs. A bare path was unpacked into its characters (id
    '/', audio 'w') and came back as an error record for a file 'w' under a made-up id."""
    with pytest.raises(TypeError, match=rf"takes \(id, audio\) pairs, not {named}"):
        list(transcriber.transcribe_stream([entry]))


@pytest.mark.skipif(importlib.util.find_spec("silero_vad") is None, reason="needs pip install 'batchscribe[vad]'")
def test_vad_found_in_batches_gives_the_per_item_records_and_an_error_for_a_bad_item(transcriber, utterances) -> None:
    """--vad through transcribe_stream (speech found ahead, in batches, on worker threads) against
    each item's speech found alone (the detector on one item) and handed in: the same records.
    A NaN array becomes an error record naming it (the stream's check, before the detector); the
    stage's threads are gone once the stream ends."""
    import dataclasses
    import threading

    from batchscribe.output.verbose_json import transcript_record

    options = dataclasses.replace(transcriber.options, vad=True)
    rng = np.random.default_rng(0)
    quiet = [rng.normal(0, 1e-4, int(s * 16000)).astype(np.float32) for s in (3.0, 11.0)]
    spliced = np.concatenate([quiet[0], utterances[0][1], quiet[1], utterances[1][1], quiet[0]])
    items = [("spliced", spliced), *utterances[2:8]]
    detector = transcriber.speech_detector()  # each item's speech found alone, handed to the scheduler
    alone = [(i, a, None, detector.detect([a])[0]) for i, a in items]
    per_item = {t.id: transcript_record(t) for t in transcriber.build_scheduler(options).run(iter(alone))}
    bad = ("nan", np.full(16000 * 4, np.nan, dtype=np.float32))
    batched = {r["id"]: r for r in transcriber.transcribe_stream([*items[:3], bad, *items[3:]], options)}
    error = batched.pop("nan")
    assert error == {"id": "nan", "error": error["error"], "duration": None}
    assert error["error"].startswith("audio for 'nan' has 64000 NaN or Inf samples")
    assert batched == per_item and per_item["spliced"]["text"].strip()
    assert not [t for t in threading.enumerate() if t.name.startswith("batchscribe-vad")]
