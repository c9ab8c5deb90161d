"""EngineOptions resolved against the device (engine/setup.py): how the encoder runs, and what of
it enters a run folder's identity."""

from __future__ import annotations

import pytest
import torch

from batchscribe.config import ConfigError, EngineOptions
from batchscribe.engine.setup import _encoder_mode, resolve_engine
from batchscribe.model.dims import ModelDims

from tests.marks import needs_cuda

TINY = ModelDims.from_hf_config(dict(
    vocab_size=51864, num_mel_bins=80, d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
    decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536, max_source_positions=1500,
    max_target_positions=448))  # fmt: skip


def test_cpu_runs_the_eager_encoder_or_emulates_fp8() -> None:
    auto = resolve_engine(EngineOptions(device="cpu"), TINY)
    fp8 = resolve_engine(EngineOptions(device="cpu", encoder_precision="fp8"), TINY)
    assert (auto.encoder, fp8.encoder) == ("eager", "fp8")
    # fp8 changes transcripts, so it is part of the identity; the default adds no key, so folders
    # written before the option existed still resume.
    assert "encoder_precision" not in auto.identity()
    assert fp8.identity() == {**auto.identity(), "encoder_precision": "fp8", "encoder_dense_layers": "0"}
    assert fp8.describe()["encoder"] == "fp8" and auto.describe()["encoder"] == "eager"


def test_encoder_modes_on_cuda_are_chosen_by_dtype() -> None:
    pytest.importorskip("triton")
    cuda = torch.device("cuda")
    assert _encoder_mode("auto", cuda, torch.float16) == "fused"
    assert _encoder_mode("auto", cuda, torch.bfloat16) == "fused"
    assert _encoder_mode("auto", cuda, torch.float32) == "eager"  # the fused kernels are half precision
    with pytest.raises(ConfigError, match="--dtype float16 or bfloat16"):
        _encoder_mode("fp8", cuda, torch.float32)


def test_unknown_encoder_precision_is_refused() -> None:
    with pytest.raises(ConfigError, match="encoder_precision='int8'; use auto or fp8"):
        EngineOptions(encoder_precision="int8")  # type: ignore[arg-type]


def test_an_eager_encoder_refuses_the_fa3_encoder_kernel() -> None:
    # FA3 is the fused encoder's kernel: a run whose encoder is eager (here the CPU's) is refused
    # with the fix when the name asks for it. ("auto" then keeps SDPA: tests/attention/test_registry.py.)
    auto = resolve_engine(EngineOptions(device="cpu"), TINY)
    assert (auto.encoder, auto.attention.encoder_kernel) == ("eager", "sdpa")
    with pytest.raises(ConfigError, match="the fa3 encoder kernel runs in the fused encoder"):
        resolve_engine(EngineOptions(device="cpu", attention="sdpa/sdpa/fa3"), TINY)


def test_batch_invariant_enters_the_identity_and_fixes_sdpas_length() -> None:
    """Its records differ from the other path's in the last digits, so it is part of the identity
    (recorded either way; output/identity.py lets folders that lack the key resume); SDPA then
    always attends over the whole context. On the CPU it is off unless asked for."""
    auto = resolve_engine(EngineOptions(device="cpu"), TINY)
    invariant = resolve_engine(EngineOptions(device="cpu", batch_invariant=True), TINY)
    assert auto.identity()["batch_invariant"] is False and not auto.batch_invariant
    assert auto == resolve_engine(EngineOptions(device="cpu", batch_invariant=False), TINY)
    assert invariant.identity() == {**auto.identity(), "batch_invariant": True}
    assert (auto.kv_buckets, invariant.kv_buckets) == ((), (TINY.n_text_ctx,))


@pytest.mark.gpu
@needs_cuda
def test_batch_invariant_is_cudas_default() -> None:
    assert resolve_engine(EngineOptions(device="cuda"), TINY).batch_invariant
    assert resolve_engine(EngineOptions(device="cuda"), TINY).identity()["batch_invariant"] is True
    assert not resolve_engine(EngineOptions(device="cuda", batch_invariant=False), TINY).batch_invariant


def test_batch_invariant_must_be_a_bool_or_none() -> None:
    with pytest.raises(ConfigError, match="batch_invariant='yes'; use True, False or None"):
        EngineOptions(batch_invariant="yes")  # type: ignore[arg-type]


def test_the_audio_budget_resolves_to_the_options_or_a_quarter_of_memory() -> None:
    from batchscribe.engine.sizing import host_audio_bytes

    assert resolve_engine(EngineOptions(device="cpu"), TINY).audio_memory == host_audio_bytes()
    given = resolve_engine(EngineOptions(device="cpu", audio_memory=3 << 30), TINY)
    assert given.audio_memory == 3 << 30
    assert "audio_memory" not in given.identity()  # it changes which items run together, not a record
