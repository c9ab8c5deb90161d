"""Slot compaction (engine/slots.py) on real tiny.en: rows move with their whole state and K/V."""

from __future__ import annotations

import numpy as np
import torch

from tests.engine.helpers import GREEDY


def _per_slot_tensors(objs: dict[str, object], n_slots: int) -> dict[str, torch.Tensor]:
    return {f"{owner}.{name}": v for owner, obj in objs.items() for name, v in vars(obj).items()
            if isinstance(v, torch.Tensor) and v.shape[:1] == (n_slots,)}  # fmt: skip


def test_compact_moves_every_slot_tensor_and_the_host_mirror(tiny_en_dir) -> None:
    """The engine's part on its own: rows past the occupied count land in the holes below it with
    their whole state and K/V; the rows left behind are free and inert; snapshots queued before the
    move skip both ends of it."""
    from batchscribe.api import Transcriber
    from batchscribe.engine.requests import WindowRequest

    t = Transcriber(str(tiny_en_dir), device="cpu", batch_size=8, **GREEDY)
    t.transcribe([("warm", np.zeros(16000, np.float32))], sample_rate=16000)
    engine = t.scheduler().engine
    slots, state = engine.slots, engine.slots.state
    # Every per-slot tensor the engine holds is one compact() moves (the snapshot table is
    # rewritten from them on every look): a tensor added later cannot be forgotten.
    held = _per_slot_tensors({"engine": engine, "slots": slots, "state": state, "snapshots": engine.snapshots}, 8)
    per_slot = {name for name, v in held.items() if not any(v is c for c in engine.cache.tensors())}
    moved = {name for name, v in held.items() if any(v is m for m in state.tensors())}
    assert per_slot - {"snapshots.table"} == moved
    rng = np.random.default_rng(0)
    prompt = (50257, 50362)  # <|startoftranscript|><|notimestamps|>, tiny.en
    reqs = [WindowRequest(key=k, audio=rng.standard_normal(16000 * (k + 1)).astype(np.float32) * 0.1,
                          prompt=prompt, temperature=0.0, detect_language=False, noise_key=k)
            for k in range(4)]  # fmt: skip
    engine.admit(reqs, [0, 2, 5, 7])
    engine.advance(slots.rows_in_use(), 3)  # queued before the move: rows 1, 3, 4 and 6 are free (not running) in it
    before = {name: getattr(state, name).clone() for name in ("tokens", "positions", "sum_logprob", "sample_end")}
    cross, self_v = engine.cache.cross_k[0].clone(), engine.cache.self_v[-1].clone()
    slots.keys[0], slots.occupied[0] = None, False  # as if slot 0's window had been collected
    assert engine.compact() == 3 and slots.rows_in_use() == 3
    assert slots.keys[:3] == [2, 3, 1] and not slots.occupied[3:].any()  # 5 -> 0, 7 -> 1, 2 stays
    for name, old in before.items():
        new = getattr(state, name)
        assert torch.equal(new[0], old[5]) and torch.equal(new[1], old[7]) and torch.equal(new[2], old[2]), name
    assert torch.equal(engine.cache.cross_k[0][:2], cross[[5, 7]]) and torch.equal(engine.cache.self_v[-1][:2], self_v[[5, 7]])
    assert state.running[:3].all() and not state.running[3:].any()  # the rows left behind are inert
    # The old snapshot shows row 1 free; without the generation guard it would report key 3 done.
    assert engine.finished(engine.wait_snapshot()) == []
    state.running[1] = False  # key 3 (moved from row 7) finishes
    engine.advance(slots.rows_in_use(), 0)  # a look with no steps: only the snapshot
    (result,) = engine.finished(engine.wait_snapshot())
    position = int(before["positions"][7])
    assert result.key == 3 and result.tokens == before["tokens"][7, len(prompt) : position + 1].tolist()
