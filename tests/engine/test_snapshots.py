"""Snapshots (engine/snapshots.py) on real tiny.en: a stale snapshot never finishes a re-admitted slot."""

from __future__ import annotations

import dataclasses

from batchscribe.audio.decode import decode_audio
from batchscribe.config import DecodeOptions
from batchscribe.engine.requests import WindowRequest


def _engine(transcriber, n_slots: int):
    config = dataclasses.replace(transcriber.config, n_slots=n_slots)
    return transcriber.build_scheduler(DecodeOptions(temperatures=(0.0,)), config).engine


def _decode_alone(engine, slot: int) -> None:
    """Step until `slot` finishes (reading the device state directly: this is the CPU), dropping
    the snapshot each look queues."""
    for _ in range(engine.n_ctx):
        if not bool(engine.slots.state.running[slot]):
            return
        engine.advance(engine.slots.rows_in_use(), 1)
        engine.wait_snapshot()
    raise AssertionError(f"slot {slot} never finished")


def _collect(engine) -> list:
    """A look now, then every queued snapshot's finished windows."""
    engine.advance(engine.slots.rows_in_use(), 0)
    results = []
    while engine.pending_snapshots():
        results += engine.finished(engine.wait_snapshot())
    return results


def test_stale_snapshot_does_not_finish_a_readmitted_slot(tiny_en_dir, shared_data) -> None:
    """A slot freed from one snapshot and re-admitted before the next snapshot is processed must
    not be reported finished from that older snapshot (it would return the previous window's
    tokens under the new window's key)."""
    from batchscribe.api import Transcriber

    transcriber = Transcriber(str(tiny_en_dir), device="cpu")
    tok = transcriber.tokenizer
    jfk = decode_audio(shared_data / "misc" / "jfk.flac")
    prompt = tok.sot_sequence(None, "transcribe", False)
    first = WindowRequest(1, jfk, prompt, False, 0.0)
    second = WindowRequest(2, jfk[16000 * 6 :], prompt, False, 0.0)

    engine = _engine(transcriber, n_slots=2)
    engine.admit([first], [0])
    _decode_alone(engine, 0)
    engine.advance(engine.slots.rows_in_use(), 0)
    engine.advance(engine.slots.rows_in_use(), 0)  # both show slot 0 finished with the first window
    (done,) = engine.finished(engine.wait_snapshot())
    assert done.key == 1 and "ask not what your country can do for you" in tok.decode(done.tokens)
    engine.admit([second], [0])  # slot 0 is reused while the second snapshot is still queued
    assert engine.finished(engine.wait_snapshot()) == []
    assert engine.slots.keys[0] == 2 and bool(engine.slots.state.running[0])
    _decode_alone(engine, 0)
    (done,) = _collect(engine)
    text = tok.decode(done.tokens)  # the audio from 6 s: "... country can do for you, ask what ..."
    assert done.key == 2 and "ask what you can do for your country" in text and "fellow" not in text
    # The same window decoded in a fresh engine: identical, so nothing of the first leaked in.
    fresh = _engine(transcriber, n_slots=2)
    fresh.admit([second], [0])
    _decode_alone(fresh, 0)
    assert _collect(fresh) == [done]
