"""The scheduler on real tiny.en: slot counts, groups, lags, fallback and tail compaction change no
record; out of memory shrinks slots and admission groups."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
import torch

from batchscribe.audio.decode import decode_audio
from batchscribe.config import DecodeOptions
from batchscribe.output.verbose_json import transcript_record
from tests.engine.helpers import GREEDY, records
from tests.engine.helpers import check_record as _check_record
from tests.marks import needs_cuda

# A fallback ladder and a threshold some windows fail: sampled retries are part of the mix.
FALLBACK = DecodeOptions(temperatures=(0.0, 0.6), logprob_threshold=-0.4)


@pytest.fixture(scope="module")
def transcriber(tiny_en_dir):
    from batchscribe.api import Transcriber

    # One thread while this module runs (float sums in a fixed order), then back: the process's
    # later tests (tests/system's parity runs) would otherwise run at half speed.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Transcriber(str(tiny_en_dir), device="cpu")
    torch.set_num_threads(threads)


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


def _run(transcriber, items, check_every: int, lag: int, monkeypatch):
    sched = transcriber.build_scheduler(FALLBACK, replace(transcriber.config, n_slots=3, kv_buckets=(448,)))
    # Pin what float summation depends on, as the GPU's graphs do (a fixed row bucket, above, and a
    # fixed attention length): a lag changes which windows share a step, and on the CPU the row
    # count and attention length otherwise move avg_logprob by ~1e-7 (tokens are unaffected).
    slots = sched.engine.slots
    rows_in_use = slots.rows_in_use
    monkeypatch.setattr(slots, "rows_in_use", lambda: slots.n_slots if rows_in_use() else 0)
    got = sorted(records(sched, items, check_every=check_every, lag=lag), key=lambda r: r["id"])
    return got, sched


def test_lagged_collection_gives_identical_records(transcriber, items, monkeypatch) -> None:
    """Finished rows are inert: reading them one batch late (3 steps per batch, lag 1) gives the
    same records as looking after every step, while slots are freed and re-admitted many times."""
    now, now_sched = _run(transcriber, items, check_every=1, lag=0, monkeypatch=monkeypatch)
    late, late_sched = _run(transcriber, items, check_every=3, lag=1, monkeypatch=monkeypatch)
    assert [r["id"] for r in late] == sorted(i for i, _ in items)
    assert late == now  # text, segments, tokens, avg_logprob, no_speech_prob: every field
    # The mix did exercise what it claims: re-admissions, seek windows, fallback, silence.
    segments = [s for r in now for s in r["segments"]]
    assert now_sched.timings["windows"] >= 6 * now_sched.engine.n_slots
    assert {s["temperature"] for s in segments} == {0.0, 0.6}
    assert {r["id"] for r in now if any(s["seek"] > 0 for s in r["segments"])} >= {"e1", "e3", "book"}
    assert next(r for r in now if r["id"] == "silence")["segments"] == []
    # The lagged run looked at its slots a third as often and found the same windows.
    assert late_sched.timings["windows"] == now_sched.timings["windows"]
    assert late_sched.engine.pending_snapshots() == 0


def test_a_source_with_nothing_ready_yet_changes_no_record(transcriber, items, monkeypatch) -> None:
    """A live source (ray/feed.py) gives None while its rows are in flight: the scheduler steps
    what it holds and asks again, and every record is the one a plain source gives."""
    plain, _ = _run(transcriber, items, check_every=1, lag=0, monkeypatch=monkeypatch)
    sched = transcriber.build_scheduler(FALLBACK, replace(transcriber.config, n_slots=3, kv_buckets=(448,)))
    asked = []

    def live() -> Iterator[tuple[str, np.ndarray] | None]:
        for item in items:
            for _ in range(3):  # three turns with nothing ready before each item
                asked.append(sched.engine.slots.rows_in_use())
                yield None
            yield item

    run = sched.run(live(), replace(sched.policy, check_every=1, lag=0))
    got = sorted((transcript_record(t) for t in run), key=lambda r: r["id"])
    assert [r["id"] for r in got] == [r["id"] for r in plain]
    assert {r["id"]: (r["text"], r["segments"] and [s["tokens"] for s in r["segments"]]) for r in got} == {
        r["id"]: (r["text"], r["segments"] and [s["tokens"] for s in r["segments"]]) for r in plain}
    assert any(asked)  # "nothing ready" did come while windows were in flight


def test_an_audio_budget_holds_items_back_and_changes_no_record(transcriber, items, monkeypatch, caplog) -> None:
    """Items in flight hold their whole audio: with a budget of 50 s of samples (or none at all)
    new items wait until one finishes, the items in flight never hold more than the budget plus
    one item, the operator is told once, and every record is the unbounded run's (its
    probabilities to 1e-5)."""
    items = items[:7]  # the long-form clips, JFK's cuts and silence
    plain, sched = _run(transcriber, items, check_every=1, lag=0, monkeypatch=monkeypatch)
    assert sched.policy.max_live_samples == sched.engine.config.audio_memory // 4  # the default
    assert sched.timings["held_back"] == 0
    sizes = sorted(len(audio) for _, audio in items)
    for budget in (0, 16000 * 50):
        sched.timings.clear()
        caplog.clear()
        with caplog.at_level("WARNING", logger="batchscribe.engine.scheduler"):
            got = sorted(records(sched, items, check_every=1, lag=0, max_live_samples=budget), key=lambda r: r["id"])
        # Admission groups differ, so the CPU's encoder batches do: probabilities move by ~1e-7.
        assert [_rounded(r) for r in got] == [_rounded(r) for r in plain]
        peak = sched.timings["live_samples_peak"]
        assert sched.timings["held_back"] > 0
        if budget == 0:  # one item at a time: the peak is the longest item alone
            assert peak == sizes[-1]
        else:  # several at a time, yet fewer than the 3 slots would take: the longest three overflow it
            assert sizes[-1] < peak <= budget + sizes[-1] < sum(sizes[-3:])
        said = [r.getMessage() for r in caplog.records if "decoded audio" in r.getMessage()]
        assert len(said) == 1 and "EngineOptions.audio_memory" in said[0]


def _rounded(record: dict) -> dict:
    keys = ("avg_logprob", "no_speech_prob")
    return {**record, "segments": [{**seg, **{k: round(seg[k], 5) for k in keys}} for seg in record["segments"]]}


@pytest.fixture(scope="module")
def references() -> dict[int, tuple[list[dict], int]]:
    """_one_window_at_a_time's result by slot count, computed once in this module: it depends on
    the items and on the step's row count alone (one window at a time, one alignment each)."""
    return {}


def _one_window_at_a_time(sched, items) -> tuple[list[dict], int]:
    """The reference for word timestamps: each item alone, one window at a time in slot 0, every
    step read at once, the window's words timed synchronously by the engine's Aligner before the
    item's next window is requested (openai transcribe()'s order; no scheduler). Also returns how
    many next windows the words moved (a seek at the last word's end, not at the last timestamp)."""
    engine, planner = sched.engine, sched.windows
    out, moved = [], 0
    for item_id, audio in items:
        item = planner.start(item_id, audio)
        while not item.done:
            engine.admit([planner.request(0, item)], [0])
            finished = []
            while not finished:
                engine.advance(engine.slots.rows_in_use(), 1)
                finished = engine.finished(engine.wait_snapshot())
            (res,) = finished
            judged = planner.judge(item, res)
            request = planner.align_request(item, judged, res.slot)
            planner.settle(item, judged, None if request is None else engine.aligner([request])[0])
            moved += not item.done and judged.split is not None and item.seek != judged.split.seek
        out.append(transcript_record(planner.transcript(item)))
    return sorted(out, key=lambda r: r["id"]), moved


def _without_probabilities(record: dict) -> dict:
    """A record less the fields that sum floats in a batch-shaped order (word probabilities from
    the alignment pass's batch, avg_logprob, and no_speech_prob: the CPU's encoder batches are the
    admission groups): compared apart, within a tolerance."""
    segments = [{**s, "avg_logprob": None, "no_speech_prob": None,
                 "words": [{**w, "probability": None} for w in s["words"]]} for s in record["segments"]]  # fmt: skip
    return {**record, "segments": segments}


def _probabilities(records: list[dict]) -> list[float]:
    """What _without_probabilities leaves out, in order."""
    return [p for r in records for s in r["segments"]
            for p in (s["avg_logprob"], s["no_speech_prob"], *(w["probability"] for w in s["words"]))]  # fmt: skip


@pytest.mark.parametrize("check_every,lag,hold,align_lag", [(1, 0, 0, 0), (3, 1, 0, 0), (1, 0, 3, 0), (3, 1, 2, 0),
                                                             (1, 0, 0, 2), (3, 1, 2, 1)])  # fmt: skip
def test_words_settled_one_collect_later_equal_timing_them_at_once(transcriber, items, references, monkeypatch,
                                                                   check_every, lag, hold, align_lag) -> None:  # fmt: skip
    """With word timestamps the scheduler holds a read's windows for a fuller alignment batch (up
    to `hold` collects, their slots kept from admission), queues their pass and settles them at the
    next collect, or `align_lag` collects after it (the last one, no slot in use, settles every
    pass). Records equal the reference's, which
    times each window's words before anything else happens: the long-form items' next windows start
    at their last word's end, so a window queued before its words were settled would seek
    elsewhere, a pass reading a slot that an admission had refilled would time other audio, and an
    alignment left pending (or held) at the run's end would lose its item."""
    options = replace(FALLBACK, word_timestamps=True)
    # Holding needs more slots than a pass batch: with fewer windows running the queue sends at once.
    n_slots = 6 if hold else 3
    sched = transcriber.build_scheduler(options, replace(transcriber.config, n_slots=n_slots, kv_buckets=(448,)))
    slots, engine = sched.engine.slots, sched.engine
    engine.aligner.max_batch = 2 if hold else engine.aligner.max_batch
    rows_in_use = slots.rows_in_use  # a fixed row count, as in _run: float sums alike in both paths
    monkeypatch.setattr(slots, "rows_in_use", lambda: slots.n_slots if rows_in_use() else 0)
    if n_slots not in references:
        references[n_slots] = _one_window_at_a_time(sched, items)
    expected, moved = references[n_slots]

    collects, spans, submitted = [0], [], []  # spans: per settled pass, collects begun since its submit
    collect, submit = sched._collect, engine.submit_alignment

    def counted_collect(*args, **kwargs):
        collects[0] += 1
        return collect(*args, **kwargs)

    def watched_submit(windows):
        pending, at = submit(windows), collects[0]
        submitted.append(len(windows))
        result = pending.result

        def watched_result():
            spans.append(collects[0] - at)
            return result()

        pending.result = watched_result
        return pending

    monkeypatch.setattr(sched, "_collect", counted_collect)
    monkeypatch.setattr(engine, "submit_alignment", watched_submit)
    got = sorted(records(sched, items, check_every=check_every, lag=lag, align_hold=hold, align_lag=align_lag),
                 key=lambda r: r["id"])  # fmt: skip

    assert [r["id"] for r in got] == [r["id"] for r in expected] == sorted(i for i, _ in items)
    assert [_without_probabilities(r) for r in got] == [_without_probabilities(r) for r in expected]
    assert _probabilities(got) == pytest.approx(_probabilities(expected), abs=1e-5)
    # What the mix exercised: long-form items seeking at their last word (openai's rule), words
    # in every segment with text, and every pass settled exactly align_lag + 1 collects later
    # (earlier only by a collect with nothing running, which settles them all).
    seeks = {r["id"]: sorted({s["seek"] for s in r["segments"]}) for r in got}
    assert all(len(seeks[k]) >= 2 for k in ("e1", "e3", "book")) and moved >= 1
    assert all(s["words"] for r in got for s in r["segments"] if s["text"].strip())
    assert spans and max(spans) == align_lag + 1 and min(spans) >= 1 and len(spans) == len(submitted)
    assert spans.count(align_lag + 1) > len(spans) // 2
    assert sum(submitted) == sched.timings["aligned_windows"]
    assert engine.pending_snapshots() == 0 and not slots.slots_in_use() and not slots.held.any()
    # Windows waited for fuller batches only where the policy lets them; whole batches went.
    assert (sched.timings["align_held"] > 0) == (hold > 0)
    if hold:
        assert 2 in submitted


def test_a_stream_given_up_on_leaves_the_next_one_whole(transcriber, items) -> None:
    """A consumer that stops reading a stream early (a `break` in its loop) leaves windows in the
    slots and snapshots queued; the next stream on the same engine still gives every record, the
    same as a fresh engine's (it failed with a KeyError on the old stream's window before)."""
    options = replace(FALLBACK, word_timestamps=True)
    config = replace(transcriber.config, n_slots=3)
    fresh = records(transcriber.build_scheduler(options, config), items)
    sched = transcriber.build_scheduler(options, config)
    stream = sched.run(items)
    next(stream)
    stream.close()  # what leaving a for loop over it does once nothing refers to it
    assert sched.engine.slots.slots_in_use() > 0  # windows of the stream given up on are still there
    assert [_without_probabilities(r) for r in records(sched, items)] == [_without_probabilities(r) for r in fresh]
    assert sched.engine.pending_snapshots() == 0 and not sched.engine.slots.slots_in_use()


def test_slot_count_does_not_change_results(tiny_en_dir, shared_data) -> None:
    """Windows admitted into different slots, in groups, at different times decode identically."""
    pytest.importorskip("openai.types.audio")
    from batchscribe.api import Transcriber

    audio = decode_audio(shared_data / "longform" / "earnings22" / "earnings22_1_4482311_3_62.wav")
    jfk = decode_audio(shared_data / "misc" / "jfk.flac")
    items = [("a", audio), ("b", jfk), ("c", audio[: 16000 * 7]), ("d", jfk[: 16000 * 4]), ("e", audio[16000 * 20 :])]
    one = Transcriber(str(tiny_en_dir), device="cpu", batch_size=1, **GREEDY).transcribe(items, sample_rate=16000)
    many = Transcriber(str(tiny_en_dir), device="cpu", batch_size=3, **GREEDY).transcribe(items, sample_rate=16000)
    assert [r["id"] for r in many] == ["a", "b", "c", "d", "e"]
    for a, b in zip(one, many):
        assert [s["tokens"] for s in a["segments"]] == [s["tokens"] for s in b["segments"]]
        _check_record(b)


def test_out_of_memory_shrinks_slots_and_admission_groups(tiny_en_dir, shared_data, monkeypatch, caplog) -> None:
    """Out of memory while allocating slots halves them; out of memory while admitting a group
    requeues it and admits smaller groups. Either way every item still gets its record, unchanged.
    (On the GPU these are torch.OutOfMemoryError from the allocator; here they are injected.)"""
    from batchscribe.api import Transcriber
    from batchscribe.engine import engine as engine_module

    jfk = decode_audio(shared_data / "misc" / "jfk.flac")
    items = [(f"u{i}", jfk[: 16000 * (3 + i)]) for i in range(5)]
    expected = Transcriber(str(tiny_en_dir), device="cpu", batch_size=2, **GREEDY).transcribe(items, sample_rate=16000)

    real_init, real_admit = engine_module.Engine.__init__, engine_module.Engine.admit
    admits: list[int] = []

    def init(self, model, spec, config, *rest):  # rest: the alignment heads
        if config.n_slots > 8:
            raise torch.OutOfMemoryError("injected: no room for the caches")
        real_init(self, model, spec, config, *rest)

    def admit(self, requests, slots):
        admits.append(len(requests))
        if len(requests) > 1 and len(admits) == 1:
            raise torch.OutOfMemoryError("injected: encoder activations")
        real_admit(self, requests, slots)

    monkeypatch.setattr(engine_module.Engine, "__init__", init)
    monkeypatch.setattr(engine_module.Engine, "admit", admit)
    with caplog.at_level("WARNING", logger="batchscribe.engine"):
        t = Transcriber(str(tiny_en_dir), device="cpu", batch_size=32, **GREEDY)
        got = t.transcribe(items, sample_rate=16000)
    sched = t.scheduler()
    assert sched.engine.n_slots == 8 and sched.admit_max == 1
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
    alone = [Transcriber(str(tiny_en_dir), batch_size=1, **kw).transcribe([it], sample_rate=16000)[0] for it in items]
    together = Transcriber(str(tiny_en_dir), batch_size=3, **kw).transcribe(items[::-1], sample_rate=16000)[::-1]
    for a, b in zip(alone, together):
        assert {s["temperature"] for s in a["segments"]} == {1.0}
        assert [s["tokens"] for s in a["segments"]] == [s["tokens"] for s in b["segments"]]
    other_seed = Transcriber(str(tiny_en_dir), batch_size=3, seed=1, **kw).transcribe(items, sample_rate=16000)
    assert [r["text"] for r in other_seed] != [r["text"] for r in alone]


@pytest.mark.parametrize("fallback", [False, True])
def test_compacting_the_tail_changes_no_token(tiny_en_dir, shared_data, fallback: bool) -> None:
    """Once nothing is left to admit, running windows move down into the rows finished ones left
    (Slots.compact), so steps cover fewer rows; every record stays the same, long-form seeks and
    sampled fallbacks (whose noise is keyed by window, not slot) included."""
    pytest.importorskip("openai.types.audio")
    from batchscribe.api import Transcriber

    audio = decode_audio(shared_data / "longform" / "earnings22" / "earnings22_1_4482311_3_62.wav")
    jfk = decode_audio(shared_data / "misc" / "jfk.flac")
    # Short items finish first, in low rows, while the long ones (later slots) keep decoding.
    items = [("a", jfk[: 16000 * 2]), ("b", jfk[: 16000 * 3]), ("c", jfk), ("d", audio[: 16000 * 40]),
             ("e", jfk[: 16000 * 4]), ("f", audio)]  # fmt: skip
    kw = dict(temperatures=(0.0, 1.0), compression_ratio_threshold=0.0) if fallback else GREEDY
    runs = {}
    for compact in (False, True):
        sched = Transcriber(str(tiny_en_dir), device="cpu", batch_size=6, **kw).scheduler()
        runs[compact] = (records(sched, items, compact_tail=compact), dict(sched.timings))
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


# -- the same on a GPU (run with the GPU tests; skipped here without CUDA) ---------------------


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.gpu
@needs_cuda
def test_lagged_collection_on_cuda(tiny_en_dir, utterances, graphs) -> None:
    """On CUDA (pinned buffers, events, async copies): lag 1 with 4 steps per batch gives the
    tokens of lag 0 with a look after every step; the host waited on snapshots, not on syncs."""
    from batchscribe.api import Transcriber

    items = utterances[:24]
    t = Transcriber(str(tiny_en_dir), device="cuda", dtype="float32", batch_size=8, cuda_graphs=graphs)
    # Graphs run the bucket covering the rows in use, which the lag shifts; a different batch size
    # may sum in a different order, enough to move a window across the fallback threshold. So the
    # graph variant decodes greedily (no threshold to cross); the eager one keeps the fallbacks.
    options = DecodeOptions(temperatures=(0.0,)) if graphs else DecodeOptions(temperatures=(0.0, 0.6), logprob_threshold=-0.4)
    runs = []
    for check_every, lag in ((1, 0), (4, 1), (3, 2)):
        sched = t.build_scheduler(options)
        runs.append(sorted(records(sched, items, check_every=check_every, lag=lag), key=lambda r: r["id"]))
        assert sched.engine.pending_snapshots() == 0 and sched.timings["wait_snapshot"] > 0
    for other in runs[1:]:
        assert [r["text"] for r in other] == [r["text"] for r in runs[0]]
        assert [[s["tokens"] for s in r["segments"]] for r in other] == [[s["tokens"] for s in r["segments"]] for r in runs[0]]
        # Graph buckets follow the rows in use, which the lag shifts: allow summation order only.
        lp = [s["avg_logprob"] for r in runs[0] for s in r["segments"]]
        assert [s["avg_logprob"] for r in other for s in r["segments"]] == pytest.approx(lp, abs=1e-5)
