"""EngineOptions (what the user asked for) resolved once, against the device and the model, into
EngineConfig (what the engine runs with). The summary and the resume identity read it from here."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from batchscribe.attention.registry import AttentionPlan, resolve_attention
from batchscribe.config import ConfigError, EngineOptions
from batchscribe.engine import triton_select
from batchscribe.engine.cpu_numerics import request_reproducible_mkl
from batchscribe.engine.sizing import CPU_SLOTS, CUDA_SLOT_CAP, default_kv_buckets, host_audio_bytes, slots_for_memory
from batchscribe.model import encoder_triton
from batchscribe.model.cache import DecoderCache
from batchscribe.model.dims import ModelDims
from batchscribe.model.fp8 import fp8_gemm_supported
from batchscribe.model.fused_encoder import FP8_DENSE_LAYERS

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    """"auto" is CUDA when there is a GPU, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} but CUDA is not available here; use --device cpu or auto")
    try:
        return torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"device={name!r} is not a device ({exc}); use auto, cpu, cuda or cuda:N") from None


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine's construction depends on, resolved."""

    device: torch.device
    dtype: torch.dtype
    attention: AttentionPlan
    n_slots: int | None  # decoder slots; None until sized (with_slots)
    cuda_graphs: bool  # capture the decode looks and the admission encoder (CUDA only)
    kv_buckets: tuple[int, ...]  # self-attention lengths a step may use; (): each step's exact bound
    fused_greedy: bool  # greedy steps' rules and choice in one Triton kernel (CUDA with triton)
    # How the encoder runs: "eager" (AudioEncoder.forward), "fused" (model/fused_encoder.py: fewer
    # passes, CUDA with Triton) or "fp8" (fused, with e4m3 GEMMs).
    encoder: str = "eager"
    skip_inert_rows: bool = True  # kernels that can skip rows not running do
    batch_invariant: bool = False  # EngineOptions.batch_invariant resolved: fixed shapes for every window and step
    audio_memory: int = field(default_factory=host_audio_bytes)  # EngineOptions.audio_memory resolved (bytes)

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    def with_slots(self, dims: ModelDims) -> EngineConfig:
        """n_slots from the options, else 16 on the CPU, else as many as fit in free GPU memory
        (measured now: after the model's weights are on the device), up to CUDA_SLOT_CAP."""
        if self.n_slots is not None:
            return self
        if not self.on_cuda:
            return replace(self, n_slots=CPU_SLOTS)
        free, _ = torch.cuda.mem_get_info(self.device)
        per_slot = DecoderCache.bytes_per_slot(dims, self.dtype, self.attention.cross_dtype)
        fit = slots_for_memory(free, per_slot, cap=CUDA_SLOT_CAP)
        log.info("decoder slots: %d (%.1f MB of cache per slot, %.1f GB free)", fit, per_slot / 1e6, free / 1e9)
        return replace(self, n_slots=fit)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def identity(self) -> dict[str, Any]:
        """What changes a record's tokens: the numeric precision and the kernels."""
        identity = {"dtype": self.dtype_name, "attention": self.attention.describe(self.dtype)}
        if self.encoder == "fp8":  # only then: folders written before the key existed still resume
            identity["encoder_precision"] = "fp8"
            # which layers keep the model's dtype (a folder of the all-fp8 encoder is refused)
            identity["encoder_dense_layers"] = ",".join(map(str, FP8_DENSE_LAYERS))
        # Recorded either way since it became the default on CUDA: a folder written before, which
        # lacks the key, resumes (output/identity.py's ADDED_KEYS).
        identity["batch_invariant"] = self.batch_invariant
        return identity

    def describe(self) -> dict[str, Any]:
        """For summaries: the identity, plus where and how it ran."""
        return {**self.identity(), "device": str(self.device), "batch_size": self.n_slots,
                "cuda_graphs": self.cuda_graphs, "encoder": self.encoder,
                "audio_memory_gb": round(self.audio_memory / 1e9, 3)}  # fmt: skip


def resolve_engine(options: EngineOptions, dims: ModelDims) -> EngineConfig:
    """Resolve once: the device, the dtype (float16 on CUDA, float32 on the CPU by default), the
    attention kernels, whether to capture graphs, the self-attention length buckets, batch
    invariance (by default on CUDA only), the budget of decoded audio in flight. Raises
    ConfigError naming the fix; touches no weights, so it runs before the model loads."""
    device, dtype, encoder = resolve_compute(options)
    cuda = device.type == "cuda"
    plan = resolve_attention(options.attention, options.cross_kv, device, dtype, fused_encoder=encoder != "eager")
    kv_buckets: tuple[int, ...] = ()
    if cuda:  # graphs need fixed lengths; ragged kernels read each row's own: one bucket
        kv_buckets = (dims.n_text_ctx,) if plan.ragged_self else tuple(default_kv_buckets(dims.n_text_ctx))
    invariant = cuda if options.batch_invariant is None else options.batch_invariant
    if invariant and not cuda:
        request_reproducible_mkl()  # before the weights load: MKL reads it at its first call
    if invariant and plan.self_kernel == "sdpa":
        # SDPA's sums change with the attended (masked) length; the Triton kernel's do not (measured)
        kv_buckets = (dims.n_text_ctx,)
    return EngineConfig(device=device, dtype=dtype, attention=plan, n_slots=options.batch_size,
                        cuda_graphs=cuda and options.cuda_graphs, kv_buckets=kv_buckets,
                        fused_greedy=cuda and triton_select.triton_available(), encoder=encoder,
                        batch_invariant=invariant, audio_memory=options.audio_memory or host_audio_bytes())  # fmt: skip


def resolve_compute(options: EngineOptions) -> tuple[torch.device, torch.dtype, str]:
    """What resolve_engine resolves first, with its errors: the device, the dtype and the encoder
    mode ("eager", "fused" or "fp8"). Enough for Prewarm to start before the attention kernels
    resolve (FlashInfer's import) and the tokenizer loads."""
    device = resolve_device(options.device)
    dtype = DTYPES[options.dtype or ("float16" if device.type == "cuda" else "float32")]
    return device, dtype, _encoder_mode(options.encoder_precision, device, dtype)


def _encoder_mode(precision: str, device: torch.device, dtype: torch.dtype) -> str:
    """fp8 where asked (refused on a GPU without fp8 GEMMs); else fused on CUDA with Triton in
    half precision, else eager."""
    if precision == "fp8":
        if device.type == "cuda" and dtype == torch.float32:  # _scaled_mm writes half precision
            raise ConfigError("--encoder-precision fp8 runs with --dtype float16 or bfloat16 on CUDA; "
                              "drop --dtype float32 (or use --encoder-precision auto)")
        if device.type == "cuda" and not fp8_gemm_supported(device):
            name = torch.cuda.get_device_name(device)
            raise ConfigError(f"--encoder-precision fp8 needs fp8 GEMMs (compute capability 8.9 or later); "
                              f"{name} has {torch.cuda.get_device_capability(device)}; use auto")  # fmt: skip
        return "fp8"
    if device.type == "cuda" and encoder_triton.triton_available() and dtype in (torch.float16, torch.bfloat16):
        return "fused"
    return "eager"
