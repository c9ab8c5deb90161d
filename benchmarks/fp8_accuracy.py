"""The fp8 encoder's accuracy on real weights: WER with --encoder-precision fp8 against the default
encoder, on the same rows, with the share of identical transcripts.

    python benchmarks/fp8_accuracy.py [--models tiny.en base] [--rows 100] [--device cpu|cuda] [--dtype float16]

Sets: the first --rows of LibriSpeech test-other and of train-clean-5 shard 0 (../shared/data).
On the CPU the fp8 GEMMs are emulated (the same quantisation, float32 arithmetic); on a GPU they
are torch._scaled_mm. The model's dtype is the device's default (float32 on the CPU, float16 on a
GPU for tiny.en and base) unless --dtype says: `--dtype float16` on the CPU compares fp8 against
the GPU's default precision. `--dense-layers 0 0,5` compares fp8 encoders that keep those layers in
the model's dtype (the engine's own choice is model/fused_encoder.FP8_DENSE_LAYERS). Greedy
decoding (temperature 0) so that the fallback cannot hide a change. `--attention e4m3` adds fp8
attention in the fp8 layers, emulated as FlashInfer's FA3 e4m3 kernel computes it (fa3_e4m3_emulated):
what it would cost in accuracy, before any kernel is built for it. `--cross-projections e4m3`
adds the decoder's cross-attention K/V projections (the admission's 2 x decoder-layers GEMMs over
the encoder's output) in e4m3 to the fp8 variants: the encoder's output quantised per token once,
each weight per output channel, as model/fp8.py does the encoder's GEMMs. `--cross-kv fp8` stores
the cross K/V in fp8, as W2's auto:fp8:fp8 does.
Prints a table and appends rows to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "librispeech"
# name -> the files' glob, read in order; `train-clean-5-rest` (shards 1-7, ~1,450 rows) is held
# apart from shard 0, which earlier 100-row comparisons looked at.
SETS = {"test-other": "test-other-subset-00000-of-00001.parquet", "train-clean-5": "train-clean-5-00000-of-00008.parquet",
        "train-clean-5-rest": "train-clean-5-0000[1-7]-of-00008.parquet"}  # fmt: skip


def rows(name: str, n: int) -> tuple[list, dict[str, str]]:
    """The first `n` rows of set `name`: ([(id, float32 samples)], {id: reference text})."""
    import pyarrow.parquet as pq
    import soundfile as sf

    table = []
    for path in sorted(DATA.glob(SETS[name])):
        if len(table) < n:
            table += pq.read_table(path, columns=["id", "audio", "text"]).slice(0, n - len(table)).to_pylist()
    items = [(str(r["id"]), sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32")[0]) for r in table]
    return items, {str(r["id"]): r["text"] for r in table}


def fa3_e4m3_emulated(n_head: int):
    """An EncoderAttention `(qkv [M, 3 d], windows) -> [M, d]` with FA3's e4m3 arithmetic, in float32:
    q, k and v quantised to e4m3 with one scale each per window (amax / 448); logits from the
    quantised q and k; the softmax's unnormalised P (exp(s - row max), in (0, 1]) scaled by 448 and
    quantised to e4m3 before the PV product, as FlashInfer's sm90 fp8 kernel does (p_scale); the
    normaliser summed from the unquantised P. Per-window scales keep a window's result independent
    of the windows beside it (a per-tensor scale over a chunk would not)."""
    import math

    import torch

    from batchscribe.model.fp8 import E4M3, E4M3_MAX, quantize_rows

    def quantised(x: torch.Tensor) -> torch.Tensor:  # x: [H, T, hd], one scale for the window
        q, scale = quantize_rows(x.reshape(1, -1))  # the encoder's own e4m3 rounding, one row
        return (q.float() * scale).view(x.shape)

    def attend(qkv: torch.Tensor, windows: int) -> torch.Tensor:
        m, three_d = qkv.shape
        d = three_d // 3
        heads = qkv.float().view(windows, m // windows, 3, n_head, d // n_head)
        out = torch.empty(windows, m // windows, n_head, d // n_head, device=qkv.device)
        for w in range(windows):  # one window's [H, T, T] logits at a time
            q, k, v = (quantised(heads[w, :, i].transpose(0, 1)) for i in range(3))  # [H, T, hd]
            logits = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
            p = torch.exp(logits - logits.amax(-1, keepdim=True))
            p_e4m3 = (p * E4M3_MAX).to(E4M3).float() / E4M3_MAX
            out[w] = ((p_e4m3 @ v) / p.sum(-1, keepdim=True)).transpose(0, 1)
        return out.view(m, d).to(qkv.dtype)

    return attend


def fp8_cross_write(model):
    """A `write_cross_kv(cache, enc, slots)` for `model` whose K and V projections run in e4m3
    (emulated off sm_89+): enc [g, T, d] quantised per row once, each projection's weight per
    output channel (model/fp8.Fp8Weight), written as Whisper.write_cross_kv writes."""
    from batchscribe.model import cross_write
    from batchscribe.model.fp8 import Fp8Weight, quantize_rows

    dtype = next(model.parameters()).dtype
    weights = [(Fp8Weight(layer.encoder_attn.k_proj.weight, None, dtype),
                Fp8Weight(layer.encoder_attn.v_proj.weight, layer.encoder_attn.v_proj.bias, dtype))
               for layer in model.decoder.layers]  # fmt: skip

    def write(cache, enc, slots) -> None:
        g, t, d = enc.shape
        a, scale = quantize_rows(enc.reshape(g * t, d))
        for i, pair in enumerate(weights):
            attn = model.decoder.layers[i].encoder_attn
            for cache_kv, weight in zip((cache.cross_k[i], cache.cross_v[i]), pair):
                cross_write.store(cache_kv, attn.heads(weight(a, scale).view(g, t, d)), slots, cache.cross_hnd)

    return write


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["tiny.en", "base"])
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"],
                    help="the model's dtype (default: the device's); float16 on the CPU emulates the GPU's default")
    ap.add_argument("--dense-layers", nargs="*", default=None, metavar="I,J",
                    help="fp8 variants to compare, each the layers kept dense (\"\" for none); default: the engine's")
    ap.add_argument("--sets", nargs="*", choices=list(SETS), default=["test-other", "train-clean-5"])
    ap.add_argument("--attention", choices=["dtype", "e4m3"], default="dtype",
                    help="the fp8 layers' attention: the model's dtype (the engine's), or FA3's e4m3 emulated")
    ap.add_argument("--cross-projections", choices=["dtype", "e4m3"], default="dtype",
                    help="the fp8 variants' cross K/V projections: the model's dtype (the engine's), or e4m3")
    ap.add_argument("--cross-kv", choices=["auto", "fp8"], default="auto", help="the cross K/V cache, as --cross-kv")
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    import jiwer

    import common
    from batchscribe.api import Transcriber
    from batchscribe.engine import encoder
    from batchscribe.eval.normalize import get_normalizer

    norm = get_normalizer("english")
    engine_default = encoder.FP8_DENSE_LAYERS
    if args.attention == "e4m3":
        # NOTE: a benchmark-only override: the fp8 layers of every fused encoder attend in e4m3
        fused = encoder.FusedEncoder

        def fused_e4m3(*a, **kw):
            built = fused(*a, **kw)
            for layer in built.layers:
                if layer.fp8 is not None:
                    layer.attention = fa3_e4m3_emulated(layer.n_head)
            return built

        encoder.FusedEncoder = fused_e4m3
    table = []
    for model in args.models:
        for name in args.sets:
            items, refs = rows(name, args.rows)
            texts = {}
            dense = {"fp8": engine_default} if args.dense_layers is None else \
                {f"fp8 dense {d or '-'}": tuple(int(i) for i in d.split(",") if i) for d in args.dense_layers}
            for variant in ["auto", *dense]:
                # NOTE: a benchmark-only override of the engine's choice, read when the encoder is built
                encoder.FP8_DENSE_LAYERS = dense.get(variant, engine_default)
                t = Transcriber(model, device=args.device, dtype=args.dtype, language="en", temperatures=(0.0,),
                                encoder_precision="auto" if variant == "auto" else "fp8", cross_kv=args.cross_kv)  # fmt: skip
                if variant != "auto" and args.cross_projections == "e4m3":
                    # NOTE: a benchmark-only override, read by the engine's WindowEncoder at each admission
                    t.model.write_cross_kv = fp8_cross_write(t.model)
                texts[variant] = {r["id"]: r["text"] for r in t.transcribe(items, sample_rate=16000)}
                dtype = t.describe()["engine"]["dtype"]  # as the engine resolved it
                t.release()
            ids = sorted(refs)
            wer = {p: 100 * jiwer.wer([norm(refs[i]) for i in ids], [norm(texts[p][i]) for i in ids]) for p in texts}
            for variant in [v for v in texts if v != "auto"]:
                same = sum(texts["auto"][i] == texts[variant][i] for i in ids) / len(ids)
                table.append((model, name, wer["auto"], wer[variant], same, len(ids), dtype, variant))
                print(f"{model:<8} {name:<14} {variant:<14} attention {args.attention:<5} "
                      f"cross projections {args.cross_projections} cross K/V {args.cross_kv} WER default {wer['auto']:.2f} %  fp8 {wer[variant]:.2f} %  "
                      f"(delta {wer[variant] - wer['auto']:+.2f})  identical {100 * same:.0f} %", flush=True)
    encoder.FP8_DENSE_LAYERS = engine_default
    print(f"\nfp8 encoder accuracy, at most {args.rows} rows per set, {common.hardware()}, commit {common.commit()}")
    if not args.no_append:
        for model, name, w_auto, w_fp8, same, n, dtype, variant in table:
            common.append_result({
                "workload": f"fp8 encoder accuracy, {model}, {name}'s first {n} rows, greedy, {args.device}, dtype {dtype}"
                            + ("" if variant == "fp8" else f", {variant}")
                            + (", attention e4m3 (FA3 emulated)" if args.attention == "e4m3" else "")
                            + (", cross K/V projections e4m3" if args.cross_projections == "e4m3" else "")
                            + (", cross K/V fp8" if args.cross_kv == "fp8" else ""),
                "ours": f"WER fp8 {w_fp8:.2f} %", "peer": f"default encoder: WER {w_auto:.2f} %",
                "ratio": f"{w_fp8 - w_auto:+.2f} abs", "wer": f"{w_fp8:.2f} / {w_auto:.2f} %",
                "notes": f"{100 * same:.0f} % identical transcripts; benchmarks/fp8_accuracy.py",
            })  # fmt: skip


if __name__ == "__main__":
    main()
