"""What the attention tests share: a one-layer decoder's dimensions (small caches), and a CUDA graph
captured as the engine captures its steps."""

from __future__ import annotations

from collections.abc import Callable

import torch

from batchscribe.model.dims import ModelDims


def tiny_dims() -> ModelDims:
    return ModelDims.from_hf_config(dict(vocab_size=100, num_mel_bins=80, d_model=32, encoder_layers=1,
                                         decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                                         encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=1500,
                                         max_target_positions=16))  # fmt: skip


def capture(step: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """`step` run once on a side stream (as torch asks before a capture), then captured; the caller
    replays the graph after changing its inputs in place."""
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        step()
    return graph
