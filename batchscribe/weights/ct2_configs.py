"""The JSON files of a converted folder: config, generation config, tokenizer and preprocessor.

Everything transformers needs to load the folder, derived from the CT2 model, its tokenizer.json
and its config.json; token ids are read from the tokenizer, never hard-coded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from batchscribe.constants import CHUNK_LENGTH, HOP_LENGTH, N_FFT, N_FRAMES, N_SAMPLES, SAMPLE_RATE
from batchscribe.weights.ct2_format import Ct2FormatError, Ct2Model

N_TIMESTAMPS = 1501  # <|0.00|> .. <|30.00|> in 0.02 s steps


@dataclass(frozen=True)
class TokenIds:
    """Ids read from the CT2 tokenizer.json."""

    by_content: dict[str, int]
    special: list[tuple[int, str]]  # (id, content) in id order

    def id(self, content: str) -> int:
        if content not in self.by_content:
            raise Ct2FormatError(f"tokenizer.json has no {content} token")
        return self.by_content[content]


def add_timestamp_tokens(tok: dict[str, Any], vocab_size: int) -> tuple[dict[str, Any], TokenIds]:
    """tokenizer.json with the 1501 timestamp tokens after <|notimestamps|> (CT2 packages lack them)."""
    added = tok["added_tokens"]
    by_content = {t["content"]: t["id"] for t in added}
    if "<|0.00|>" not in by_content:
        first = by_content["<|notimestamps|>"] + 1
        taken = {t["id"] for t in added} | set(tok["model"]["vocab"].values())
        if any(first + i in taken for i in range(N_TIMESTAMPS)):
            raise Ct2FormatError(f"tokenizer.json: ids {first}..{first + 1500} are not free for timestamps")
        for i in range(N_TIMESTAMPS):
            added.append(
                {"id": first + i, "content": f"<|{i * 0.02:.2f}|>", "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": False, "special": False}
            )
            by_content[added[-1]["content"]] = first + i
    n_tokens = 1 + max(max(by_content.values()), max(tok["model"]["vocab"].values()))
    if n_tokens != vocab_size:
        raise Ct2FormatError(f"tokenizer has {n_tokens} tokens but the embedding has {vocab_size} rows")
    special = sorted((t["id"], t["content"]) for t in added if t["special"])
    return tok, TokenIds(by_content, special)


def hf_config(model: Ct2Model, sd: Mapping[str, torch.Tensor], tokens: TokenIds, ct2_cfg: dict) -> dict:
    vocab_size, d_model = sd["model.decoder.embed_tokens.weight"].shape
    n_enc = model.layer_count("encoder")
    n_dec = model.layer_count("decoder")
    eot = tokens.id("<|endoftext|>")
    return {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "vocab_size": vocab_size,
        "num_mel_bins": sd["model.encoder.conv1.weight"].shape[1],
        "d_model": d_model,
        "encoder_layers": n_enc,
        "decoder_layers": n_dec,
        "num_hidden_layers": n_enc,
        # Whisper's head size is 64 in every released model; the spec's scalars win when present.
        "encoder_attention_heads": model.scalar("encoder/num_heads", d_model // 64),
        "decoder_attention_heads": model.scalar("decoder/num_heads", d_model // 64),
        "encoder_ffn_dim": sd["model.encoder.layers.0.fc1.weight"].shape[0],
        "decoder_ffn_dim": sd["model.decoder.layers.0.fc1.weight"].shape[0],
        "max_source_positions": sd["model.encoder.embed_positions.weight"].shape[0],
        "max_target_positions": sd["model.decoder.embed_positions.weight"].shape[0],
        "activation_function": "gelu",
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
        "use_cache": True,
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "init_std": 0.02,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "decoder_start_token_id": tokens.id("<|startoftranscript|>"),
        "begin_suppress_tokens": list(ct2_cfg.get("suppress_ids_begin", [])),
        "suppress_tokens": list(ct2_cfg.get("suppress_ids", [])),
        "max_length": sd["model.decoder.embed_positions.weight"].shape[0],
        "dtype": str(sd["model.decoder.embed_tokens.weight"].dtype).removeprefix("torch."),
    }


def generation_config(config: dict, tokens: TokenIds, ct2_cfg: dict) -> dict:
    sot = tokens.id("<|startoftranscript|>")
    multilingual = config["vocab_size"] >= 51865
    gen: dict[str, Any] = {
        "alignment_heads": [list(h) for h in ct2_cfg.get("alignment_heads", [])],
        "begin_suppress_tokens": config["begin_suppress_tokens"],
        "suppress_tokens": config["suppress_tokens"],
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "pad_token_id": config["pad_token_id"],
        "decoder_start_token_id": sot,
        "is_multilingual": multilingual,
        "max_initial_timestamp_index": 50,  # 1.0 s, openai's max_initial_timestamp
        "max_length": config["max_target_positions"],
        "no_timestamps_token_id": tokens.id("<|notimestamps|>"),
        "prev_sot_token_id": tokens.id("<|startofprev|>"),
        "return_timestamps": False,
    }
    if multilingual:
        translate = tokens.id("<|translate|>")
        # Language tokens sit between <|startoftranscript|> and <|translate|> in every vocabulary.
        langs = {content: i for i, content in tokens.special if sot < i < translate}
        if "lang_ids" in ct2_cfg and sorted(langs.values()) != sorted(ct2_cfg["lang_ids"]):
            raise Ct2FormatError("config.json lang_ids disagree with the tokenizer's language tokens")
        gen["lang_to_id"] = langs
        gen["task_to_id"] = {"transcribe": tokens.id("<|transcribe|>"), "translate": translate}
        # Without a task transformers detects the language but then forces no task token; the hub's
        # configs get "transcribe" from the deprecated forced_decoder_ids, we name the task instead.
        gen["task"] = "transcribe"
    return gen


def tokenizer_files(tokens: TokenIds, n_mels: int) -> dict[str, dict]:
    """tokenizer_config.json, special_tokens_map.json and preprocessor_config.json."""
    eot = "<|endoftext|>"
    named = {"bos_token": eot, "eos_token": eot, "pad_token": eot, "unk_token": eot}
    # transformers finds the first timestamp as all_special_ids[-1] + 1: the list must be the
    # special tokens in id order, ending at <|notimestamps|>.
    extra = [content for _, content in tokens.special]
    tokenizer_config = {
        "tokenizer_class": "WhisperTokenizer",
        "processor_class": "WhisperProcessor",
        **named,
        "additional_special_tokens": extra,
        "add_prefix_space": False,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,  # BPE: cleanup would strip real spaces
        "model_max_length": 1024,
    }
    preprocessor = {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "processor_class": "WhisperProcessor",
        "feature_size": n_mels,
        "sampling_rate": SAMPLE_RATE,
        "n_fft": N_FFT,
        "hop_length": HOP_LENGTH,
        "chunk_length": CHUNK_LENGTH,
        "n_samples": N_SAMPLES,
        "nb_max_frames": N_FRAMES,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": False,
    }
    return {
        "tokenizer_config.json": tokenizer_config,
        "special_tokens_map.json": {**named, "additional_special_tokens": extra},
        "preprocessor_config.json": preprocessor,
    }
