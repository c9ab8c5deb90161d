"""A one-layer decoder's dimensions, for building small caches in the attention tests."""

from __future__ import annotations

from batchscribe.model.dims import ModelDims


def tiny_dims() -> ModelDims:
    return ModelDims.from_hf_config(dict(vocab_size=100, num_mel_bins=80, d_model=32, encoder_layers=1,
                                         decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                                         encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=1500,
                                         max_target_positions=16))  # fmt: skip
