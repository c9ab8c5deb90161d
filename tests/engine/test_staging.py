"""Admission staging (engine/staging.py): device-side padding equals pad_or_trim, through both
alternating host buffers, with samples packed or copied from the pinned arena."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from batchscribe.audio.features import pad_or_trim
from batchscribe.config import DecodeOptions
from batchscribe.constants import N_SAMPLES
from batchscribe.engine.pinned import PinnedArena
from batchscribe.engine.requests import WindowRequest
from tests.marks import needs_cuda


def test_staging_pads_like_pad_or_trim(tiny_en_dir) -> None:
    """Padding on the device from flat samples equals pad_or_trim per window, through both
    alternating host buffers, and a staged group is not disturbed by the next admission's."""
    from batchscribe.api import Transcriber

    transcriber = Transcriber(str(tiny_en_dir), device="cpu")
    engine = transcriber.build_scheduler(DecodeOptions(), dataclasses.replace(transcriber.config, n_slots=6)).engine
    rng = np.random.default_rng(0)
    prompt = transcriber.tokenizer.sot_sequence(None, "transcribe", False)

    def group(lengths: list[int]) -> list[WindowRequest]:
        return [WindowRequest(i, rng.standard_normal(n).astype(np.float32), prompt, False, 0.2 * i, 7 + i)
                for i, n in enumerate(lengths)]  # fmt: skip

    groups = [group([16000 * 7, 1, N_SAMPLES, 0, N_SAMPLES + 500, 12345]), group([N_SAMPLES - 1, 3]), group([5])]
    # A mix of samples decoded into the pinned arena (copied as they are) and ordinary ones (packed)
    # is staged alike.
    arena = engine.staging.arena = PinnedArena(4 * N_SAMPLES, pin=False)
    mixed = []
    for i, r in enumerate(groups[0]):
        audio = arena.allocate(len(r.audio)) if i % 2 == 0 else r.audio.copy()
        audio[:] = r.audio
        mixed.append(dataclasses.replace(r, audio=audio))
    assert [arena.holds(r.audio) for r in mixed] == [True, False, True, False, True, False]
    groups.append(mixed)
    staged = [engine.staging.stage(g, list(range(len(g)))[::-1]) for g in groups]
    for requests, got in zip(groups, staged):
        expected = torch.stack([pad_or_trim(torch.as_tensor(r.audio), N_SAMPLES) for r in requests])
        assert torch.equal(got.audio, expected)
        assert got.ints[:, 0].tolist() == list(range(len(requests)))[::-1]  # slots
        assert got.floats.tolist() == pytest.approx([r.temperature for r in requests])

    # Admission scatters the packed state into exactly the named slots.
    requests = group([16000, 16000 * 3])
    engine.admit(requests, [4, 1])
    state = engine.slots.state
    assert engine.slots.keys == [None, 1, None, None, 0, None]
    n = len(prompt)
    assert state.tokens[[4, 1], :n].tolist() == [list(prompt)] * 2 and int(state.tokens[[4, 1], n:].abs().sum()) == 0
    assert state.sample_begin[[4, 1]].tolist() == [n, n]
    assert state.sample_end[[4, 1]].tolist() == [n + engine.spec.sample_len - 1] * 2
    assert state.noise_key[[4, 1]].tolist() == [7, 8] and state.temperature[[4, 1]].tolist() == pytest.approx([0.0, 0.2])
    assert state.running.tolist() == [False, True, False, False, True, False]


def test_a_buffer_makes_its_packed_samples_only_when_a_group_first_has_samples_outside_the_arena(tiny_en_dir) -> None:
    """The packed part (n_slots windows, ~0.5 GB pinned at 256 slots on CUDA) is start-up time a
    run whose items all decode into the arena never needs: it is made on first use, per buffer."""
    from batchscribe.api import Transcriber

    transcriber = Transcriber(str(tiny_en_dir), device="cpu")
    staging = transcriber.build_scheduler(DecodeOptions(), dataclasses.replace(transcriber.config, n_slots=4)).engine.staging
    arena = staging.arena = PinnedArena(4 * N_SAMPLES, pin=False)
    prompt = transcriber.tokenizer.sot_sequence(None, "transcribe", False)
    rng = np.random.default_rng(2)

    def request(audio: np.ndarray) -> WindowRequest:
        return WindowRequest(0, audio, prompt, False, 0.0)

    assert [b.audio for b in staging.buffers] == [None, None]
    in_arena = arena.allocate(16000)
    in_arena[:] = rng.standard_normal(16000)
    for group in ([request(in_arena)], [request(np.zeros(0, np.float32))], [request(in_arena)]):
        got = staging.stage(group, [0])
        assert torch.equal(got.audio[0], pad_or_trim(torch.as_tensor(group[0].audio), N_SAMPLES))
    assert [b.audio for b in staging.buffers] == [None, None]  # arena samples and empty windows only
    plain = rng.standard_normal(8000).astype(np.float32)
    got = staging.stage([request(plain)], [0])
    assert torch.equal(got.audio[0], pad_or_trim(torch.as_tensor(plain), N_SAMPLES))
    made = [b.audio is not None for b in staging.buffers]
    assert made.count(True) == 1 and staging.buffers[made.index(True)].audio.numel() == 4 * N_SAMPLES


@pytest.mark.gpu
@needs_cuda
def test_staging_on_cuda(tiny_en_dir) -> None:
    """Pinned double-buffered staging and device-side padding equal pad_or_trim on CUDA, across
    more admissions than there are buffers."""
    from batchscribe.api import Transcriber

    t = Transcriber(str(tiny_en_dir), device="cuda", batch_size=4, cuda_graphs=False)
    engine = t.build_scheduler(DecodeOptions()).engine
    rng = np.random.default_rng(1)
    prompt = t.tokenizer.sot_sequence(None, "transcribe", False)
    for lengths in ([N_SAMPLES, 7, 0, 16000 * 9], [3], [N_SAMPLES + 9, 16000], [16000 * 29, 1, 2, 3]):
        requests = [WindowRequest(i, rng.standard_normal(n).astype(np.float32), prompt, False, 0.0) for i, n in enumerate(lengths)]
        staged = engine.staging.stage(requests, list(range(len(requests))))
        expected = torch.stack([pad_or_trim(torch.from_numpy(r.audio), N_SAMPLES) for r in requests])
        assert torch.equal(staged.audio.cpu(), expected)
        assert staged.ints[:, 0].tolist() == list(range(len(requests)))
