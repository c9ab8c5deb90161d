"""The encoder alone: ms per 30 s window for the eager module, the fused encoder and its fp8 form,
at the engine's chunk sizes; with where a layer's time goes and attention kernels side by side.

    python benchmarks/encoder_speed.py [--arch turbo] [--groups 16 32 64]

Random bf16 weights of the architecture (the cost per window is the real one). Prints a table and
appends rows to benchmarks/RESULTS.md (peer: the eager module, in the same run).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import common
from batchscribe.model.dims import ModelDims
from batchscribe.model.fused_encoder import FusedEncoder
from batchscribe.model.whisper import Whisper
from w2_large_v3 import ARCHS


def time_ms(fn, repeat: int = 10) -> float:
    """Device time per call, from CUDA events around `repeat` calls after one warm-up."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeat


def encoder_flops(dims: ModelDims, n_mlp: int) -> float:
    """Per window: the layers' GEMMs (q, k, v, out, fc1, fc2) and attention (QK^T and PV)."""
    t, d = dims.n_audio_ctx, dims.n_audio_state
    gemm = 2 * t * d * (4 * d + 2 * n_mlp)
    attention = 2 * 2 * t * t * d
    return dims.n_audio_layer * (gemm + attention)


def graphed(fn, mel: torch.Tensor):
    """fn(mel) captured once; returns the replay (as the engine's encoder graphs run it)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(mel)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(mel)
    return graph.replay


def attention_kernels(dims: ModelDims, group: int) -> dict[str, float]:
    """One layer's attention over [group, heads, 1500, 64] with each SDPA backend (ms)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    h, t, hd = dims.n_audio_head, dims.n_audio_ctx, dims.n_audio_state // dims.n_audio_head
    q, k, v = (torch.randn(group, t, h, hd, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    out = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):  # fmt: skip
        try:
            with sdpa_kernel(backend):
                out[name] = time_ms(lambda: F.scaled_dot_product_attention(q, k, v))
        except RuntimeError as exc:
            out[name] = float("nan")
            print(f"sdpa {name}: {str(exc)[:120]}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=sorted(ARCHS), default="turbo")
    ap.add_argument("--groups", type=int, nargs="*", default=[16, 32, 64])
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    config = ARCHS[args.arch]
    dims = ModelDims.from_hf_config(config)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Whisper(dims).to(dtype=torch.bfloat16).eval()
    for p in model.parameters():
        if p.dim() >= 2:
            torch.nn.init.normal_(p, std=0.02)
    encoders = {"eager": model.encoder, "fused": FusedEncoder(model.encoder),
                "fp8": FusedEncoder(model.encoder, fp8=True)}
    flops = encoder_flops(dims, config["encoder_ffn_dim"])
    rows = {}
    with torch.no_grad():
        for group in args.groups:
            mel = torch.randn(group, dims.n_mels, 3000, device="cuda", dtype=torch.bfloat16)
            ref = model.encoder(mel).float()
            for name, enc in encoders.items():
                ms = time_ms(graphed(enc, mel)) / group
                err = float((enc(mel).float() - ref).norm() / ref.norm())
                rows[group, name] = ms
                print(f"group {group:>3} {name:<6} {ms:6.3f} ms/window  {flops / ms / 1e9:6.0f} TFLOP/s  "
                      f"relative error vs eager {err:.4f}", flush=True)
            print(f"group {group}: attention per layer (ms):", attention_kernels(dims, group), flush=True)
    print(f"\nencoder {args.arch}, {common.hardware()}, commit {common.commit()}")
    if not args.no_append:
        for group in args.groups:
            for name in ("fused", "fp8"):
                common.append_result({
                    "workload": f"encoder {args.arch} bf16 random, {group} windows per graph, {name}",
                    "ours": f"{rows[group, name]:.3f} ms/window", "peer": f"eager module: {rows[group, 'eager']:.3f} ms/window",
                    "ratio": f"{rows[group, 'eager'] / rows[group, name]:.2f}x", "notes": "benchmarks/encoder_speed.py",
                })  # fmt: skip


if __name__ == "__main__":
    main()
