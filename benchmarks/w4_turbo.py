"""W4: the large-v3-turbo architecture (large-v3's 32-layer encoder, 4 decoder layers) with random
bf16 weights, exactly 32 tokens per 30 s window (a ~10 s utterance's text): encoder-bound.

The W2 program with W4's workload; transformers' generate at bs 256 and 1024 in the same run:

    python benchmarks/w4_turbo.py --tokenizer-from BASE_HF_FOLDER [--durations-from W1.parquet]
        [--configs auto:auto auto:auto:fp8 auto:fp8:fp8]

--durations-from reports the RTFx implied at those clips' mean duration (W1's first 100
train-clean-5 rows: ~13 s each). The third default config adds fp8 cross K/V to the fp8 encoder:
the most a user can switch on, and half the bytes each decode step reads.
"""

from __future__ import annotations

import w2_large_v3

if __name__ == "__main__":
    w2_large_v3.main(name="W4", arch="turbo", tokens=32, peer_batches=(256, 1024),
                     configs=("auto:auto", "auto:auto:fp8", "auto:fp8:fp8"))
