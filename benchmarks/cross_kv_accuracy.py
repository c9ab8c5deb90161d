"""What a 4-bit cross-attention K/V cache would cost in accuracy, before any kernel is built for it.

    python benchmarks/cross_kv_accuracy.py [--models tiny.en base] [--rows 100] [--variants fp8 int4-token int4-kchannel]

W2's decode step is the cross K/V read (docs/GPU_NOTES.md: ~82 % of the step at the memory roof in
fp8); 4 bits a value would halve it. Each variant stores the cross K/V the admission writes as the
cache would hold them, dequantised back into the model's dtype (the CPU emulates; the arithmetic
after is the engine's own):
- `fp8`: e4m3 with scale 1, the engine's `--cross-kv fp8` (no emulation: the real cache);
- `int4-token`: symmetric int4 (-7..7), one scale per frame and head (64 values): the engine's
  `--cross-kv int4` (attention/int4_cross; no emulation);
- `int4-kchannel`: K with one scale per head channel over the window's 1500 frames (keys' outlier
  channels then do not flatten a frame's other channels), V as int4-token;
- `int4-g32`: as int4-token with one scale per 32 values (two a frame and head);
- `fp8k-int4v`: K in e4m3 (scale 1, as `fp8`), V as int4-token: the softmax's logits keep fp8's
  precision, the values (averaged over frames by the softmax) take the coarser steps.
Sets: the first --rows of LibriSpeech test-other and train-clean-5 shard 0 (../shared/data;
`--sets train-clean-5-rest`: shards 1-7, rows no earlier comparison looked at), greedy
(temperature 0, so that the fallback cannot hide a change). Prints WER against the default cache,
with the share of identical transcripts, and appends rows to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse

import torch

from batchscribe.attention import int4_cross
from fp8_accuracy import SETS, rows


VARIANTS = ["fp8", "int4-token", "int4-kchannel", "int4-g32", "fp8k-int4v"]


def int4(x: torch.Tensor, dim: int, group: int = 0) -> torch.Tensor:
    """x quantised to symmetric int4 with one scale per slice along `dim` (amax / 7), or with
    `group` per `group` values of the last dim, dequantised: the layouts int4_cross does not store
    (per channel, 32-value groups)."""
    shape = x.shape
    if group:
        x = x.reshape(*shape[:-1], shape[-1] // group, group)
    scale = x.float().abs().amax(dim=dim, keepdim=True).clamp_min(1e-12) / 7.0
    return ((x.float() / scale).round().clamp(-7, 7) * scale).to(x.dtype).reshape(shape)


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """x through the fp8 cache's cast (cache.to_cache_dtype), back in its dtype."""
    from batchscribe.model.cache import to_cache_dtype

    return to_cache_dtype(x, torch.float8_e4m3fn).to(x.dtype)


def emulated_store(variant: str, store):
    """A cross_write.store that quantises kv [B, T, H, D] as `variant` says, then stores it.
    Whisper.write_cross_kv stores K then V for each layer: the call count tells which."""
    calls = [0]

    def quantised_store(cache, kv, slots, hnd):
        is_k = calls[0] % 2 == 0
        calls[0] += 1
        if variant == "int4-kchannel" and is_k:
            kv = int4(kv, dim=1)  # one scale per (window, head, channel) over the frames
        elif variant == "fp8k-int4v" and is_k:
            kv = e4m3(kv)
        elif variant == "int4-g32":
            kv = int4(kv, dim=-1, group=32)
        else:  # one scale per (window, frame, head): the engine's own format (int4_cross)
            kv = int4_cross.dequantize(*int4_cross.quantize(kv), dtype=kv.dtype)
        store(cache, kv, slots, hnd)

    return quantised_store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=["tiny.en", "base"])
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sets", nargs="*", choices=list(SETS), default=["test-other", "train-clean-5"])
    ap.add_argument("--variants", nargs="*", default=VARIANTS[:3], choices=VARIANTS)
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    import jiwer

    import common
    from batchscribe.api import Transcriber
    from batchscribe.eval.normalize import get_normalizer
    from batchscribe.model import cross_write

    norm, store = get_normalizer("english"), cross_write.store
    table = []
    for model in args.models:
        for name in args.sets:
            items, refs = rows(name, args.rows)
            texts = {}
            for variant in ["auto", *args.variants]:
                real = {"fp8": "fp8", "int4-token": "int4"}  # the engine's own caches
                t = Transcriber(model, device=args.device, language="en", temperatures=(0.0,),
                                cross_kv=real.get(variant, "auto"))  # fmt: skip
                # NOTE: a benchmark-only override, read by Whisper.write_cross_kv at each admission
                emulated = variant not in ("auto", *real)
                cross_write.store = emulated_store(variant, store) if emulated else store
                texts[variant] = {r["id"]: r["text"] for r in t.transcribe(items, sample_rate=16000)}
                cross_write.store = store
                t.release()
            ids = sorted(refs)
            wer = {v: 100 * jiwer.wer([norm(refs[i]) for i in ids], [norm(texts[v][i]) for i in ids]) for v in texts}
            for variant in args.variants:
                same = sum(texts["auto"][i] == texts[variant][i] for i in ids) / len(ids)
                table.append((model, name, wer["auto"], wer[variant], same, len(ids), variant))
                print(f"{model:<8} {name:<14} {variant:<14} WER default {wer['auto']:.2f} %  {variant} "
                      f"{wer[variant]:.2f} %  (delta {wer[variant] - wer['auto']:+.2f})  identical {100 * same:.0f} %",
                      flush=True)  # fmt: skip
    print(f"\ncross K/V accuracy, at most {args.rows} rows per set, {common.hardware()}, commit {common.commit()}")
    if not args.no_append:
        for model, name, w_auto, w_var, same, n, variant in table:
            common.append_result({
                "workload": f"cross K/V cache accuracy, {model}, {name}'s first {n} rows, greedy, {args.device}, "
                            f"{variant}{'' if variant in ('fp8', 'int4-token') else ' (emulated)'}",
                "ours": f"WER {variant} {w_var:.2f} %", "peer": f"default cache: WER {w_auto:.2f} %",
                "ratio": f"{w_var - w_auto:+.2f} abs", "wer": f"{w_var:.2f} / {w_auto:.2f} %",
                "notes": f"{100 * same:.0f} % identical transcripts; benchmarks/cross_kv_accuracy.py",
            })  # fmt: skip


if __name__ == "__main__":
    main()
