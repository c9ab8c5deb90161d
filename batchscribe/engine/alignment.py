"""The alignment pass for word timestamps: a teacher-forced decoder pass over many finished windows
at once, reading the cross-attention of the model's alignment heads (openai-whisper's
find_alignment, batched).

A finished window's cross-attention K/V are still in its decoder slot when the pass runs (the slot
is freed at the collect that reads the window and refilled only by a later admission, behind the
pass in stream order), so the pass reads them there instead of encoding the audio again. The
decoder then runs once over every window's padded token sequence
`prefix + <|notimestamps|> + text + <|endoftext|>`, causally masked, so padding after a window's
tokens changes none of its rows. Only the alignment heads' softmax(QK^T) is formed explicitly (in
float32); every other attention is SDPA. The matrix is openai's (engine/align_matrix.py), the DTW
path through it is found beside it (engine/dtw_device.py); the word rules run on the host
(batchscribe.words).

On CUDA a batch has a fixed shape: `max_batch` windows padded to one of LENGTHS tokens, windows
grouped by the bucket of their own length (a kernel's result for one row can depend on a GEMM's
size, so a window's words would otherwise change with which windows finished beside it). With CUDA
graphs each bucket's whole pass, DTW included, is captured the second time it is needed (the first
runs eagerly, its warm-up; `warm_up` does both before a run for all but the largest bucket) and
replayed: one launch, one copy in and three back per batch.

With SIDE_STREAM (off until measured on a GPU) the pass runs on a stream of its own, beside the
decode steps queued after it: it starts once the work queued before it is done, and whatever may
rewrite a slot (an admission, a compaction) first makes its stream wait for the passes queued so
far (`fence`).

The pass is split so that the host need not wait for it: `submit` queues every batch (its input
from a pinned buffer of its own, its outputs' copies into pinned host buffers of their own right
behind its replay, since a bucket's graph outputs are rewritten by its next replay, then an event)
and returns a `PendingAlignment`; `result()` waits on the events and unpacks. On the CPU `submit`
computes at once and `result()` only unpacks.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from batchscribe.attention.triton_common import triton_available
from batchscribe.attention.triton_window import window_cross_attention
from batchscribe.engine import dtw_device
from batchscribe.engine.align_matrix import batch_matrix
from batchscribe.engine.graphs import PassGraphs
from batchscribe.engine.target_probs import target_probs
from batchscribe.model.cache import DecoderCache
from batchscribe.model.whisper import Whisper

log = logging.getLogger(__name__)
LENGTHS = (64, 128, 256)  # token buckets on CUDA, below the model's whole context (448)
_FIELDS = 4  # the packed input's leading columns: slot, prefix length, text length, frames
MAX_BATCH = 16  # windows per pass batch, where the slots and the heads' scores allow it
SIDE_STREAM = False  # on CUDA, the pass on a stream of its own beside the decode steps
PROB_ROWS = 2048  # token rows whose vocabulary logits are formed at once (~0.3 GB at 51,864 tokens)


@dataclass(frozen=True)
class AlignWindow:
    """One finished window whose words are to be timed."""

    slot: int  # the decoder slot that still holds the window's cross-attention K/V
    prefix: tuple[int, ...]  # the sot sequence it was decoded with (language token filled in)
    text_tokens: tuple[int, ...]  # every segment's text tokens (< eot), in order
    num_frames: int  # mel frames of real audio in the window (<= 3000)


@dataclass(frozen=True)
class Alignment:
    path: tuple[np.ndarray, np.ndarray]  # DTW through -matrix: (row, column) per step; rows from <|notimestamps|>
    token_probs: list[float]  # P(text token k | the tokens before it), teacher-forced


@dataclass(frozen=True)
class _Queued:
    """One batch's results on their way to the host (pinned buffers on CUDA that copies queued
    behind its pass fill; on the CPU the results themselves) and what they are read with."""

    text_lengths: tuple[int, ...]  # per real window of the batch (the first rows)
    probs: torch.Tensor  # [B', T] float32, host
    path: tuple[torch.Tensor, torch.Tensor] | list  # ([2, B', steps], [B']) int32 on the host, or host paths
    ready: torch.cuda.Event | None  # recorded after the copies (CUDA); None: already on the host
    packed: torch.Tensor  # the batch's input [B', 4 + L] on the host: kept until its copy in has run

    def alignments(self, clock: defaultdict[str, float]) -> list[Alignment]:
        """The batch's windows' alignments, once the copies have landed (waits for them; the
        seconds waited and unpacking go to `clock`)."""
        t0 = time.perf_counter()
        if self.ready is not None:
            self.ready.synchronize()
        t1 = time.perf_counter()
        clock["align_sync_s"] += t1 - t0
        out = self._unpack()
        clock["align_unpack_s"] += time.perf_counter() - t1
        return out

    def _unpack(self) -> list[Alignment]:
        n = len(self.text_lengths)
        if isinstance(self.path, list):
            paths = self.path
        else:  # padding rows are left packed: only the real windows' paths are cut out
            paths = dtw_device.unpack(self.path[0][:, :n].numpy(), self.path[1][:n].numpy())
        probs = self.probs[:n].numpy()
        return [Alignment(paths[b], probs[b, :t].tolist()) for b, t in enumerate(self.text_lengths)]


class PendingAlignment:
    """An alignment pass queued by `Aligner.submit`; `result()` waits for it (only on CUDA) and
    gives one Alignment per submitted window, in order."""

    def __init__(self, n_windows: int, batches: list[tuple[list[int], _Queued]],  # (window indices, batch)
                 clock: defaultdict[str, float]):  # fmt: skip
        self.n_windows, self.batches, self.clock = n_windows, batches, clock

    def result(self) -> list[Alignment]:
        out: list[Alignment | None] = [None] * self.n_windows
        for part, batch in self.batches:
            for k, alignment in zip(part, batch.alignments(self.clock)):
                out[k] = alignment
        return out  # type: ignore[return-value]


class Aligner:
    """Times words on the engine's model and decoder cache; `submit` takes any number of windows
    and queues them `max_batch` at a time (on CUDA, per token bucket)."""

    def __init__(self, model: Whisper, cache: DecoderCache, heads: Sequence[tuple[int, int]],  # (layer, head)
                 eot: int, no_timestamps: int, max_batch: int | None = None, graphs: bool = False,
                 timings: defaultdict[str, float] | None = None, in_place: bool | None = None):  # fmt: skip
        self.model, self.cache = model, cache
        # The caller's counters (the engine's): batches, their real windows, first-use seconds.
        self.timings = timings if timings is not None else defaultdict(float)
        self.heads = tuple(heads)
        self.eot, self.no_timestamps = eot, no_timestamps
        self.dtype = next(model.parameters()).dtype
        self.device = cache.cross_k[0].device
        self.fixed = self.device.type == "cuda"  # fixed batch shapes, pinned host buffers, events
        n_ctx, n_audio = model.dims.n_text_ctx, model.dims.n_audio_ctx
        self.lengths = tuple(sorted({n for n in LENGTHS if n < n_ctx} | {n_ctx}))
        # At most MAX_BATCH (None) and the slots; the heads' float32 scores [B, heads, n_ctx, n_audio]
        # stay under ~1 GiB.
        max_batch = min(MAX_BATCH, cache.n_slots) if max_batch is None else max_batch
        self.max_batch = max(1, min(max_batch, (1 << 30) // (4 * len(self.heads) * n_ctx * n_audio)))
        self._by_layer: dict[int, list[int]] = {}  # per layer, the heads read there
        for layer, head in self.heads:
            self._by_layer.setdefault(layer, []).append(head)
        # Where Triton runs, the cross-attention reads the slots in place (attention/triton_window.py):
        # per layer, each head's index among `heads` (-1: not an alignment head). Empty: gather.
        # fp32 models keep the gather: the kernel's products would be TF32.
        self._head_index: dict[int, torch.Tensor] = {}
        if in_place is None:
            in_place = self.fixed and triton_available() and self.dtype in (torch.float16, torch.bfloat16)
        in_place = in_place and not cache.cross_int4  # the in-place kernel reads plain caches; int4 gathers
        if in_place:
            index = {layer: [-1] * model.dims.n_text_head for layer in self._by_layer}
            for k, (layer, head) in enumerate(self.heads):
                index[layer][head] = k
            self._head_index = {layer: torch.tensor(row, dtype=torch.int32, device=self.device) for layer, row in index.items()}
        self.graphs = PassGraphs(self._forward, self.device, _FIELDS) if graphs and self.fixed else None
        self._seen: set[int] = set()  # buckets run once (eagerly): the next use captures
        self.stream = torch.cuda.Stream(self.device) if self.fixed and SIDE_STREAM else None
        self._done: torch.cuda.Event | None = None  # recorded after the last pass on `stream`

    def warm_up(self) -> None:
        """Both DTW kernel sizes and one batch of the smallest bucket before the run, so their
        first-call costs (Triton compilations, cuBLAS and SDPA set-up) are start-up. With graphs,
        every bucket below the whole context is also run once and captured now: a capture in the
        run stalls the scheduler's thread (~45 ms on the H200), and most runs meet these buckets.
        The whole context's bucket (the largest graph memory) is still captured on first need."""
        dtw_device.warm_up(self.device)
        self([AlignWindow(0, (), (0,), 100)])
        if self.graphs is None:
            return
        for length in self.lengths[:-1]:
            window = AlignWindow(0, (), (0,) * (length - 2), 100)  # a text filling the bucket
            for _ in range(2 if length in self._seen else 3):  # eager first use, capture, replay
                self([window])

    def __call__(self, windows: Sequence[AlignWindow]) -> list[Alignment]:
        """The pass over `windows`, waited for."""
        return self.submit(windows).result()

    def submit(self, windows: Sequence[AlignWindow]) -> PendingAlignment:
        """Queue the pass over `windows` (on CUDA nothing here waits for the device, but a bucket's
        first capture). Their slots must hold their cross K/V as of the work queued so far; work
        queued after this call may rewrite them (stream order; with a side stream, once it has
        called `fence`)."""
        if self.stream is None:
            return self._submit(windows)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            pending = self._submit(windows)
        self._done = torch.cuda.Event()
        self._done.record(self.stream)
        return pending

    def fence(self) -> None:
        """Make the current stream's later work wait for every pass queued so far (on the side
        stream; nothing to do without one). Queues a wait: the host does not block."""
        if self._done is not None:
            torch.cuda.current_stream(self.device).wait_event(self._done)
            self._done = None

    @torch.no_grad()
    def _submit(self, windows: Sequence[AlignWindow]) -> PendingAlignment:
        batches: list[tuple[list[int], _Queued]] = []
        for length, todo in self._groups(windows).items():
            done = 0
            while done < len(todo):
                part = todo[done : done + self.max_batch]
                try:
                    batches.append((part, self._batch([windows[k] for k in part], length)))
                except torch.OutOfMemoryError:
                    # The slots were sized before this pass allocated: batch fewer windows (its
                    # shape is then smaller for the rest of the run) rather than lose the run.
                    # Batches already queued keep their own buffers; their copies are queued.
                    if self.max_batch == 1:
                        raise
                    self.max_batch //= 2
                    log.warning("out of memory timing words; aligning at most %d windows at a time", self.max_batch)
                    if self.graphs is not None:
                        self.graphs.clear()
                    if self.fixed:
                        torch.cuda.empty_cache()
                    continue
                done += len(part)
        return PendingAlignment(len(windows), batches, self.timings)

    def bucket(self, window: AlignWindow) -> int:
        """The sequence length `window`'s batch is padded to on CUDA (the bucket of its own length);
        elsewhere 0: one group, padded to its longest window."""
        if not self.fixed:
            return 0
        return next(b for b in self.lengths if b >= _length(window))

    def _groups(self, windows: Sequence[AlignWindow]) -> dict[int, list[int]]:
        """Window indices by the sequence length their batch is padded to (see `bucket`)."""
        if not self.fixed:
            return {max(map(_length, windows)): list(range(len(windows)))} if windows else {}
        groups: dict[int, list[int]] = {}
        for k, w in enumerate(windows):
            groups.setdefault(self.bucket(w), []).append(k)
        return groups

    def _batch(self, windows: Sequence[AlignWindow], length: int) -> _Queued:
        """Queue one batch's pass and its copies back (on the CPU: compute it). The host's seconds
        go to the caller's counters by part (pack, launch, copies), for benchmarks."""
        clock, t0 = self.timings, time.perf_counter()
        packed = self._pack(windows, length)  # [B', 4 + L] long, host
        t1 = time.perf_counter()
        clock["align_pack_s"] += t1 - t0
        if self.fixed:
            size = (length, self.model.dims.n_audio_ctx)
        else:  # the CPU computes only what its windows cover
            size = (max(len(w.text_tokens) for w in windows) + 1, max(w.num_frames // 2 for w in windows))
        clock["align_batches"] += 1
        clock["align_batch_windows"] += len(windows)
        if self.graphs is not None and length in self._seen:
            new = packed.shape[1] not in self.graphs.captured  # keyed by the packed row's width, as run() does
            probs, path = self.graphs.run(packed, size)
            t2 = time.perf_counter()
            clock["align_capture_s" if new else "align_replay_s"] += t2 - t1
        else:
            self._seen.add(length)
            probs, path = self._forward(packed.to(self.device, non_blocking=True), size)
            t2 = time.perf_counter()
            clock["align_eager_s"] += t2 - t1
        # NOTE: a replay's outputs are its bucket's static buffers, rewritten by the next replay of
        # that bucket: these copies are queued before it, so stream order keeps them intact.
        if not isinstance(path, list):  # the device DTW: ([2, B', steps], [B']) int32
            path = tuple(_to_host(t) for t in path)
        probs = _to_host(probs)  # [B', T] float32
        ready = None
        if self.fixed:
            ready = torch.cuda.Event()
            ready.record()
        clock["align_copies_s"] += time.perf_counter() - t2
        return _Queued(tuple(len(w.text_tokens) for w in windows), probs, path, ready, packed)

    def _pack(self, windows: Sequence[AlignWindow], length: int) -> torch.Tensor:
        """The batch's input table [B', 4 + L] long on the host (pinned on CUDA, the batch's own:
        the copy in is queued, not done): slot, prefix length, text length, frames, then the
        token row `prefix + <|notimestamps|> + text + <|endoftext|>` padded with <|endoftext|>."""
        rows = self.max_batch if self.fixed else len(windows)
        # Written in place: from the pinned-memory cache, not pinned afterwards (an allocation and a copy).
        packed = torch.empty((rows, _FIELDS + length), dtype=torch.int64, pin_memory=self.fixed)
        table = packed.numpy()
        table.fill(self.eot)
        table[:, :_FIELDS] = (0, 0, 1, 1)  # padding rows: slot 0, one token, one frame
        for b, w in enumerate(windows):
            seq = (*w.prefix, self.no_timestamps, *w.text_tokens, self.eot)
            table[b, :_FIELDS] = (w.slot, len(w.prefix), len(w.text_tokens), w.num_frames // 2)
            table[b, _FIELDS : _FIELDS + len(seq)] = seq
        return packed

    def _forward(self, packed: torch.Tensor, size: tuple[int, int]):
        """packed [B, 4 + L] long on the device (slot, prefix length, text length, frames, then the
        token row) -> per window the probability of each text token [B, T] float32 (T = size[0] - 1
        rows from the first text token) and the DTW path through -matrix rows from
        <|notimestamps|>: device tensors (rows and cols [2, B, steps] int32, counts [B] int32) where the
        kernel runs, else host paths. Only queues work where the kernel runs (graph-capturable)."""
        slots, n_prefix, n_text, frames = packed[:, :_FIELDS].unbind(1)
        tokens = packed[:, _FIELDS:]  # [B, L]
        length, (n, f) = tokens.shape[1], size
        hidden, qk = self._decode(tokens, slots)  # [B, L, d], [B, heads, L, n_audio_ctx] float32
        # Every row from <|notimestamps|>: n of them (text + 1), clamped inside the padded row.
        at = (n_prefix[:, None] + torch.arange(n, device=packed.device)[None, :]).clamp(max=length - 1)  # [B, n]
        matrix = batch_matrix(qk, n_prefix + n_text + 2, frames, size=(length, f))  # [B, L, f]
        cost = -matrix.gather(1, at[:, :, None].expand(-1, -1, f)).double()  # [B, n, f]
        probs = self._token_probs(hidden, tokens, at)  # [B, n - 1]
        shapes = torch.stack([n_text + 1, frames], dim=1).to(torch.int32)  # [B, 2]
        if dtw_device.on_device(cost.device):
            return probs, dtw_device.launch(dtw_device.skew(cost, shapes), shapes)
        return probs, dtw_device.paths(cost, [tuple(s) for s in shapes.tolist()])

    def _token_probs(self, hidden: torch.Tensor, tokens: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        """P(token after row at[b, k] | the rows up to it) for k < n - 1: row <|notimestamps|> + k
        predicts text token k. hidden [B, L, d], tokens [B, L], at [B, n] -> [B, n - 1] float32.
        Every window's rows in a few large GEMMs ([rows, eot] logits in the model's dtype, each
        target's probability in float32 straight from them, engine/target_probs.py): per-window
        calls left most SMs idle. At most PROB_ROWS rows at a time bound the logits' memory."""
        weight = self.model.decoder.embed_tokens.weight[: self.eot]  # logits over text tokens only
        rows, length = at[:, :-1], tokens.shape[1]
        target = tokens.gather(1, (rows + 1).clamp(max=length - 1)).clamp(max=self.eot - 1).reshape(-1)  # [R]
        states = hidden.gather(1, rows[:, :, None].expand(-1, -1, hidden.shape[-1])).flatten(0, 1)  # [R, d]
        out = torch.empty(states.shape[0], dtype=torch.float32, device=hidden.device)  # [R]
        for a in range(0, states.shape[0], PROB_ROWS):
            logits = states[a : a + PROB_ROWS] @ weight.T  # [r, eot], the model's dtype
            out[a : a + PROB_ROWS] = target_probs(logits, target[a : a + PROB_ROWS])
        return out.view(rows.shape)

    def _decode(self, tokens: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder over whole sequences: tokens [B, L] over the cross K/V of `slots` [B] -> the
        final hidden states [B, L, d] (after the last layer norm) and the alignment heads' QK^T /
        sqrt(D) [B, n_heads, L, n_audio_ctx] in float32, in `heads` order."""
        dec = self.model.decoder
        length = tokens.shape[1]
        x = dec.embed_tokens(tokens) + dec.embed_positions.weight[:length]
        picked: dict[tuple[int, int], torch.Tensor] = {}
        scores = None  # [B, heads, L, n_audio_ctx] float32, filled layer by layer by the kernel
        if self._head_index:
            scores = torch.empty((tokens.shape[0], len(self.heads), length, self.model.dims.n_audio_ctx),
                                 dtype=torch.float32, device=tokens.device)  # fmt: skip
        for i, layer in enumerate(dec.layers):
            attn = layer.self_attn
            q, k, v = (t.transpose(1, 2) for t in attn.qkv(layer.self_attn_layer_norm(x)))  # [B, H, L, D]
            x = x + attn.out_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2))
            cross = layer.encoder_attn
            q = cross.heads(cross.q_proj(layer.encoder_attn_layer_norm(x))).transpose(1, 2)  # [B, H, L, D]
            if scores is not None:  # in place in the slots, the heads' scores written on the way
                index = self._head_index.get(i)
                out = window_cross_attention(q, self.cache.cross_k[i], self.cache.cross_v[i], slots, self.cache.cross_hnd,
                                             None if index is None else scores, index)  # fmt: skip
                x = x + cross.out_proj(out.flatten(2))
            else:
                k, v = self.cache.cross_rows(i, slots, self.dtype)  # [B, H, n_audio_ctx, D]
                for head in self._by_layer.get(i, ()):
                    picked[(i, head)] = (q[:, head].float() @ k[:, head].float().transpose(-1, -2)) * cross.head_dim**-0.5
                x = x + cross.out_proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))
            x = x + layer.fc2(F.gelu(layer.fc1(layer.final_layer_norm(x))))
        if scores is None:
            scores = torch.stack([picked[h] for h in self.heads], dim=1)
        return dec.layer_norm(x), scores


def _length(window: AlignWindow) -> int:
    """The window's token row: prefix, <|notimestamps|>, text, <|endoftext|>."""
    return len(window.prefix) + len(window.text_tokens) + 2


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """`t` on the host: from CUDA a copy queued into a pinned buffer of its own (valid once an event
    recorded after it has completed); a host tensor as it is (the CPU's results are fresh)."""
    if t.device.type == "cpu":
        return t
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
