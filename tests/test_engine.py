"""The CPU engine end to end on real tiny.en: records, long form, fallback, slot scheduling."""

from __future__ import annotations

import jiwer
import numpy as np
import pytest

from batchscribe.audio.decode import decode_audio

openai_types = pytest.importorskip("openai.types.audio")
normalizers = pytest.importorskip("whisper.normalizers")

GREEDY = dict(temperatures=(0.0,))


@pytest.fixture(scope="module")
def transcriber(tiny_en_dir):
    from batchscribe.api import Transcriber

    return Transcriber(str(tiny_en_dir), device="cpu", batch_size=4, **GREEDY)


def _check_record(record: dict) -> None:
    openai_types.TranscriptionVerbose.model_validate(record)
    previous_end = 0.0
    for seg in record["segments"]:
        openai_types.TranscriptionSegment.model_validate(seg)
        assert previous_end <= seg["start"] <= seg["end"] <= record["duration"]
        previous_end = seg["end"]
    assert record["text"] == "".join(s["text"] for s in record["segments"])


def _wer(ref: str, hyp: str) -> float:
    norm = normalizers.EnglishTextNormalizer()
    return jiwer.wer(norm(ref), norm(hyp))


def test_jfk(transcriber, shared_data) -> None:
    record = transcriber.transcribe(decode_audio(shared_data / "misc" / "jfk.flac"))
    _check_record(record)
    expected = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
    assert _wer(expected, record["text"]) == 0.0
    assert record["language"] == "english" and record["duration"] == pytest.approx(11.0)
    assert record["segments"][0]["start"] == 0.0
    seg = record["segments"][0]
    assert 0.0 <= seg["no_speech_prob"] < 0.2 and -1.0 < seg["avg_logprob"] < 0.0


def test_long_form_seek_matches_openai_whisper(transcriber, shared_data, tiny_en_dir) -> None:
    """A 5-minute file: segments cover the audio in order; text close to openai-whisper's
    transcribe() on the same weights (it computes features over the whole file, we per window)."""
    whisper = pytest.importorskip("whisper")

    from batchscribe.model.loading import load_state_dict

    path = shared_data / "longform" / "librispeech-concat" / "19-198-longform.flac"
    reference = (path.with_suffix(".txt")).read_text()
    audio = decode_audio(path)
    record = transcriber.transcribe(audio)
    _check_record(record)
    assert record["duration"] > 270 and len(record["segments"]) > 20
    assert record["segments"][-1]["end"] > record["duration"] - 30
    assert sorted({s["seek"] for s in record["segments"]})[1] < 3000  # seeks to a timestamp, not by 30 s

    # openai-whisper's own model and transcribe() on the same weights, same greedy settings.
    sd = load_state_dict(tiny_en_dir)
    dims = whisper.model.ModelDimensions(n_mels=80, n_audio_ctx=1500, n_audio_state=384, n_audio_head=6,
                                         n_audio_layer=4, n_vocab=51864, n_text_ctx=448, n_text_state=384,
                                         n_text_head=6, n_text_layer=4)  # fmt: skip
    ref_model = whisper.model.Whisper(dims)
    ref_model.load_state_dict(_to_openai_names(sd))
    ref = whisper.transcribe(ref_model, audio, temperature=0.0, condition_on_previous_text=False, fp16=False, language="en")
    wer_ours, wer_ref = _wer(reference, record["text"]), _wer(reference, ref["text"])
    print(f"\nlong form WER ours {wer_ours:.4f} openai-whisper {wer_ref:.4f}")
    assert wer_ours < 0.12
    assert abs(wer_ours - wer_ref) < 0.02


def _to_openai_names(sd: dict) -> dict:
    """HF Whisper names -> openai/whisper names (for the reference model only)."""
    import re

    out = {}
    for name, t in sd.items():
        if name == "proj_out.weight":
            continue
        n = name.removeprefix("model.")
        n = n.replace("embed_positions.weight", "positional_embedding").replace("embed_tokens", "token_embedding")
        n = n.replace("layers.", "blocks.").replace("self_attn_layer_norm", "attn_ln").replace("self_attn.", "attn.")
        n = n.replace("encoder_attn_layer_norm", "cross_attn_ln").replace("encoder_attn.", "cross_attn.")
        n = n.replace("final_layer_norm", "mlp_ln").replace("fc1", "mlp.0").replace("fc2", "mlp.2")
        n = re.sub(r"\.(q|k|v)_proj", lambda m: "." + {"q": "query", "k": "key", "v": "value"}[m.group(1)], n)
        n = n.replace("out_proj", "out").replace("encoder.layer_norm", "encoder.ln_post").replace("decoder.layer_norm", "decoder.ln")
        out[n] = t.float()
    return out


def test_slot_count_does_not_change_results(tiny_en_dir, shared_data) -> None:
    """Windows admitted into different slots, in groups, at different times decode identically."""
    from batchscribe.api import Transcriber

    audio = decode_audio(shared_data / "longform" / "earnings22" / "earnings22_1_4482311_3_62.wav")
    jfk = decode_audio(shared_data / "misc" / "jfk.flac")
    items = [("a", audio), ("b", jfk), ("c", audio[: 16000 * 7]), ("d", jfk[: 16000 * 4]), ("e", audio[16000 * 20 :])]
    one = Transcriber(str(tiny_en_dir), device="cpu", batch_size=1, **GREEDY).transcribe(items)
    many = Transcriber(str(tiny_en_dir), device="cpu", batch_size=3, **GREEDY).transcribe(items)
    assert [r["id"] for r in many] == ["a", "b", "c", "d", "e"]
    for a, b in zip(one, many):
        assert [s["tokens"] for s in a["segments"]] == [s["tokens"] for s in b["segments"]]
        _check_record(b)


def test_without_timestamps_long_form(tiny_en_dir, shared_data) -> None:
    from batchscribe.api import Transcriber

    audio = decode_audio(shared_data / "longform" / "earnings22" / "earnings22_1_4482311_3_62.wav")
    record = Transcriber(str(tiny_en_dir), device="cpu", without_timestamps=True, **GREEDY).transcribe(audio)
    _check_record(record)
    # One segment per 30 s window, no timestamp tokens anywhere.
    assert [s["start"] for s in record["segments"]] == [30.0 * i for i in range(len(record["segments"]))]
    assert all(t < 50257 for s in record["segments"] for t in s["tokens"])


def test_temperature_fallback_walks_the_ladder(tiny_en_dir, shared_data) -> None:
    """A threshold no decode can meet makes every window try every temperature, keeping the last."""
    from batchscribe.api import Transcriber

    jfk = decode_audio(shared_data / "misc" / "jfk.flac")
    t = Transcriber(str(tiny_en_dir), device="cpu", temperatures=(0.0, 0.5, 1.0), compression_ratio_threshold=0.0)
    record = t.transcribe(jfk)
    _check_record(record)
    assert {s["temperature"] for s in record["segments"]} == {1.0}
    # The default thresholds accept the greedy decode of clear speech.
    plain = Transcriber(str(tiny_en_dir), device="cpu").transcribe(jfk)
    assert {s["temperature"] for s in plain["segments"]} == {0.0}


def test_silence_and_empty_audio(transcriber) -> None:
    silent, empty = transcriber.transcribe([("silent", np.zeros(16000 * 5, np.float32)), ("empty", np.zeros(0, np.float32))])
    for record in (silent, empty):
        _check_record(record)
    assert empty["segments"] == [] and empty["text"] == ""
    # Default thresholds: a silent window is skipped (openai's no-speech rule) or yields no words.
    assert silent["duration"] == 5.0
    assert len(silent["text"].split()) <= 2


def test_bucketed_attention_lengths_change_nothing(tiny_en_dir, shared_data) -> None:
    """The CUDA path rounds each step's self-attention length up to a captured bucket; masked
    positions must not change a single token (checked here on the CPU with the same code)."""
    from batchscribe.api import Transcriber
    from batchscribe.engine.graphs import default_buckets, default_kv_buckets, slots_for_memory

    audio = decode_audio(shared_data / "longform" / "earnings22" / "earnings22_3_4483589_261_321.wav")
    items = [("a", audio[: 16000 * 25]), ("b", audio[16000 * 25 :])]
    exact = Transcriber(str(tiny_en_dir), device="cpu", batch_size=2, **GREEDY)
    bucketed = Transcriber(str(tiny_en_dir), device="cpu", batch_size=2, **GREEDY)
    bucketed.transcribe(items[:1])
    next(iter(bucketed._engines.values())).decoder.kv_buckets = default_kv_buckets(448)
    a, b = exact.transcribe(items), bucketed.transcribe(items)
    assert [[s["tokens"] for s in r["segments"]] for r in a] == [[s["tokens"] for s in r["segments"]] for r in b]
    # Only float summation order differs: the masked positions weigh exactly zero.
    lp_a = [s["avg_logprob"] for r in a for s in r["segments"]]
    lp_b = [s["avg_logprob"] for r in b for s in r["segments"]]
    assert lp_a == pytest.approx(lp_b, abs=1e-5)
    assert default_kv_buckets(448) == [64, 160, 256, 448]
    assert default_buckets(256)[-1] == 256 and default_buckets(3) == [1, 2, 3]
    assert slots_for_memory(10 * 2**30, 2**30, fraction=0.6) == 6


def test_out_of_memory_shrinks_slots_and_admission_groups(tiny_en_dir, shared_data, monkeypatch, caplog) -> None:
    """Out of memory while allocating slots halves them; out of memory while admitting a group
    requeues it and admits smaller groups. Either way every item still gets its record, unchanged.
    (On the GPU these are torch.OutOfMemoryError from the allocator; here they are injected.)"""
    import torch

    from batchscribe.api import Transcriber
    from batchscribe.engine import decoding

    jfk = decode_audio(shared_data / "misc" / "jfk.flac")
    items = [(f"u{i}", jfk[: 16000 * (3 + i)]) for i in range(5)]
    expected = Transcriber(str(tiny_en_dir), device="cpu", batch_size=2, **GREEDY).transcribe(items)

    real_init, real_admit = decoding.SlotDecoder.__init__, decoding.SlotDecoder.admit
    admits: list[int] = []

    def init(self, model, spec, n_slots, *args, **kwargs):
        if n_slots > 8:
            raise torch.OutOfMemoryError("injected: no room for the caches")
        real_init(self, model, spec, n_slots, *args, **kwargs)

    def admit(self, requests, slots):
        admits.append(len(requests))
        if len(requests) > 1 and len(admits) == 1:
            raise torch.OutOfMemoryError("injected: encoder activations")
        real_admit(self, requests, slots)

    monkeypatch.setattr(decoding.SlotDecoder, "__init__", init)
    monkeypatch.setattr(decoding.SlotDecoder, "admit", admit)
    with caplog.at_level("WARNING", logger="batchscribe.engine.engine"):
        t = Transcriber(str(tiny_en_dir), device="cpu", batch_size=32, **GREEDY)
        got = t.transcribe(items)
    engine = next(iter(t._engines.values()))
    assert engine.decoder.n_slots == 8 and engine.admit_max == 1
    assert admits[0] == 2 and set(admits[1:]) == {1}  # groups of admit_min = 8 // 4, then of 1
    assert "retrying with 16" in caplog.text and "retrying with 8" in caplog.text
    assert "admitting at most 1" in caplog.text
    assert [[s["tokens"] for s in r["segments"]] for r in got] == [[s["tokens"] for s in r["segments"]] for r in expected]


def test_sampled_fallback_is_independent_of_slots_and_batch(tiny_en_dir, shared_data) -> None:
    """Every window forced to fall back to T=1.0 samples the same tokens whatever slot, batch or
    neighbours it decodes with (the noise is keyed by item, window and attempt), so a resumed run
    reproduces a sampled transcript exactly."""
    from batchscribe.api import Transcriber

    jfk = decode_audio(shared_data / "misc" / "jfk.flac")
    items = [("a", jfk), ("b", jfk[: 16000 * 5]), ("c", jfk[16000 * 3 :])]
    kw = dict(device="cpu", temperatures=(0.0, 1.0), compression_ratio_threshold=0.0)
    alone = [Transcriber(str(tiny_en_dir), batch_size=1, **kw).transcribe([it])[0] for it in items]
    together = Transcriber(str(tiny_en_dir), batch_size=3, **kw).transcribe(items[::-1])[::-1]
    for a, b in zip(alone, together):
        assert {s["temperature"] for s in a["segments"]} == {1.0}
        assert [s["tokens"] for s in a["segments"]] == [s["tokens"] for s in b["segments"]]
    other_seed = Transcriber(str(tiny_en_dir), batch_size=3, seed=1, **kw).transcribe(items)
    assert [r["text"] for r in other_seed] != [r["text"] for r in alone]


@pytest.mark.parametrize("fallback", [False, True])
def test_compacting_the_tail_changes_no_token(tiny_en_dir, shared_data, fallback: bool) -> None:
    """Once nothing is left to admit, running windows move down into the rows finished ones left
    (SlotDecoder.compact), so steps cover fewer rows; every record stays the same, long-form seeks
    and sampled fallbacks (whose noise is keyed by window, not slot) included."""
    from batchscribe.api import Transcriber

    audio = decode_audio(shared_data / "longform" / "earnings22" / "earnings22_1_4482311_3_62.wav")
    jfk = decode_audio(shared_data / "misc" / "jfk.flac")
    # Short items finish first, in low rows, while the long ones (later slots) keep decoding.
    items = [("a", jfk[: 16000 * 2]), ("b", jfk[: 16000 * 3]), ("c", jfk), ("d", audio[: 16000 * 40]),
             ("e", jfk[: 16000 * 4]), ("f", audio)]  # fmt: skip
    kw = dict(temperatures=(0.0, 1.0), compression_ratio_threshold=0.0) if fallback else GREEDY
    runs = {}
    for compact in (False, True):
        t = Transcriber(str(tiny_en_dir), device="cpu", batch_size=6, **kw)
        t.transcribe(items[:1])  # builds the engine
        engine = next(iter(t._engines.values()))
        engine.compact_tail = compact
        engine.timings.clear()
        runs[compact] = (t.transcribe(items), dict(engine.timings))
    (plain, plain_clock), (compacted, clock) = runs[False], runs[True]
    assert clock["compactions"] >= 1 and "compactions" not in plain_clock
    assert clock["row_steps"] < plain_clock["row_steps"]  # the point: fewer rows stepped
    assert clock["steps"] == plain_clock["steps"]
    for a, b in zip(plain, compacted):
        _check_record(b)
        assert b["text"] == a["text"] and b["segments"]
        assert [s["tokens"] for s in a["segments"]] == [s["tokens"] for s in b["segments"]]
        assert [s["temperature"] for s in a["segments"]] == [s["temperature"] for s in b["segments"]]
        assert [s["avg_logprob"] for s in a["segments"]] == pytest.approx([s["avg_logprob"] for s in b["segments"]], abs=1e-5)


def test_compact_moves_every_slot_tensor_and_the_host_mirror(tiny_en_dir) -> None:
    """The decoder's part on its own: rows past the occupied count land in the holes below it with
    their whole state and K/V; the rows left behind are free and inert; snapshots queued before the
    move skip both ends of it."""
    import torch

    from batchscribe.api import Transcriber
    from batchscribe.engine.decoding import WindowRequest

    t = Transcriber(str(tiny_en_dir), device="cpu", batch_size=8, **GREEDY)
    t.transcribe([("warm", np.zeros(16000, np.float32))])
    dec = next(iter(t._engines.values())).decoder
    # Every per-slot tensor the decoder holds is one compact() moves (the snapshot table is
    # rewritten from them on every look): a tensor added later cannot be forgotten.
    per_slot = {name for name, v in vars(dec).items() if isinstance(v, torch.Tensor) and v.shape[:1] == (8,)}
    moved = {name for name, v in vars(dec).items() if any(v is m for m in dec._slot_tensors())}
    assert per_slot - {"_pack"} == moved
    rng = np.random.default_rng(0)
    prompt = (50257, 50362)  # <|startoftranscript|><|notimestamps|>, tiny.en
    reqs = [WindowRequest(key=k, audio=rng.standard_normal(16000 * (k + 1)).astype(np.float32) * 0.1,
                          prompt=prompt, temperature=0.0, detect_language=False, noise_key=k)
            for k in range(4)]  # fmt: skip
    dec.admit(reqs, [0, 2, 5, 7])
    dec.step(dec.rows_in_use(), 3)
    dec.snapshot()  # queued before the move: rows 1, 3, 4 and 6 are free (not running) in it
    before = {name: getattr(dec, name).clone() for name in ("tokens", "positions", "sum_logprob", "sample_end")}
    cross, self_v = dec.cache.cross_k[0].clone(), dec.cache.self_v[-1].clone()
    dec.keys[0], dec.occupied[0] = None, False  # as if slot 0's window had been collected
    assert dec.compact() == 3 and dec.rows_in_use() == 3
    assert dec.keys[:3] == [2, 3, 1] and not dec.occupied[3:].any()  # 5 -> 0, 7 -> 1, 2 stays
    for name, old in before.items():
        new = getattr(dec, name)
        assert torch.equal(new[0], old[5]) and torch.equal(new[1], old[7]) and torch.equal(new[2], old[2]), name
    assert torch.equal(dec.cache.cross_k[0][:2], cross[[5, 7]]) and torch.equal(dec.cache.self_v[-1][:2], self_v[[5, 7]])
    assert dec.running[:3].all() and not dec.running[3:].any()  # the rows left behind are inert
    # The old snapshot shows row 1 free; without the generation guard it would report key 3 done.
    assert dec.finished(dec.wait_snapshot()) == []
    dec.running[1] = False  # key 3 (moved from row 7) finishes
    dec.snapshot()
    (result,) = dec.finished(dec.wait_snapshot())
    position = int(before["positions"][7])
    assert result.key == 3 and result.tokens == before["tokens"][7, len(prompt) : position + 1].tolist()


def test_encoder_chunks_cover_any_group_with_few_shapes() -> None:
    from batchscribe.engine.decoding import ENCODER_CHUNKS, encoder_chunks

    for n in range(0, 300):
        parts = encoder_chunks(n)
        assert [i for p in parts for i in range(p.start, p.stop)] == list(range(n))
        assert all(p.stop - p.start in ENCODER_CHUNKS for p in parts)
    assert [p.stop - p.start for p in encoder_chunks(77)] == [64, 8, 4, 1]


def test_steps_per_check_keeps_about_two_ms_queued() -> None:
    from batchscribe.engine.engine import steps_per_check

    assert steps_per_check(0.0003) == 4  # tiny.en-sized steps: capped at 4 per look
    assert steps_per_check(0.0007) == 3
    assert steps_per_check(0.001) == 2
    assert steps_per_check(0.025) == 1  # large-v3-sized steps: look after every one
    assert steps_per_check(0.0) == 4
