"""The host side of the step loop on the CPU, real tiny.en: lagged snapshots, staging, stale slots.

The GPU engine reads finished rows from a snapshot queued one batch of steps earlier, so the host
never waits for the newest steps. These tests run the same code on the CPU with the lag forced on.
"""

from __future__ import annotations

import dataclasses

import io

import numpy as np
import pytest
import torch

from batchscribe.audio.decode import decode_audio
from batchscribe.audio.features import pad_or_trim
from batchscribe.config import DecodeOptions
from batchscribe.constants import N_SAMPLES
from batchscribe.engine.decoding import SlotDecoder, WindowRequest
from batchscribe.engine.engine import Engine
from batchscribe.engine.pinned import PinnedArena

CPU = torch.device("cpu")
# A fallback ladder and a threshold some windows fail: sampled retries are part of the mix.
FALLBACK = DecodeOptions(temperatures=(0.0, 0.6), logprob_threshold=-0.4)


@pytest.fixture(scope="module")
def transcriber(tiny_en_dir):
    from batchscribe.api import Transcriber

    torch.set_num_threads(1)
    return Transcriber(str(tiny_en_dir), device="cpu")


@pytest.fixture(scope="module")
def items(shared_data) -> list[tuple[str, np.ndarray]]:
    """12 items: long-form clips that need a second or third seek window, short utterances
    (some fall back to T=0.6 under FALLBACK), cuts of JFK, and silence."""
    import pyarrow.parquet as pq
    import soundfile as sf

    paths = {
        "jfk": shared_data / "misc" / "jfk.flac",
        "e1": shared_data / "longform" / "earnings22" / "earnings22_1_4482311_3_62.wav",
        "e3": shared_data / "longform" / "earnings22" / "earnings22_3_4483589_261_321.wav",
        "book": shared_data / "longform" / "librispeech-concat" / "118-47824-longform.flac",
    }
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:  # e.g. a partial copy of the data on the GPU machine
        pytest.skip(f"shared data lacks {missing}")
    jfk, e1, e3, book = (decode_audio(paths[k]) for k in ("jfk", "e1", "e3", "book"))
    rows = pq.read_table(shared_data / "librispeech" / "test-other-subset-00000-of-00001.parquet").slice(0, 5)
    utterances = [(r["id"], sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32")[0]) for r in rows.to_pylist()]
    return [
        ("e1", e1[: 16000 * 40]),
        ("jfk", jfk),
        ("e3", e3[: 16000 * 45]),
        ("jfk-head", jfk[: 16000 * 4]),
        ("book", book[: 16000 * 35]),
        ("jfk-tail", jfk[16000 * 3 :]),
        ("silence", np.zeros(16000 * 3, np.float32)),
        *utterances,
    ]


def _engine(transcriber, options: DecodeOptions, n_slots: int) -> Engine:
    t = transcriber
    return Engine(t.model, t.tokenizer, options, t.model_suppress, CPU, n_slots=n_slots)


def _run(transcriber, items, check_every: int, lag: int, monkeypatch) -> tuple[list[dict], Engine]:
    engine = _engine(transcriber, FALLBACK, n_slots=3)
    engine.check_every, engine.lag = check_every, lag
    dec = engine.decoder
    # Pin what float summation depends on, as the GPU's graphs do (a fixed row bucket and a fixed
    # attention length): a lag changes which windows share a step, and on the CPU the row count
    # and attention length otherwise move avg_logprob by ~1e-7 (tokens are unaffected).
    dec.kv_buckets = [dec.n_ctx]
    rows_in_use = dec.rows_in_use
    monkeypatch.setattr(dec, "rows_in_use", lambda: dec.n_slots if rows_in_use() else 0)
    records = sorted(engine.transcribe_stream(items), key=lambda r: r["id"])
    return records, engine


def test_lagged_collection_gives_identical_records(transcriber, items, monkeypatch) -> None:
    """Finished rows are inert: reading them one batch late (3 steps per batch, lag 1) gives the
    same records as looking after every step, while slots are freed and re-admitted many times."""
    now, now_engine = _run(transcriber, items, check_every=1, lag=0, monkeypatch=monkeypatch)
    late, late_engine = _run(transcriber, items, check_every=3, lag=1, monkeypatch=monkeypatch)
    assert [r["id"] for r in late] == sorted(i for i, _ in items)
    assert late == now  # text, segments, tokens, avg_logprob, no_speech_prob: every field
    # The mix did exercise what it claims: re-admissions, seek windows, fallback, silence.
    segments = [s for r in now for s in r["segments"]]
    assert now_engine.timings["windows"] >= 6 * now_engine.decoder.n_slots
    assert {s["temperature"] for s in segments} == {0.0, 0.6}
    assert {r["id"] for r in now if any(s["seek"] > 0 for s in r["segments"])} >= {"e1", "e3", "book"}
    assert next(r for r in now if r["id"] == "silence")["segments"] == []
    # The lagged run looked at its slots a third as often and found the same windows.
    assert late_engine.timings["windows"] == now_engine.timings["windows"]
    assert late_engine.decoder.pending_snapshots() == 0


def test_staging_pads_like_pad_or_trim(transcriber) -> None:
    """Padding on the device from flat samples equals pad_or_trim per window, through both
    alternating host buffers, and a staged group is not disturbed by the next admission's."""
    dec = _engine(transcriber, DecodeOptions(), n_slots=6).decoder
    rng = np.random.default_rng(0)
    prompt = transcriber.tokenizer.sot_sequence(None, "transcribe", False)

    def group(lengths: list[int]) -> list[WindowRequest]:
        return [WindowRequest(i, rng.standard_normal(n).astype(np.float32), prompt, False, 0.2 * i, 7 + i)
                for i, n in enumerate(lengths)]  # fmt: skip

    groups = [group([16000 * 7, 1, N_SAMPLES, 0, N_SAMPLES + 500, 12345]), group([N_SAMPLES - 1, 3]), group([5])]
    # A mix of samples decoded into the pinned arena (copied as they are) and ordinary ones (packed)
    # is staged alike.
    dec.arena = PinnedArena(4 * N_SAMPLES, pin=False)
    mixed = []
    for i, r in enumerate(groups[0]):
        audio = dec.arena.allocate(len(r.audio)) if i % 2 == 0 else r.audio.copy()
        audio[:] = r.audio
        mixed.append(dataclasses.replace(r, audio=audio))
    assert [dec.arena.holds(r.audio) for r in mixed] == [True, False, True, False, True, False]
    groups.append(mixed)
    staged = [dec._stage(g, list(range(len(g)))[::-1]) for g in groups]
    for requests, got in zip(groups, staged):
        expected = torch.stack([pad_or_trim(torch.as_tensor(r.audio), N_SAMPLES) for r in requests])
        assert torch.equal(got.audio, expected)
        assert got.ints[:, 0].tolist() == list(range(len(requests)))[::-1]  # slots
        assert got.floats.tolist() == pytest.approx([r.temperature for r in requests])

    # Admission scatters the packed state into exactly the named slots.
    requests = group([16000, 16000 * 3])
    dec.admit(requests, [4, 1])
    assert dec.keys == [None, 1, None, None, 0, None]
    n = len(prompt)
    assert dec.tokens[[4, 1], :n].tolist() == [list(prompt)] * 2 and int(dec.tokens[[4, 1], n:].abs().sum()) == 0
    assert dec.sample_begin[[4, 1]].tolist() == [n, n]
    assert dec.sample_end[[4, 1]].tolist() == [n + dec.spec.sample_len - 1] * 2
    assert dec.noise_key[[4, 1]].tolist() == [7, 8] and dec.temperature[[4, 1]].tolist() == pytest.approx([0.0, 0.2])
    assert dec.running.tolist() == [False, True, False, False, True, False]


def _decode_alone(dec: SlotDecoder, slot: int) -> None:
    """Step until `slot` finishes (reading the device state directly: this is the CPU)."""
    for _ in range(dec.n_ctx):
        if not bool(dec.running[slot]):
            return
        dec.step(dec.rows_in_use())
    raise AssertionError(f"slot {slot} never finished")


def test_stale_snapshot_does_not_finish_a_readmitted_slot(transcriber, shared_data) -> None:
    """A slot freed from one snapshot and re-admitted before the next snapshot is processed must
    not be reported finished from that older snapshot (it would return the previous window's
    tokens under the new window's key)."""
    tok = transcriber.tokenizer
    jfk = decode_audio(shared_data / "misc" / "jfk.flac")
    prompt = tok.sot_sequence(None, "transcribe", False)
    first = WindowRequest(1, jfk, prompt, False, 0.0)
    second = WindowRequest(2, jfk[16000 * 6 :], prompt, False, 0.0)

    dec = _engine(transcriber, DecodeOptions(temperatures=(0.0,)), n_slots=2).decoder
    dec.admit([first], [0])
    _decode_alone(dec, 0)
    dec.snapshot()
    dec.snapshot()  # both show slot 0 finished with the first window
    (done,) = dec.finished(dec.wait_snapshot())
    assert done.key == 1 and "ask not what your country can do for you" in tok.decode(done.tokens)
    dec.admit([second], [0])  # slot 0 is reused while the second snapshot is still queued
    assert dec.finished(dec.wait_snapshot()) == []
    assert dec.keys[0] == 2 and bool(dec.running[0])
    _decode_alone(dec, 0)
    (done,) = dec.collect()
    text = tok.decode(done.tokens)  # the audio from 6 s: "... country can do for you, ask what ..."
    assert done.key == 2 and "ask what you can do for your country" in text and "fellow" not in text
    # The same window decoded in a fresh decoder: identical, so nothing of the first leaked in.
    fresh = _engine(transcriber, DecodeOptions(temperatures=(0.0,)), n_slots=2).decoder
    fresh.admit([second], [0])
    _decode_alone(fresh, 0)
    assert fresh.collect() == [done]


# -- the same on a GPU (run with the GPU tests; skipped here without CUDA) ---------------------

@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_lagged_collection_on_cuda(tiny_en_dir, shared_data, graphs) -> None:
    """On CUDA (pinned buffers, events, async copies): lag 1 with 4 steps per batch gives the
    tokens of lag 0 with a look after every step; the host waited on snapshots, not on syncs."""
    import pyarrow.parquet as pq
    import soundfile as sf

    from batchscribe.api import Transcriber

    rows = pq.read_table(shared_data / "librispeech" / "test-other-subset-00000-of-00001.parquet").slice(0, 24)
    items = [(r["id"], sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32")[0]) for r in rows.to_pylist()]
    t = Transcriber(str(tiny_en_dir), device="cuda", dtype="float32", batch_size=8, cuda_graphs=graphs)
    # Graphs run the bucket covering the rows in use, which the lag shifts; a different batch size
    # may sum in a different order, enough to move a window across the fallback threshold. So the
    # graph variant decodes greedily (no threshold to cross); the eager one keeps the fallbacks.
    options = DecodeOptions(temperatures=(0.0,)) if graphs else DecodeOptions(temperatures=(0.0, 0.6), logprob_threshold=-0.4)
    runs = []
    for check_every, lag in ((1, 0), (4, 1), (3, 2)):
        engine = Engine(t.model, t.tokenizer, options, t.model_suppress, torch.device("cuda"), n_slots=8, cuda_graphs=graphs)
        engine.check_every, engine.lag = check_every, lag
        runs.append(sorted(engine.transcribe_stream(items), key=lambda r: r["id"]))
        assert engine.decoder.pending_snapshots() == 0 and engine.timings["wait_snapshot"] > 0
    for other in runs[1:]:
        assert [r["text"] for r in other] == [r["text"] for r in runs[0]]
        assert [[s["tokens"] for s in r["segments"]] for r in other] == [[s["tokens"] for s in r["segments"]] for r in runs[0]]
        # Graph buckets follow the rows in use, which the lag shifts: allow summation order only.
        lp = [s["avg_logprob"] for r in runs[0] for s in r["segments"]]
        assert [s["avg_logprob"] for r in other for s in r["segments"]] == pytest.approx(lp, abs=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_staging_on_cuda(tiny_en_dir) -> None:
    """Pinned double-buffered staging and device-side padding equal pad_or_trim on CUDA, across
    more admissions than there are buffers."""
    from batchscribe.api import Transcriber

    t = Transcriber(str(tiny_en_dir), device="cuda", batch_size=4, cuda_graphs=False)
    dec = Engine(t.model, t.tokenizer, DecodeOptions(), t.model_suppress, torch.device("cuda"), n_slots=4).decoder
    rng = np.random.default_rng(1)
    prompt = t.tokenizer.sot_sequence(None, "transcribe", False)
    for lengths in ([N_SAMPLES, 7, 0, 16000 * 9], [3], [N_SAMPLES + 9, 16000], [16000 * 29, 1, 2, 3]):
        requests = [WindowRequest(i, rng.standard_normal(n).astype(np.float32), prompt, False, 0.0) for i, n in enumerate(lengths)]
        staged = dec._stage(requests, list(range(len(requests))))
        expected = torch.stack([pad_or_trim(torch.from_numpy(r.audio), N_SAMPLES) for r in requests])
        assert torch.equal(staged.audio.cpu(), expected)
        assert staged.ints[:, 0].tolist() == list(range(len(requests)))
