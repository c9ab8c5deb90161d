"""The alignment pass for word timestamps: a teacher-forced decoder pass over many finished windows
at once, reading the cross-attention of the model's alignment heads (openai-whisper's
find_alignment, batched).

Each window's audio goes through the engine's own log-mel and encoder again (so the features are
the ones its tokens were decoded from), then the decoder runs once over every window's padded token
sequence `prefix + <|notimestamps|> + text + <|endoftext|>`, causally masked, so padding after a
window's tokens changes none of its rows. Only the alignment heads' softmax(QK^T) is formed
explicitly (in float32); every other attention is SDPA. The normalisation that follows is
openai's, for the whole batch at once (`batch_matrix`): softmax over each window's real frames,
standardised over its tokens, median-filtered along time (width 7), averaged over the heads. The
DTW path through it is found beside the matrices (engine/dtw_device.py); the word rules run on the
host (batchscribe.words).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from batchscribe.constants import N_SAMPLES
from batchscribe.engine import dtw_device
from batchscribe.model.whisper import Whisper

log = logging.getLogger(__name__)
MEDIAN_WIDTH = 7  # openai find_alignment's medfilt_width


@dataclass(frozen=True)
class AlignWindow:
    """One finished window whose words are to be timed."""

    audio: np.ndarray  # [n <= N_SAMPLES] float32: the window's samples
    prefix: tuple[int, ...]  # the sot sequence it was decoded with (language token filled in)
    text_tokens: tuple[int, ...]  # every segment's text tokens (< eot), in order
    num_frames: int  # mel frames of real audio in the window (<= 3000)


@dataclass(frozen=True)
class Alignment:
    path: tuple[np.ndarray, np.ndarray]  # DTW through -matrix: (row, column) per step; rows from <|notimestamps|>
    token_probs: list[float]  # P(text token k | the tokens before it), teacher-forced


def batch_matrix(qk: torch.Tensor, rows: Sequence[int], frames: Sequence[int], width: int = MEDIAN_WIDTH,
                 budget: int = 1 << 28) -> torch.Tensor:  # fmt: skip
    """openai find_alignment's matrix for many windows in one set of operations: for window b,
    softmax over its frames of qk[b, :, :rows[b], :frames[b]], standardised over its rows, median-
    filtered along time (mirrored at its own last frame), averaged over the heads.

    qk: [B' >= B, heads, L, A] float32 -> [B, max(rows), max(frames)], each window's values in its
    own (rows[b], frames[b]) corner. Every reduction runs over the whole fixed L or A with the
    window's own mask, so on CUDA (fixed L) a window's values do not depend on the others'.
    The median runs `budget` bytes of windows at a time (sort keeps values and indices)."""
    n, (heads, length, audio) = len(rows), qk.shape[1:]
    dev = qk.device
    counts = torch.tensor(list(rows), device=dev)
    ends = torch.tensor(list(frames), device=dev)
    cols = torch.arange(audio, device=dev)[None, :] < ends[:, None]  # [B, A]
    # In place where the values allow it: at the fixed shape each [B, H, L, A] copy is large.
    x = qk[:n].masked_fill(~cols[:, None, None, :], float("-inf")).softmax(dim=-1)  # [B, H, L, A]
    live = (torch.arange(length, device=dev)[None, :] < counts[:, None]).to(x.dtype)[:, None, :, None]
    size = counts.to(x.dtype)[:, None, None, None]
    mean = (x * live).sum(dim=-2, keepdim=True) / size
    std = (x - mean).mul_(live).pow_(2).sum(dim=-2, keepdim=True).div_(size).sqrt_()
    r, f, half = max(rows), max(frames), width // 2
    x = x.sub_(mean).div_(std)[:, :, :r, :f]
    # Each window's own mirror: position t reads t, -t before its start, 2 (end - 1) - t after it.
    t = torch.arange(f + 2 * half, device=dev)[None, :] - half
    index = torch.where(t < 0, -t, torch.where(t >= ends[:, None], 2 * (ends[:, None] - 1) - t, t)).clamp(0, f - 1)
    step = max(1, budget // (heads * r * f * width * 12))
    out = torch.empty(n, r, f, dtype=x.dtype, device=dev)
    for a in range(0, n, step):
        part, at = x[a : a + step], index[a : a + step]
        padded = part.gather(-1, at[:, None, None, :].expand(*part.shape[:3], at.shape[-1]))
        filtered = padded.unfold(-1, width, 1).sort(dim=-1).values[..., half]
        short = (ends[a : a + step] <= half)[:, None, None, None]  # too short to mirror: as it is
        out[a : a + step] = torch.where(short, part, filtered).mean(dim=1)
    return out


class Aligner:
    """Times words on the engine's model and encoder; `__call__` takes any number of windows and
    runs them `max_batch` at a time.

    On CUDA every batch has the same shape (padded to `max_batch` windows of the model's whole text
    context): a kernel's result for one row can depend on a GEMM's size, so a window's words would
    otherwise change with which windows happened to finish beside it (looks differ between graph
    replay and eager, and between runs). One transfer per batch brings back the token
    probabilities, and one the DTW paths, found on the device (engine/dtw_device.py)."""

    def __init__(
        self,
        model: Whisper,
        features: Callable[[torch.Tensor], torch.Tensor],  # [B, N_SAMPLES] -> [B, n_mels, 3000]
        encode: Callable[[torch.Tensor], torch.Tensor],  # mel -> [B, n_audio_ctx, n_state]
        heads: Sequence[tuple[int, int]],  # (layer, head)
        eot: int,
        no_timestamps: int,
        max_batch: int = 16,
    ):
        self.model, self.features, self.encode = model, features, encode
        self.heads = tuple(heads)
        self.eot, self.no_timestamps = eot, no_timestamps
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.fixed = self.device.type == "cuda"
        self._pinned: torch.Tensor | None = None  # the host side of `_audio`
        n_ctx, n_audio = model.dims.n_text_ctx, model.dims.n_audio_ctx
        # The heads' float32 scores [B, heads, n_ctx, n_audio] stay under ~1 GiB.
        self.max_batch = max(1, min(max_batch, (1 << 30) // (4 * len(self.heads) * n_ctx * n_audio)))
        # Per layer, the heads read there, and where their rows go in the stacked weights.
        self._by_layer: dict[int, list[int]] = {}
        for layer, head in self.heads:
            self._by_layer.setdefault(layer, []).append(head)

    def warm_up(self) -> None:
        """One batch and both DTW kernel sizes before the run, so their first-call costs (Triton
        compilations, cuBLAS and SDPA set-up at these shapes) are start-up."""
        dtw_device.warm_up(self.device)
        self([AlignWindow(np.zeros(N_SAMPLES // 30, np.float32), (), (0,), 100)])

    @torch.no_grad()
    def __call__(self, windows: Sequence[AlignWindow]) -> list[Alignment]:
        out: list[Alignment] = []
        while len(out) < len(windows):
            try:
                out.extend(self._batch(windows[len(out) : len(out) + self.max_batch]))
            except torch.OutOfMemoryError:
                # The slots were sized before this pass allocated: batch fewer windows (its shape
                # is then smaller for the rest of the run) rather than lose the run.
                if self.max_batch == 1:
                    raise
                self.max_batch //= 2
                log.warning("out of memory timing words; aligning at most %d windows at a time", self.max_batch)
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
        return out

    def _sequences(self, windows: Sequence[AlignWindow]) -> tuple[torch.Tensor, list[int]]:
        """Padded token rows [B', L] (long, on the device) and each real row's length; B' and L fixed
        on CUDA."""
        rows = [[*w.prefix, self.no_timestamps, *w.text_tokens, self.eot] for w in windows]
        length = self.model.dims.n_text_ctx if self.fixed else max(map(len, rows))
        tokens = torch.full((self._rows(len(rows)), length), self.eot, dtype=torch.long)
        for b, row in enumerate(rows):
            tokens[b, : len(row)] = torch.tensor(row)
        return tokens.to(self.device), [len(r) for r in rows]

    def _rows(self, n: int) -> int:
        return self.max_batch if self.fixed else n

    def _audio(self, windows: Sequence[AlignWindow]) -> torch.Tensor:
        """[B', N_SAMPLES] float32 on the device, zero-padded. On CUDA through one pinned buffer
        (reused: the batch before it synced at its transfer back), so a batch is one fast copy."""
        rows = self._rows(len(windows))
        if self._pinned is None or self._pinned.shape[0] < rows:
            self._pinned = torch.zeros(rows, N_SAMPLES, dtype=torch.float32, pin_memory=self.fixed)
        host = self._pinned[:rows].numpy()
        for b in range(rows):
            audio = windows[b].audio[:N_SAMPLES] if b < len(windows) else windows[0].audio[:0]
            host[b, : len(audio)] = audio
            host[b, len(audio) :] = 0.0
        return self._pinned[:rows].to(self.device, non_blocking=True)

    def _batch(self, windows: Sequence[AlignWindow]) -> list[Alignment]:
        tokens, lengths = self._sequences(windows)
        enc = self.encode(self.features(self._audio(windows)).to(self.dtype))  # [B', n_audio_ctx, d]
        hidden, qk = self._decode(tokens, enc)  # [B', L, d], [B', n_heads, L, n_audio_ctx] float32
        shapes = [(1 + len(w.text_tokens), w.num_frames // 2) for w in windows]
        cost = torch.zeros(len(windows), max(n for n, _ in shapes), max(m for _, m in shapes),
                           dtype=torch.float64, device=self.device)  # fmt: skip
        weight = self.model.decoder.embed_tokens.weight[: self.eot]  # logits over text tokens only
        matrix = batch_matrix(qk, lengths, [m for _, m in shapes])  # [B, max L_b, max frames]
        probs = []
        for b, (w, (_, frames)) in enumerate(zip(windows, shapes)):  # no host sync: one transfer after
            n_prefix, n_text = len(w.prefix), len(w.text_tokens)
            # Position n_prefix (<|notimestamps|>) predicts text token 0, and so on; per window, so
            # that a product's shape (and so its rounding) is the window's own.
            logits = (hidden[b, n_prefix : n_prefix + n_text] @ weight.T).float()  # [n_text, eot]
            target = tokens[b, n_prefix + 1 : n_prefix + 1 + n_text]
            probs.append(logits.softmax(dim=-1).gather(1, target[:, None])[:, 0])
            # The rows from <|notimestamps|> to the last text token.
            cost[b, : 1 + n_text, :frames] = -matrix[b, n_prefix : n_prefix + 1 + n_text, :frames].double()
        token_probs = torch.cat(probs).cpu().tolist()
        found, at = [], 0
        for w, path in zip(windows, dtw_device.paths(cost, shapes)):
            found.append(Alignment(path, token_probs[at : at + len(w.text_tokens)]))
            at += len(w.text_tokens)
        return found

    def _decode(self, tokens: torch.Tensor, enc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder over whole sequences: tokens [B, L], enc [B, n_audio_ctx, d] -> the final
        hidden states [B, L, d] (after the last layer norm) and the alignment heads' QK^T / sqrt(D)
        [B, n_heads, L, n_audio_ctx] in float32, in `heads` order."""
        dec = self.model.decoder
        length = tokens.shape[1]
        x = dec.embed_tokens(tokens) + dec.embed_positions.weight[:length]
        picked: dict[tuple[int, int], torch.Tensor] = {}
        for i, layer in enumerate(dec.layers):
            attn = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            q, k, v = (attn.heads(p(h)).transpose(1, 2) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
            x = x + attn.out_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2))
            cross = layer.encoder_attn
            q = cross.heads(cross.q_proj(layer.encoder_attn_layer_norm(x))).transpose(1, 2)  # [B, H, L, D]
            k, v = (cross.heads(p(enc)).transpose(1, 2) for p in (cross.k_proj, cross.v_proj))
            for head in self._by_layer.get(i, ()):
                picked[(i, head)] = (q[:, head].float() @ k[:, head].float().transpose(-1, -2)) * cross.head_dim**-0.5
            x = x + cross.out_proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))
            x = x + layer.fc2(F.gelu(layer.fc1(layer.final_layer_norm(x))))
        return dec.layer_norm(x), torch.stack([picked[h] for h in self.heads], dim=1)
