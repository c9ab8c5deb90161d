"""Silero VAD's speech probabilities for a batch of items (16 kHz), two ways over one model.

Silero scores 512-sample chunks in order: each chunk, with the last 64 samples before it as
context, goes through an STFT and a convolutional encoder to 128 features, then one step of an
LSTM cell whose state carries across chunks, then a 1x1 convolution and a sigmoid. Only the LSTM
step depends on earlier chunks.

- `stepwise`: the model's own `audio_forward` over the items as rows of one batch (each row keeps
  its own state), chunk step by chunk step, the whole model per step: what get_speech_timestamps
  computes, with the per-step cost shared by the rows.
- `sequence` (`SequenceScorer`): the encoder over every chunk of every item at once (each chunk's
  input is known from the audio: it needs no state), the LSTM over the items' feature sequences in
  one call of `torch.nn.LSTM` holding the cell's weights, the head over every output at once. The
  same arithmetic in other batch shapes, so probabilities equal `stepwise`'s up to float rounding
  (tests/audio/test_vad_model.py); an item alone costs one encoder pass, not one model call per
  chunk. It reads the model's submodules, so `SequenceScorer.fits` checks them on a probe first
  (a silero-vad release may change them).

An item's probabilities from either path depend in their last bits on the other items of its call:
the convolutions' and the LSTM's kernels change with the row count. `SequenceScorer(rows=R)` runs
every call at fixed shapes instead (R items, the encoder and head over FIXED_ROWS chunks, the LSTM
over FIXED_STEPS time steps per call, each padded with zeros), so an item's probabilities are the
same bits in any batch (`--batch-invariant`). At fixed shapes the head (ReLU, then a 1x1 convolution
to one channel, then a sigmoid) runs as a product and a sum over each row's features: a convolution
kernel may give a row other bits by where it sits in the call (oneDNN on an AVX-512 Xeon: a
tail row of a 97-row call), a reduction over each row's own features cannot. Its calls are a
multiple of HEAD_ALIGN rows: torch's CPU loops leave a call's last elements, past its last full
vector, to a scalar sigmoid whose last bit differs from the vectorised one (seen on an AVX2 EPYC).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

CHUNK, CONTEXT, FEATURES = 512, 64, 128  # samples per probability, samples of context, LSTM width (16 kHz)
ENCODE_CHUNKS = 8192  # chunks per encoder call: bounds the STFT's activations ([n, 258, 4] floats)
LSTM_POSITIONS = 1 << 16  # rows x time steps per LSTM call: bounds its gates ([n, 512] floats)
FIXED_ROWS = 2048  # chunks per encoder and head call at fixed shapes
FIXED_STEPS = 128  # LSTM time steps per call at fixed shapes (~4 s of audio)
HEAD_ALIGN = 64  # rows: a multiple of every CPU vector loop's stride (2 x 16 floats on AVX-512)
PROBE_TOLERANCE = 1e-4  # far above float32 rounding, far below what a wrongly read part gives


def n_chunks(n_samples: int) -> int:
    return -(-n_samples // CHUNK)


def stepwise(model: Any, audios: Sequence[np.ndarray], device: Any) -> list[np.ndarray]:
    """Each item's probabilities ([n_chunks] float32, host) from one `audio_forward` call over the
    items zero-padded to the longest (the zeros after an item's end only follow its own chunks)."""
    import torch

    batch = np.zeros((len(audios), max([1, *(n_chunks(len(a)) for a in audios)]) * CHUNK), dtype=np.float32)  # [B, T]
    for row, audio in zip(batch, audios):
        row[: len(audio)] = audio
    probs = model.audio_forward(torch.from_numpy(batch).to(device), 16000).numpy()  # [B, T / 512], host
    return [probs[k, : n_chunks(len(a))] for k, a in enumerate(audios)]


class SequenceScorer:
    """Silero's probabilities with its encoder and head over all chunks at once and its LSTM over
    whole sequences (see the module docstring)."""

    def __init__(self, model: Any, device: Any, rows: int | None = None):
        """`rows`: score at fixed shapes, `rows` items a call (see the module docstring); None:
        every call's shapes follow its items."""
        import torch

        inner = model._model
        self.stft, self.encoder, self.head = inner.stft, inner.encoder, inner.decoder.decoder
        conv = getattr(self.head, "2")  # the head's Conv1d(128, 1, 1), between its ReLU and its sigmoid
        # [128], [] on the scoring device once, not per call
        self.head_weight, self.head_bias = conv.weight.reshape(FEATURES).to(device), conv.bias.reshape(()).to(device)
        cell = inner.decoder.rnn
        self.lstm = torch.nn.LSTM(FEATURES, FEATURES, batch_first=True).to(device).eval()
        with torch.no_grad():
            for ours, theirs in (("ih", cell.weight_ih), ("hh", cell.weight_hh)):
                getattr(self.lstm, f"weight_{ours}_l0").copy_(theirs)
            self.lstm.bias_ih_l0.copy_(cell.bias_ih)
            self.lstm.bias_hh_l0.copy_(cell.bias_hh)
        self.device, self.rows = device, rows

    @classmethod
    def fits(cls, model: Any) -> bool:
        """Whether `model` (on the CPU) has the parts this reads and they give its own
        probabilities on a probe, within rounding. On the CPU: a device's own rounding (TF32
        convolutions on CUDA) is no sign of reading the wrong parts."""
        import torch

        rng = np.random.default_rng(0)
        t = np.arange(3 * 16000) / 16000
        probe = (0.3 * np.sin(2 * np.pi * 220 * t * (1 + t)) * (t > 1) + rng.normal(0, 0.01, t.size)).astype(np.float32)
        try:
            with torch.inference_mode():
                theirs = stepwise(model, [probe, probe[:7000]], "cpu")
                ours = [cls(model, "cpu", rows)([probe, probe[:7000]]) for rows in (None, 2)]  # both heads
        except (AttributeError, RuntimeError, TypeError, ValueError):
            return False
        return all(a.shape == b.shape and np.abs(a - b).max() < PROBE_TOLERANCE
                   for got in ours for a, b in zip(got, theirs))  # fmt: skip

    def __call__(self, audios: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Each item's probabilities ([n_chunks] float32, host)."""
        if self.rows is not None:  # fixed shapes: `rows` items a call
            return [p for i in range(0, len(audios), self.rows) for p in self._score(audios[i : i + self.rows])]
        return self._score(audios)

    def _score(self, audios: Sequence[np.ndarray]) -> list[np.ndarray]:
        import torch

        counts = [n_chunks(len(a)) for a in audios]
        if not sum(counts):
            return [np.zeros(0, dtype=np.float32) for _ in audios]
        features = self._encode(self._frames(audios, counts))  # [N, 128]
        hidden = self._recur(torch.split(features, counts))  # [N, 128]
        probs = self._head(hidden)  # [N]
        return list(np.split(probs, np.cumsum(counts)[:-1]))

    def _frames(self, audios: Sequence[np.ndarray], counts: list[int]) -> Any:
        """Every chunk's model input, its context then its samples: [N = sum(counts), 576], on the device."""
        import torch

        spans = [CONTEXT + n * CHUNK for n in counts]
        flat = np.zeros(sum(spans), dtype=np.float32)  # each item: 64 zeros, its samples, zeros to a chunk
        for start, audio in zip(np.cumsum([0, *spans[:-1]]), audios):
            flat[start + CONTEXT : start + CONTEXT + len(audio)] = audio
        flat_t = torch.from_numpy(flat).to(self.device)  # [sum(spans)]
        parts = [item.unfold(0, CONTEXT + CHUNK, CHUNK) for item in torch.split(flat_t, spans) if len(item) > CONTEXT]
        return torch.cat(parts)  # [N, 576]

    def _encode(self, frames: Any) -> Any:
        """[N, 576] -> [N, 128]: the STFT and encoder, a slice of chunks at a time."""
        import torch

        step = ENCODE_CHUNKS if self.rows is None else FIXED_ROWS
        return torch.cat([self.encoder(self.stft(part)).squeeze(-1) for part in self._slices(frames, step)])[: len(frames)]

    def _head(self, hidden: Any) -> Any:
        """[N, 128] -> [N] probabilities on the host: the 1x1 convolution and sigmoid."""
        import torch

        if self.rows is None:  # one call
            return self.head(hidden.unsqueeze(-1)).reshape(-1).float().cpu().numpy()
        # Fixed shapes: each row's bits its own (see the module docstring).
        rows = -(-FIXED_ROWS // HEAD_ALIGN) * HEAD_ALIGN  # no row in a loop's scalar tail
        parts = [torch.sigmoid((torch.relu(part) * self.head_weight).sum(-1) + self.head_bias)
                 for part in self._slices(hidden, rows)]  # fmt: skip
        return torch.cat(parts)[: len(hidden)].float().cpu().numpy()

    def _slices(self, x: Any, step: int) -> list[Any]:
        """`x` [n, ...] in slices of `step` rows; at fixed shapes the last is padded with zeros."""
        import torch

        if self.rows is not None and len(x) % step:
            x = torch.cat([x, x.new_zeros((step - len(x) % step, *x.shape[1:]))])
        return [x[i : i + step] for i in range(0, len(x), step)]

    def _recur(self, sequences: Sequence[Any]) -> Any:
        """Items' feature sequences ([n_k, 128] each) -> the LSTM's outputs, concatenated [N, 128].
        Rows padded at their end (causal: padding changes no earlier step); time cut into slices
        that carry (h, c) across, to bound the gates' memory. At fixed shapes: `rows` rows (zero
        rows for missing items) and slices of FIXED_STEPS, the last padded."""
        import torch
        import torch.nn.functional as F

        live = [s for s in sequences if len(s)]
        padded = torch.nn.utils.rnn.pad_sequence(live, batch_first=True)  # [B, T, 128]
        step = max(1, LSTM_POSITIONS // len(live)) if self.rows is None else FIXED_STEPS
        state, outs = None, []
        for i in range(0, padded.shape[1], step):
            part = padded[:, i : i + step]  # [B, <= step, 128]
            if self.rows is not None:  # into a [rows, FIXED_STEPS, 128] block of zeros
                part = F.pad(part, (0, 0, 0, step - part.shape[1], 0, self.rows - len(live)))
            out, state = self.lstm(part, state)
            outs.append(out[: len(live), : min(step, padded.shape[1] - i)])
        hidden = torch.cat(outs, dim=1)  # [B, T, 128]
        return torch.cat([hidden[k, : len(s)] for k, s in enumerate(live)])
