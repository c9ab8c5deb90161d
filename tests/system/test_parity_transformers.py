"""Greedy transcripts equal transformers' `generate` token for token on real LibriSpeech speech.

Both sides get the same converted weights in fp32, the same rules (SuppressBlank, SuppressTokens,
timestamp rules) and no temperature fallback. Mismatches are printed with their tokens.
"""

from __future__ import annotations

import io

import jiwer
import pytest
import soundfile as sf
import torch

transformers = pytest.importorskip("transformers")
normalizers = pytest.importorskip("whisper.normalizers")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def utterances(shared_data):
    import pyarrow.parquet as pq

    rows = []
    for name in ("test-other-subset-00000-of-00001.parquet", "test-clean-subset-00000-of-00001.parquet"):
        rows += pq.read_table(shared_data / "librispeech" / name, columns=["id", "audio", "text"]).to_pylist()
    audio = [sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32")[0] for r in rows]
    return [r["id"] for r in rows], audio, [r["text"] for r in rows]


def _ours(folder, ids, audio, without_timestamps: bool) -> dict[str, list[int]]:
    from batchscribe.api import Transcriber

    t = Transcriber(
        str(folder), device="cpu", dtype="float32", batch_size=16,
        temperatures=(0.0,), without_timestamps=without_timestamps,
        compression_ratio_threshold=None, logprob_threshold=None, no_speech_threshold=None,
    )  # fmt: skip
    records = t.transcribe(list(zip(ids, audio)), sample_rate=16000)
    return {r["id"]: [tok for s in r["segments"] for tok in s["tokens"]] for r in records}, t


def _theirs(folder, audio, without_timestamps: bool, batch: int = 16) -> list[list[int]]:
    model = transformers.WhisperForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    fe = transformers.WhisperFeatureExtractor.from_pretrained(folder)
    out = []
    for b in range(0, len(audio), batch):
        feats = fe(audio[b : b + batch], sampling_rate=16000, return_tensors="pt").input_features
        with torch.no_grad():
            seqs = model.generate(feats, return_timestamps=not without_timestamps)
        out += seqs.tolist()
    return out


def _wer(refs: list[str], hyps: list[str]) -> float:
    norm = normalizers.EnglishTextNormalizer()
    return jiwer.wer([norm(r) for r in refs], [norm(h) for h in hyps])


@pytest.mark.parametrize("without_timestamps", [False, True], ids=["timestamps", "no-timestamps"])
@pytest.mark.parametrize("model_fixture", ["tiny_en_dir", "base_dir"])
def test_greedy_tokens_equal_transformers(request, model_fixture, without_timestamps, utterances) -> None:
    folder = request.getfixturevalue(model_fixture)
    ids, audio, refs = utterances
    ours, transcriber = _ours(folder, ids, audio, without_timestamps)
    tok = transcriber.tokenizer
    theirs = _theirs(folder, audio, without_timestamps)
    mismatches = []
    for item_id, seq in zip(ids, theirs):
        # transformers returns the forced prompt and eot/pad too; keep text and timestamps.
        expected = [t for t in seq if t < tok.eot or t >= tok.timestamp_begin]
        if ours[item_id] != expected:
            mismatches.append(item_id)
            print(f"\nMISMATCH {model_fixture} ts={not without_timestamps} {item_id}")
            print("  ours:", tok.decode_with_timestamps(ours[item_id]))
            print("  hf:  ", tok.decode_with_timestamps(expected))
    hyp_ours = [tok.decode(ours[i]) for i in ids]
    hyp_hf = [tok.decode([t for t in s if t < tok.eot]) for s in theirs]
    wer_ours, wer_hf = _wer(refs, hyp_ours), _wer(refs, hyp_hf)
    print(
        f"\n{model_fixture} timestamps={not without_timestamps}: {len(ids) - len(mismatches)}/{len(ids)} "
        f"equal; WER ours {wer_ours:.4f} transformers {wer_hf:.4f}"
    )
    assert len(mismatches) <= 0.02 * len(ids), mismatches
    assert abs(wer_ours - wer_hf) <= 0.002
    assert wer_ours < 0.3  # sanity: real speech transcribed, not noise


def test_language_detection_equals_transformers(base_dir, shared_data) -> None:
    """Detected languages of the multilingual clips equal transformers' detect_language."""
    from batchscribe.api import Transcriber
    from batchscribe.audio.decode import decode_audio

    clips = sorted((shared_data / "multilingual" / "picovoice-leopard").glob("*.wav"))
    clips += sorted((shared_data / "multilingual" / "fleurs").glob("*.wav"))
    audio = [decode_audio(p)[: 16000 * 30] for p in clips]
    t = Transcriber(str(base_dir), device="cpu", dtype="float32", temperatures=(0.0,))
    records = t.transcribe([(p.stem, a) for p, a in zip(clips, audio)], sample_rate=16000)
    fe = transformers.WhisperFeatureExtractor.from_pretrained(base_dir)
    model = transformers.WhisperForConditionalGeneration.from_pretrained(base_dir, dtype=torch.float32).eval()
    feats = fe(audio, sampling_rate=16000, return_tensors="pt").input_features
    with torch.no_grad():
        lang_ids = model.detect_language(feats).flatten().tolist()
    id_to_code = {v: k for k, v in t.tokenizer.language_tokens.items()}
    expected = [t.tokenizer.language_name(id_to_code[i]) for i in lang_ids]
    got = [r["language"] for r in records]
    print("\ndetected:", dict(zip([p.stem for p in clips], got)))
    assert got == expected
    # The clips' true languages: the picovoice files are named by language.
    by_name = dict(zip([p.stem for p in clips], got))
    assert by_name["test_de"] == "german" and by_name["test_ja"] == "japanese"
    assert by_name["fleurs_zh_1883_clip5"] == "chinese"
