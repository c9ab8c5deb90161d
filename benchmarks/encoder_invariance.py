"""Which encoder stage makes a window's output depend on the chunk it is encoded in? (The engine
encodes admission groups in chunks of ENCODER_CHUNKS windows; benchmarks/batch_invariance.py showed
that encoding every window alone makes transcripts far more batch-invariant.)

    python benchmarks/encoder_invariance.py [--model tiny.en] [--device cuda]

The first 64 test-other rows as 30 s windows. For each chunk size c, windows 0..c-1 go through each
stage at once, and window 0's output is compared bit for bit with its output at c = 1: the log-mel,
the conv stem, one QKV GEMM (addmm over c x 1500 frames), the fused encoder with SDPA and with FA3
(on Hopper), and the eager encoder. Prints the largest absolute difference per stage and chunk size
(0 = invariant). A diagnostic: appends nothing.
"""

from __future__ import annotations

import argparse

import torch

from fp8_accuracy import rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    import common
    from batchscribe.api import Transcriber
    from batchscribe.audio.features import LogMel
    from batchscribe.constants import N_SAMPLES
    from batchscribe.engine.encoder import ENCODER_CHUNKS
    from batchscribe.model.fused_encoder import FusedEncoder

    t = Transcriber(args.model, device=args.device, language="en")
    model = t.model
    dtype, device = next(model.parameters()).dtype, next(model.parameters()).device
    items, _ = rows("test-other", max(ENCODER_CHUNKS))
    audio = torch.zeros(len(items), N_SAMPLES, device=device)
    for k, (_, a) in enumerate(items):
        n = min(len(a), N_SAMPLES)
        audio[k, :n] = torch.from_numpy(a[:n]).to(device)
    features = LogMel(model.dims.n_mels, device=device)
    enc = model.encoder
    qkv_w = torch.cat([enc.layers[0].self_attn.q_proj.weight, enc.layers[0].self_attn.k_proj.weight,
                       enc.layers[0].self_attn.v_proj.weight]).t().contiguous()  # fmt: skip
    fused = FusedEncoder(enc)  # built once: it rearranges the GEMM weights
    stages = {
        "log-mel": lambda a: features(a),
        "conv stem": lambda a: enc.stem(features(a).to(dtype)),
        "qkv addmm": lambda a: torch.mm(enc.stem(features(a).to(dtype)).flatten(0, 1), qkv_w),
        "fused encoder sdpa": lambda a: fused(features(a).to(dtype)),
        "eager encoder": lambda a: enc(features(a).to(dtype)),
    }
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9:
        from batchscribe.attention.flashinfer_prefill import FlashInferEncoderAttention

        dims = model.dims
        fa3 = FlashInferEncoderAttention(device, dtype, dims.n_audio_head, dims.n_audio_state // dims.n_audio_head,
                                         dims.n_audio_ctx)  # fmt: skip
        fused_with_fa3 = FusedEncoder(enc, attention=fa3)

        def fused_fa3(a: torch.Tensor) -> torch.Tensor:
            fa3.prepare(a.shape[0])  # a plan per chunk size, as WindowEncoder.warm_up makes
            return fused_with_fa3(features(a).to(dtype))

        stages["fused encoder fa3"] = fused_fa3
    sizes = sorted(ENCODER_CHUNKS)
    print(f"{args.model} ({dtype}), window 0 at chunk c against c = 1: max |diff|; {common.hardware()}, "
          f"commit {common.commit()}")
    print(f"{'stage':<22}" + "".join(f"{c:>10}" for c in sizes))
    with torch.no_grad():
        for name, fn in stages.items():
            alone = fn(audio[:1]).float()
            frames = alone.shape[0] if name == "qkv addmm" else 1
            diffs = []
            for c in sizes:
                out = fn(audio[:c]).float()
                diffs.append((out[:frames] - alone).abs().max().item())
            print(f"{name:<22}" + "".join(f"{d:>10.2e}" for d in diffs), flush=True)


if __name__ == "__main__":
    main()
