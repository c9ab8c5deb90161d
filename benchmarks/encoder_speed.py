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
from batchscribe.attention.flashinfer_prefill import FlashInferEncoderAttention
from batchscribe.attention.registry import fa3_runs
from batchscribe.model.dims import ModelDims
from batchscribe.model.fp8 import quantize_rows
from batchscribe.model.fused_encoder import FusedEncoder
from batchscribe.model.whisper import Whisper
from w2_large_v3 import ARCHS


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
                out[name] = common.time_ms(lambda: F.scaled_dot_product_attention(q, k, v))
        except RuntimeError as exc:
            out[name] = float("nan")
            print(f"sdpa {name}: {str(exc)[:120]}")
    return out


def layer_breakdown(encoder: FusedEncoder, x: torch.Tensor, group: int) -> dict[str, float]:
    """One fused layer's parts, each timed alone (ms per layer over `group` windows)."""
    from batchscribe.model import encoder_ops as ops
    from batchscribe.model import encoder_triton

    layer, m = encoder.layers[0], x.shape[0]
    d, n_mlp = x.shape[1], layer.fp8["fc1"].out_features if layer.fp8 else layer.w_t["fc1"].shape[1]
    h = torch.randn(m, n_mlp, device="cuda", dtype=x.dtype)
    qkv = torch.randn(m, 3 * d, device="cuda", dtype=x.dtype)
    parts = {"attention": lambda: layer.attend(qkv, group)}
    if layer.fp8 is None:
        parts |= {
            "add_norm": lambda: ops.add_norm(x, None, layer.b["out"], layer.ln2, False),
            "qkv": lambda: torch.addmm(layer.b["qkv"], x, layer.w_t["qkv"]),
            "out_proj (addmm_)": lambda: x.addmm_(x, layer.w_t["out"]),
            "fc1+gelu": lambda: torch._addmm_activation(layer.b["fc1"], x, layer.w_t["fc1"], use_gelu=True),
            "fc2 (addmm_)": lambda: x.addmm_(h, layer.w_t["fc2"]),
        }
    else:
        xq, xs = quantize_rows(x)
        hq, hs = quantize_rows(h)
        parts |= {
            "add_norm fp8": lambda: ops.add_norm(x, x, None, layer.ln2, True),
            "quant_rows": lambda: ops.quant_rows(x),
            **{f"gelu_quant {launch}": (lambda launch=launch: encoder_triton.gelu_quant(h, launch))
               for launch in ((0, 8, False), (0, 16, False), (0, 4, True), (0, 8, True), (0, 16, True),
                              (1024, 4, True), (1024, 8, True))},
            "qkv fp8": lambda: layer.fp8["qkv"](xq, xs),
            "out_proj fp8": lambda: layer.fp8["out"](xq, xs),
            "fc1 fp8": lambda: layer.fp8["fc1"](xq, xs),
            "fc2 fp8": lambda: layer.fp8["fc2"](hq, hs),
        }
    with torch.no_grad():
        return {name: round(common.time_ms(fn), 3) for name, fn in parts.items()}


FLASHINFER_CASES = ("fa3", "fa3-e4m3", "fa2", "fmha_v2", "flashinfer-cudnn")


def flashinfer_attention(dims: ModelDims, group: int, names: tuple[str, ...] = FLASHINFER_CASES) -> dict[str, float]:
    """FlashInfer's ragged prefill (each window one sequence, no mask) against cuDNN's SDPA over
    the same q/k/v slices of one QKV output (ms per layer), each with its error against fp32.
    Its first call of each backend and dtype JIT-builds the kernel (~75 s for FA3).

    `fa3-e4m3` is FA3 over e4m3 q/k/v with one scale each (amax / 448, not timed here: in the
    encoder it would come from the QKV GEMM's epilogue) and a bf16 output; its error is what fp8
    attention would add to the fp8 encoder. The q/k/v here are random normal: the error on real
    weights' activations (outliers) is a separate check."""
    import flashinfer
    from torch.nn.attention import SDPBackend, sdpa_kernel

    h, t, hd = dims.n_audio_head, dims.n_audio_ctx, dims.n_audio_state // dims.n_audio_head
    qkv = torch.randn(group * t, 3, h, hd, device="cuda", dtype=torch.bfloat16)
    indptr = torch.arange(0, group * t + 1, t, device="cuda", dtype=torch.int32)
    view = qkv.view(group, t, 3, h, hd)
    heads_first = [view[:, :, i].transpose(1, 2) for i in range(3)]  # [group, h, t, hd] each
    out = {}
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out["cudnn (sdpa)"] = common.time_ms(lambda: F.scaled_dot_product_attention(*heads_first))
    ref = F.scaled_dot_product_attention(*(x.float() for x in heads_first)).transpose(1, 2)  # [group, t, h, hd]

    def error(got: torch.Tensor) -> float:
        return float((got.float().reshape(ref.shape) - ref).norm() / ref.norm())

    q, k, v = (qkv[:, i] for i in range(3))  # [group * t, h, hd], strided views as the encoder passes them
    per_tensor = [quantize_rows(x.reshape(1, -1)) for x in (q, k, v)]  # (e4m3 [1, n], scale [1, 1]) each
    q8, k8, v8 = (x8.view(x.shape) for (x8, _), x in zip(per_tensor, (q, k, v)))
    # The ragged wrapper hands FA3's fp8 kernel its scales as extra positional tensors, one per
    # head (its q_scale/k_scale/v_scale keywords are for the cuDNN path).
    scales = tuple(scale.reshape(1).expand(h).contiguous() for _, scale in per_tensor)  # [h] float32 each
    cases = {"fa3": ("fa3", torch.bfloat16, lambda: (q, k, v)),
             "fa3-e4m3": ("fa3", torch.float8_e4m3fn, lambda: (q8, k8, v8) + scales),
             "fa2": ("fa2", torch.bfloat16, lambda: (q, k, v)),
             "fmha_v2": ("fmha_v2", torch.bfloat16, lambda: (q, k, v)),
             "flashinfer-cudnn": ("cudnn", torch.bfloat16, lambda: tuple(x.contiguous() for x in (q, k, v)))}  # fmt: skip
    for name in names:
        backend, dtype, make_tensors = cases[name]
        try:
            tensors = make_tensors()  # cuDNN's contiguous copies only when it runs
            workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
            wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=backend)
            extra = {"o_data_type": torch.bfloat16} if dtype != torch.bfloat16 else {}
            if backend == "cudnn":
                extra |= {"max_token_per_sequence": t, "max_sequence_kv": t}
            wrapper.plan(indptr, indptr, h, h, hd, causal=False, q_data_type=dtype, kv_data_type=dtype, **extra)
            got = wrapper.run(*tensors)
            out[name] = common.time_ms(lambda: wrapper.run(*tensors))
            out[name + " error"] = error(got)
        except Exception as exc:  # noqa: BLE001 - a missing backend is a result here
            print(f"flashinfer {name}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    out["sdpa bf16 error"] = error(F.scaled_dot_product_attention(*heads_first).transpose(1, 2))
    return {key: round(value, 4) for key, value in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=sorted(ARCHS), default="turbo")
    ap.add_argument("--groups", type=int, nargs="*", default=[16, 32, 64])
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--flashinfer", action="store_true",
                    help="only FlashInfer's prefill backends (FA3 in bf16 and e4m3 too) against cuDNN, at --groups")
    ap.add_argument("--backends", nargs="*", choices=FLASHINFER_CASES, default=list(FLASHINFER_CASES),
                    help="with --flashinfer: which of them (each uncached one JIT-builds on first use)")
    args = ap.parse_args()
    config = ARCHS[args.arch]
    dims = ModelDims.from_hf_config(config)
    if args.flashinfer:
        for group in args.groups:
            times = flashinfer_attention(dims, group, tuple(args.backends))
            print(f"attention per layer, {group} windows (ms):", times, flush=True)
        return
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Whisper(dims).to(dtype=torch.bfloat16).eval()
    for p in model.parameters():
        if p.dim() >= 2:
            torch.nn.init.normal_(p, std=0.02)
    encoders = {"eager": model.encoder, "fused": FusedEncoder(model.encoder),
                "fp8": FusedEncoder(model.encoder, fp8=True)}
    device = torch.device("cuda")
    if fa3_runs(device):  # the engine's default on Hopper: FlashInfer's FA3 for the encoder's attention
        head_dim = dims.n_audio_state // dims.n_audio_head
        fa3 = FlashInferEncoderAttention(device, torch.bfloat16, dims.n_audio_head, head_dim, dims.n_audio_ctx)
        encoders["fused+fa3"] = FusedEncoder(model.encoder, attention=fa3)
        encoders["fp8+fa3"] = FusedEncoder(model.encoder, fp8=True, attention=fa3)
    flops = encoder_flops(dims, config["encoder_ffn_dim"])
    rows = {}
    with torch.no_grad():
        for group in args.groups:
            mel = torch.randn(group, dims.n_mels, 3000, device="cuda", dtype=torch.bfloat16)
            ref = model.encoder(mel).float()
            for name, enc in encoders.items():
                ms = common.time_ms(graphed(enc, mel)) / group
                err = float((enc(mel).float() - ref).norm() / ref.norm())
                rows[group, name] = ms
                print(f"group {group:>3} {name:<9} {ms:6.3f} ms/window  {flops / ms / 1e9:6.0f} TFLOP/s  "
                      f"relative error vs eager {err:.4f}", flush=True)
            print(f"group {group}: attention per layer (ms):", attention_kernels(dims, group), flush=True)
            x = torch.randn(group * dims.n_audio_ctx, dims.n_audio_state, device="cuda", dtype=torch.bfloat16)
            for name in ("fused", "fp8"):
                print(f"group {group} {name}: one layer's parts (ms):", layer_breakdown(encoders[name], x, group), flush=True)
    print(f"\nencoder {args.arch}, {common.hardware()}, commit {common.commit()}")
    if not args.no_append:
        for group in args.groups:
            for name in [n for n in encoders if n != "eager"]:
                common.append_result({
                    "workload": f"encoder {args.arch} bf16 random, {group} windows per graph, {name}",
                    "ours": f"{rows[group, name]:.3f} ms/window", "peer": f"eager module: {rows[group, 'eager']:.3f} ms/window",
                    "ratio": f"{rows[group, 'eager'] / rows[group, name]:.2f}x", "notes": "benchmarks/encoder_speed.py",
                })  # fmt: skip


if __name__ == "__main__":
    main()
