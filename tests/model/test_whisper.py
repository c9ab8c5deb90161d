"""Our static-cache Whisper against transformers' WhisperForConditionalGeneration on the same weights."""

from __future__ import annotations

import pytest
import torch

from batchscribe.model.cache import DecoderCache
from batchscribe.model.dims import ModelDims
from batchscribe.model.whisper import Whisper
from tests.marks import needs_cuda

transformers = pytest.importorskip("transformers")


def _hf_model(n_mels: int, vocab: int, seed: int):
    torch.manual_seed(seed)
    cfg = transformers.WhisperConfig(
        vocab_size=vocab,
        num_mel_bins=n_mels,
        d_model=64,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=96,  # not 4 * d_model: the width must come from the config
        decoder_ffn_dim=128,
        max_source_positions=1500,
        max_target_positions=448,
        pad_token_id=vocab - 1,
        bos_token_id=vocab - 2,
        eos_token_id=vocab - 2,
        decoder_start_token_id=vocab - 3,
    )
    model = transformers.WhisperForConditionalGeneration(cfg).eval()
    # Random init leaves biases and layer norms trivial; perturb everything so a wrong mapping shows.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _ours(hf_model) -> Whisper:
    dims = ModelDims.from_hf_config(hf_model.config.to_dict())
    ours = Whisper(dims).eval()
    ours.load_hf_state_dict(hf_model.state_dict())
    return ours


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def _compare(hf_model, ours: Whisper, mel: torch.Tensor, tokens: torch.Tensor, slots: list[int]) -> None:
    """Run both models on the same inputs and demand equal encoder output and per-step logits."""
    with torch.no_grad():
        ref_enc = hf_model.model.encoder(mel).last_hidden_state
        ref_logits = hf_model(input_features=mel, decoder_input_ids=tokens).logits  # [B, T, V]
        enc = ours.encoder(mel)
    assert _rel(enc, ref_enc) < 1e-4

    batch, steps = tokens.shape
    # Put rows in scattered slots of a larger cache, so slot indexing is exercised.
    cache = DecoderCache.allocate(ours.dims, n_slots=max(slots) + 2, device="cpu", dtype=torch.float32)
    slot_ids = torch.tensor(slots)
    ours.write_cross_kv(cache, enc, slot_ids)
    for t in range(steps):
        positions = torch.full((batch,), t)
        logits = ours.decode_step(cache, tokens[:, t], positions, slot_ids)
        assert _rel(logits, ref_logits[:, t]) < 1e-4, f"step {t}"


@pytest.mark.parametrize("fused", [False, True], ids=["as-loaded", "prepared"])
@pytest.mark.parametrize("n_mels,vocab", [(80, 51864), (128, 51866), (80, 51865)])
def test_logits_equal_transformers_random_config(n_mels: int, vocab: int, fused: bool) -> None:
    hf_model = _hf_model(n_mels, vocab, seed=n_mels + vocab)
    ours = _ours(hf_model)
    if fused:  # as the engine runs it: fused q/k/v, logits over a vocabulary padded to 8
        ours.prepare_decoder()
    mel = torch.randn(2, n_mels, 3000)
    tokens = torch.randint(0, vocab, (2, 12))
    _compare(hf_model, ours, mel, tokens, slots=[3, 1])


def test_ragged_positions_match_independent_rows() -> None:
    """Rows at different positions in one step give the logits each row gives alone."""
    hf_model = _hf_model(80, 51864, seed=7)
    ours = _ours(hf_model)
    mel = torch.randn(2, 80, 3000)
    tokens = torch.randint(0, 51864, (2, 9))
    with torch.no_grad():
        ref = hf_model(input_features=mel, decoder_input_ids=tokens).logits
        cache = DecoderCache.allocate(ours.dims, 2, "cpu", torch.float32)
        ours.write_cross_kv(cache, ours.encoder(mel), torch.tensor([0, 1]))
        # Row 0 runs 3 steps ahead; then both advance together at different positions.
        for t in range(3):
            ours.decode_step(cache, tokens[:1, t], torch.tensor([t]), torch.tensor([0]))
        for t in range(6):
            pos = torch.tensor([t + 3, t])
            tok = torch.stack([tokens[0, t + 3], tokens[1, t]])
            logits = ours.decode_step(cache, tok, pos, None, kv_len=t + 4)
            assert _rel(logits[0], ref[0, t + 3]) < 1e-4
            assert _rel(logits[1], ref[1, t]) < 1e-4


def test_logits_equal_transformers_real_tiny_en(tiny_en_dir) -> None:
    from batchscribe.weights import load_state_dict

    hf_model = transformers.WhisperForConditionalGeneration.from_pretrained(
        tiny_en_dir, torch_dtype=torch.float32
    ).eval()
    dims = ModelDims.from_hf_config(hf_model.config.to_dict())
    ours = Whisper(dims).eval()
    ours.load_hf_state_dict({k: v.float() for k, v in load_state_dict(tiny_en_dir).items()})
    torch.manual_seed(0)
    mel = torch.randn(2, 80, 3000) * 0.5
    tokens = torch.tensor([[50257, 50363, 383, 2068, 7586], [50257, 50362, 314, 716, 257]])
    _compare(hf_model, ours, mel, tokens, slots=[0, 1])


def test_half_precision_runs_close_to_float32() -> None:
    hf_model = _hf_model(80, 51864, seed=3)
    mel = torch.randn(1, 80, 3000)
    tokens = torch.randint(0, 51864, (1, 4))
    with torch.no_grad():
        ref = hf_model(input_features=mel, decoder_input_ids=tokens).logits[:, -1]
    half = _ours(hf_model).to(torch.bfloat16)
    cache = DecoderCache.allocate(half.dims, 1, "cpu", torch.bfloat16)
    with torch.no_grad():
        half.write_cross_kv(cache, half.encoder(mel.bfloat16()), torch.tensor([0]))
        for t in range(4):
            logits = half.decode_step(cache, tokens[:, t], torch.tensor([t]))
    assert logits.dtype == torch.float32
    assert _rel(logits, ref) < 3e-2


def test_building_on_the_meta_device_imports_no_compiler() -> None:
    """The engine builds the model on the meta device to take the checkpoint's tensors; nn.Embedding's
    own init of a meta weight would import torch._dynamo (seconds of every run's start-up). In a
    fresh process, since another test may have imported it here."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from batchscribe.model.dims import ModelDims\n"
        "from batchscribe.model.whisper import Whisper\n"
        "dims = ModelDims(n_mels=80, n_audio_ctx=1500, n_audio_state=64, n_audio_head=4, n_audio_layer=1,\n"
        "                 n_vocab=51864, n_text_ctx=448, n_text_state=64, n_text_head=4, n_text_layer=1)\n"
        "with torch.device('meta'):\n"
        "    model = Whisper(dims)\n"
        "assert model.decoder.embed_tokens.weight.device.type == 'meta'\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_embeddings_off_the_meta_device_are_initialised_as_torch_does() -> None:
    dims = ModelDims(n_mels=80, n_audio_ctx=1500, n_audio_state=64, n_audio_head=4, n_audio_layer=1,
                     n_vocab=51864, n_text_ctx=448, n_text_state=64, n_text_head=4, n_text_layer=1)
    torch.manual_seed(0)
    weight = Whisper(dims).decoder.embed_tokens.weight.detach()
    # nn.Embedding's init is N(0, 1): a 3.3M-sample mean and std that far off would not happen.
    assert abs(float(weight.mean())) < 0.01 and abs(float(weight.std()) - 1) < 0.01


def test_fused_qkv_holds_no_weight_twice_and_leaves_the_state_dict_as_loaded() -> None:
    hf_model = _hf_model(80, 51864, seed=11)
    ours = _ours(hf_model)
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    ours.fuse_decoder_qkv()
    ours.fuse_decoder_qkv()  # idempotent
    after = ours.state_dict()
    assert after.keys() == before.keys()  # the fused weight is derived, not a checkpoint key
    assert all(torch.equal(after[k], before[k]) for k in before)
    for layer in ours.decoder.layers:
        attn, d = layer.self_attn, ours.dims.n_text_state
        assert attn.qkv_weight.shape == (3 * d, d) and attn.qkv_bias.shape == (3 * d,)
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj):  # views into the fused weight
            assert proj.weight.untyped_storage().data_ptr() == attn.qkv_weight.untyped_storage().data_ptr()
        assert torch.equal(attn.qkv_bias[d : 2 * d], torch.zeros(d))  # k_proj has no bias
    # Cast afterwards (as Whisper.to would be), the fused weight follows.
    half = ours.to(torch.bfloat16)
    assert half.decoder.layers[0].self_attn.qkv_weight.dtype == torch.bfloat16


@pytest.mark.parametrize("vocab", [51865, 51866])
def test_padded_logits_hold_no_weight_twice_and_leave_the_state_dict_as_loaded(vocab: int) -> None:
    hf_model = _hf_model(80, vocab, seed=vocab)
    ours = _ours(hf_model)
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    ours.prepare_decoder()
    ours.prepare_decoder()  # idempotent: one padded weight, the same one
    after = ours.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    dec = ours.decoder
    padded, embed = dec.logits_weight, dec.embed_tokens.weight
    assert padded.shape == (vocab + (-vocab % 8), 64) and padded.shape[0] % 8 == 0
    assert embed.shape == (vocab, 64) and embed.data_ptr() == padded.data_ptr()  # a view: held once
    assert torch.equal(padded[vocab:], torch.zeros_like(padded[vocab:]))
    h = torch.randn(3, 64)
    logits = dec.logits(h)
    assert logits.shape == (3, vocab)
    torch.testing.assert_close(logits, h @ before["decoder.embed_tokens.weight"].T)
    # A vocabulary of whole 8s (the English models') is left as it is.
    english = _ours(_hf_model(80, 51864, seed=1))
    english.prepare_decoder()
    assert english.decoder.logits_weight is None


def test_fused_qkv_steps_equal_separate_projections_within_rounding() -> None:
    """The fused projection is the same arithmetic, one GEMM wide: logits agree to float32 rounding
    over several steps at ragged positions (the K/V each step writes feed the later ones)."""
    hf_model = _hf_model(80, 51864, seed=5)
    separate, fused = _ours(hf_model), _ours(hf_model)
    fused.fuse_decoder_qkv()
    mel = torch.randn(3, 80, 3000)
    tokens = torch.randint(0, 51864, (3, 6))
    with torch.no_grad():
        enc = separate.encoder(mel)
        caches = [DecoderCache.allocate(m.dims, 3, "cpu", torch.float32) for m in (separate, fused)]
        for m, cache in zip((separate, fused), caches):
            m.write_cross_kv(cache, enc, torch.tensor([0, 1, 2]))
        for t in range(6):
            pos = torch.tensor([t, t, max(t - 1, 0)])
            a, b = (m.decode_step(c, tokens[:, t], pos) for m, c in zip((separate, fused), caches))
            assert _rel(b, a) < 1e-5, f"step {t}"
        assert torch.allclose(caches[0].self_k[0], caches[1].self_k[0], atol=1e-5)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_steps_with_fused_add_norm_equal_the_eager_adds_and_norms(monkeypatch, dtype) -> None:
    """On CUDA a step's residual adds and layer norms run as encoder_triton.add_norm (one pass
    each): its logits and the K/V it writes equal eager torch's adds and norms on the same GPU, to
    the half-precision rounding of a few places (the norms' sums in another order)."""
    from batchscribe.model import encoder_ops

    hf_model = _hf_model(80, 51864, seed=13)
    model = _ours(hf_model).to(device="cuda", dtype=dtype)
    model.prepare_decoder()
    mel = torch.randn(4, 80, 3000, device="cuda", dtype=dtype)
    tokens = torch.randint(0, 51864, (4, 5), device="cuda")
    results = []
    for fused in (True, False):
        monkeypatch.setattr(encoder_ops, "use_triton", lambda x, fused=fused: fused and x.is_cuda)
        cache = DecoderCache.allocate(model.dims, 4, "cuda", dtype)
        with torch.no_grad():
            model.write_cross_kv(cache, model.encoder(mel), torch.arange(4, device="cuda"))
            logits = [model.decode_step(cache, tokens[:, t], torch.full((4,), t, device="cuda")) for t in range(5)]
        results.append((torch.stack(logits), cache.self_k[-1].float()))
    (fused_logits, fused_k), (eager_logits, eager_k) = results
    assert _rel(fused_logits, eager_logits) < 2e-2
    assert _rel(fused_k, eager_k) < 2e-2
    assert (fused_logits.argmax(-1) == eager_logits.argmax(-1)).float().mean() >= 0.9
