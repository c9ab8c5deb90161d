"""Word timestamps end to end (engine/alignment.py, windows.py's word stage, the record fields) on
real tiny.en against openai-whisper's transcribe(word_timestamps=True) with the same weights; the
records validate as the OpenAI SDK's TranscriptionVerbose. (Graph replay against eager:
tests/engine/test_graph_replay_options.py, which the GPU image can run without openai-whisper.)"""

from __future__ import annotations


import numpy as np
import pytest

from tests.engine.helpers import GREEDY, check_record, openai_model

pytest.importorskip("openai.types.audio")
whisper = pytest.importorskip("whisper")


@pytest.fixture(scope="module")
def tiny_words(tiny_en_dir):
    from batchscribe.api import Transcriber

    return Transcriber(str(tiny_en_dir), device="cpu", batch_size=8, word_timestamps=True, **GREEDY)


def _check_words(record: dict) -> None:
    from openai.types.audio import TranscriptionVerbose, TranscriptionWord

    check_record(record)
    parsed = TranscriptionVerbose.model_validate(record)
    assert parsed.words is not None and len(parsed.words) == sum(len(s["words"]) for s in record["segments"])
    for seg in record["segments"]:
        for w in seg["words"]:
            TranscriptionWord.model_validate(w)
            assert set(w) == {"word", "start", "end", "probability"} and 0 <= w["probability"] <= 1
            assert w["start"] <= w["end"]
    assert "".join(w["word"] for s in record["segments"] for w in s["words"]) == record["text"]


def test_words_match_openai_transcribe(tiny_words, tiny_en_dir, shared_data) -> None:
    import io

    import pyarrow.parquet as pq
    import soundfile as sf

    rows = pq.read_table(shared_data / "librispeech" / "test-clean-subset-00000-of-00001.parquet").to_pylist()
    # Clean read speech: tiny.en's decodes agree with openai-whisper's on most of it (the features
    # differ in the last bits, so a noisy utterance may decode to other words: not compared).
    rows += pq.read_table(shared_data / "librispeech" / "train-clean-5-00000-of-00008.parquet").to_pylist()[:16]
    items = [(r["id"], sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32")[0]) for r in rows]
    records = tiny_words.transcribe(items, sample_rate=16000)
    reference = openai_model(tiny_en_dir)
    agree, close, total = 0, 0, 0
    for (item_id, audio), record in zip(items, records):
        _check_words(record)
        ref = whisper.transcribe(reference, audio, temperature=0.0, condition_on_previous_text=False, fp16=False,
                                 language="en", word_timestamps=True)
        ours = [w for s in record["segments"] for w in s["words"]]
        theirs = [w for s in ref["segments"] for w in s["words"]]
        if [w["word"] for w in ours] != [w["word"] for w in theirs]:
            continue  # a different decode (features differ at the edges): nothing to compare
        agree += 1
        a = np.array([(w["start"], w["end"]) for w in ours])
        b = np.array([(w["start"], w["end"]) for w in theirs])
        close += int(np.sum(np.all(np.abs(a - b) <= 0.04 + 1e-9, axis=1)))
        total += len(ours)
        # The record's top-level words are the segments' words without probability.
        assert record["words"] == [{k: w[k] for k in ("word", "start", "end")} for w in ours]
    share = close / max(total, 1)
    print(f"\n{agree}/{len(items)} items decode alike; {total} words, {share:.2%} within 0.04 s of openai-whisper")
    assert agree >= len(items) // 2 and total >= 200 and share >= 0.95


def test_long_form_words_seek_like_openai(tiny_words, tiny_en_dir, shared_data) -> None:
    """Past 30 s, the next window starts at the last word's end (openai's word-timestamp seek)."""
    from batchscribe.audio.decode import decode_audio

    audio = decode_audio(shared_data / "longform" / "librispeech-concat" / "19-198-longform.flac")[: 16000 * 75]
    record = tiny_words.transcribe(audio, sample_rate=16000)
    _check_words(record)
    ref = whisper.transcribe(openai_model(tiny_en_dir), audio, temperature=0.0, condition_on_previous_text=False,
                             fp16=False, language="en", word_timestamps=True)
    ours, theirs = sorted({s["seek"] for s in record["segments"]}), sorted({s["seek"] for s in ref["segments"]})
    print(f"\nseeks ours {ours} openai {theirs}")
    assert len(ours) >= 3 and ours[:2] == theirs[:2]


def test_without_timestamps_words_seek_like_openai(tiny_en_dir, shared_data) -> None:
    """--without-timestamps --word-timestamps: a window has no timestamp to end on, so the next one
    starts at its last word's end, as openai's transcribe() does (its single_timestamp_ending is
    never true without timestamps), not 30 s on; a segment its words leave zero-length is emptied.
    The rule can leave a short remainder that is decoded again; on such a tail tiny.en may repeat a
    word ("you") where openai's decode is silent: its tail window's log-mel is padded with 0.0, ours
    is the log-mel of zero samples (features, not the seek rule), so the tail is not compared."""
    from batchscribe.api import Transcriber
    from batchscribe.audio.decode import decode_audio
    from tests.engine.helpers import openai_wer

    audio = decode_audio(shared_data / "longform" / "librivox-sonnets" / "p001.mp3")  # 53 s
    record = Transcriber(str(tiny_en_dir), device="cpu", batch_size=4, without_timestamps=True, word_timestamps=True,
                         **GREEDY).transcribe(audio, sample_rate=16000)  # fmt: skip
    _check_words(record)
    ref = whisper.transcribe(openai_model(tiny_en_dir), audio, temperature=0.0, condition_on_previous_text=False,
                             fp16=False, language="en", word_timestamps=True, without_timestamps=True)
    ours, theirs = record["segments"], ref["segments"]
    print(f"\nours {[(s['seek'], s['start'], s['end'], s['text'][-12:]) for s in ours]}"
          f"\nopenai {[(s['seek'], round(s['start'], 2), round(s['end'], 2), s['text'][-12:]) for s in theirs]}")
    # The speech windows: the second starts where the first's last word ends (29.98 s), in both.
    spoken = [s for s in theirs if s["text"]]
    assert [s["seek"] for s in spoken] == [s["seek"] for s in ours[: len(spoken)]] == [0, 2998]
    for a, b in zip(ours, spoken):
        assert abs(a["start"] - b["start"]) <= 0.04 and abs(a["end"] - b["end"]) <= 0.04
        assert openai_wer(b["text"], a["text"]) <= 0.05
    # Every next window starts at the last word's end of the one before.
    windows = [[s for s in ours if s["seek"] == seek] for seek in sorted({s["seek"] for s in ours})]
    for window, following in zip(windows, windows[1:]):
        words = [w for s in window for w in s["words"]]
        assert following[0]["seek"] == round(words[-1]["end"] * 100)
    # openai empties a segment whose words leave it no length; so do we. Anything more is the tail.
    for segments in (ours, theirs):
        assert all(s["start"] < s["end"] for s in segments if s["text"] or s["words"])
    assert all(s["start"] >= spoken[-1]["end"] - 0.04 for s in ours[len(spoken):])


def test_cli_run_with_word_timestamps_then_export(tmp_path, tiny_en_dir) -> None:
    """`run --word-timestamps` writes words (Parquet here); the setting is part of the folder's
    identity; `export` reads the records back."""
    from typer.testing import CliRunner

    from batchscribe.cli import app
    from tests.test_run import read_all

    runner, out = CliRunner(), tmp_path / "out"
    args = ["run", "--demo", "-o", str(out), "--model", str(tiny_en_dir), "--device", "cpu", "--format", "parquet",
            "--no-report", "--no-progress", "--temperature", "0"]
    done = runner.invoke(app, [*args, "--word-timestamps"], env={"COLUMNS": "300"})
    assert done.exit_code == 0, done.output
    records = read_all(out)
    assert len(records) == 3
    for r in records:
        _check_words(r)
    refused = runner.invoke(app, args, env={"COLUMNS": "300"})  # the same folder with words off
    assert refused.exit_code == 2 and "--word-timestamps" in refused.output, refused.output
    exported = runner.invoke(app, ["export", str(out), "-f", "vtt", "-o", str(tmp_path / "subs")])
    assert exported.exit_code == 0 and "exported 3 vtt files" in exported.output, exported.output
    # Cues from the words, byte for byte what openai-whisper's writer makes of the same record.
    import io

    from batchscribe.output.export import file_stems

    stems = file_stems([r["id"] for r in records])
    for r in records:
        expected = io.StringIO()
        whisper.utils.get_writer("vtt", ".").write_result(r, expected, {"max_line_width": None,
                                                          "max_line_count": None, "highlight_words": False})
        assert (tmp_path / "subs" / f"{stems[r['id']]}.vtt").read_text(encoding="utf-8") == expected.getvalue()
