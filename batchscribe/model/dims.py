"""Model dimensions, read from a Hugging Face WhisperConfig (config.json)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelDims:
    n_mels: int
    n_vocab: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int
    n_audio_mlp: int = 0  # feed-forward width; 0 means 4 * n_audio_state
    n_text_mlp: int = 0  # 0 means 4 * n_text_state

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> "ModelDims":
        return cls(
            n_mels=cfg["num_mel_bins"],
            n_vocab=cfg["vocab_size"],
            n_audio_ctx=cfg["max_source_positions"],
            n_audio_state=cfg["d_model"],
            n_audio_head=cfg["encoder_attention_heads"],
            n_audio_layer=cfg["encoder_layers"],
            n_text_ctx=cfg["max_target_positions"],
            n_text_state=cfg["d_model"],
            n_text_head=cfg["decoder_attention_heads"],
            n_text_layer=cfg["decoder_layers"],
            n_audio_mlp=cfg.get("encoder_ffn_dim", 4 * cfg["d_model"]),
            n_text_mlp=cfg.get("decoder_ffn_dim", 4 * cfg["d_model"]),
        )

    def __post_init__(self) -> None:
        if not self.n_audio_mlp:
            object.__setattr__(self, "n_audio_mlp", 4 * self.n_audio_state)
        if not self.n_text_mlp:
            object.__setattr__(self, "n_text_mlp", 4 * self.n_text_state)

    @property
    def is_multilingual(self) -> bool:
        return self.n_vocab >= 51865
