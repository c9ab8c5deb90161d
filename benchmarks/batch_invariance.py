"""Does an item's transcript depend on the items it shares the engine with? (issues 21 and 22:
"records identical to a one-GPU run" needs the same record whatever the batch around an item.)

    python benchmarks/batch_invariance.py [--rows 100 --copies 8] [--device cuda] [--configs auto sdpa ...]

Each of the first --rows of LibriSpeech test-other is transcribed --copies times in one run, the
copies shuffled among the other rows (a fixed seed), so every copy meets another batch: other
admission groups for the encoder, other row buckets and neighbours for the decoder. A batch-invariant
engine gives every copy of a row the same tokens and the same avg_logprob, bit for bit. For each
configuration (`ATTENTION[,invariant|,variant][,nographs][,enc1][,onebucket][,slots=N]`: an
--attention value; --batch-invariant or --no-batch-invariant (neither: the default, on with
CUDA); CUDA graphs off; every window encoded alone instead of in admission chunks of 1-64; every
decode step padded to all the slots instead of the smallest row bucket; a slot count), the share of rows whose copies agree on the text, on the tokens and exactly on every
segment's avg_logprob, and the largest avg_logprob spread within a row. Greedy decoding
(temperature 0), so a fallback cannot hide a difference. A diagnostic: prints, appends nothing.
"""

from __future__ import annotations

import argparse
import random
from collections import defaultdict

import common
from fp8_accuracy import rows


def _config(spec: str) -> dict:
    """A --configs value -> Transcriber options (`enc1` is applied by the caller)."""
    parts = spec.split(",")
    options = {"attention": parts[0], "cuda_graphs": "nographs" not in parts[1:]}
    options["batch_invariant"] = common.batch_invariant(parts[1:])  # the engine's own option
    for part in parts[1:]:
        if part.startswith("slots="):
            options["batch_size"] = int(part.split("=", 1)[1])
    return options


def _agreement(records: list[dict]) -> dict[str, float]:
    by_row: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_row[r["id"].rsplit("~", 1)[0]].append(r)
    text = tokens = logprob = 0
    spread = 0.0
    for copies in by_row.values():
        text += len({c["text"] for c in copies}) == 1
        tokens += len({tuple(t for s in c["segments"] for t in s["tokens"]) for c in copies}) == 1
        lps = [tuple(s["avg_logprob"] for s in c["segments"]) for c in copies]
        logprob += len(set(lps)) == 1
        if len({len(x) for x in lps}) == 1:
            spread = max([spread] + [max(col) - min(col) for col in zip(*lps)])
    n = len(by_row)
    return {"text": 100 * text / n, "tokens": 100 * tokens / n, "logprob": 100 * logprob / n, "spread": spread}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--configs", nargs="+", default=["auto"])
    args = ap.parse_args()
    import common
    from batchscribe.api import Transcriber
    from batchscribe.engine import encoder
    from batchscribe.engine import engine as engine_module

    items, _ = rows("test-other", args.rows)
    work = [(f"{i}~{k}", audio) for i, audio in items for k in range(args.copies)]
    random.Random(0).shuffle(work)
    print(f"{args.model}, {len(items)} rows x {args.copies} copies, {common.hardware()}, commit {common.commit()}")
    print(f"{'config':<36} {'text':>6} {'tokens':>7} {'logprob':>8} {'max spread':>11}  (% rows whose copies agree)")
    chunks, buckets = encoder.ENCODER_CHUNKS, engine_module.default_buckets
    for spec in args.configs:
        # NOTE: a diagnostic-only override, read when the engine is built and at each admission
        encoder.ENCODER_CHUNKS = (1,) if "enc1" in spec.split(",") else chunks
        engine_module.default_buckets = (lambda n: [n]) if "onebucket" in spec.split(",") else buckets
        t = Transcriber(args.model, device=args.device, language="en", temperatures=(0.0,), **_config(spec))
        got = _agreement(t.transcribe(work, sample_rate=16000))
        engine = t.describe()["engine"]
        t.release()
        name = f"{spec} ({engine.get('attention', '')}, {engine.get('batch_size', '')} slots)"
        print(f"{name:<36} {got['text']:>6.1f} {got['tokens']:>7.1f} {got['logprob']:>8.1f} {got['spread']:>11.2e}",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
