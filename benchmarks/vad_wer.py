"""WER on the long-form files with and without --vad (accuracy, not speed: wall times are printed
only to say what the run cost).

    python benchmarks/vad_wer.py [--model tiny.en] [--device cpu] [--only earnings22,librispeech-concat] [--vad-only]

Reads ../shared/data/longform (librispeech-concat: ~5 min chapters with 0.25 s gaps; earnings22:
~60 s calls; librivox-sonnets: ~53 s readings), transcribes every file with the same greedy-then-
fallback ladder twice, without and with Silero VAD, and prints per-file and pooled WER after
openai-whisper's English normaliser (jiwer counts; openai-whisper is a test dependency). The
sonnets' references spell the sonnet number as a Roman numeral, which adds the same error to both.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

LONGFORM = Path(__file__).resolve().parents[2] / "shared" / "data" / "longform"


def files(only: set[str] | None) -> list[tuple[str, Path, str]]:
    """(id, audio path, reference text) of each long-form file."""
    out = []
    concat = LONGFORM / "librispeech-concat"
    if not only or "librispeech-concat" in only:
        for line in (concat / "manifest.jsonl").read_text().splitlines():
            row = json.loads(line)
            out.append((row["id"], concat / row["audio"], row["text"]))
    for folder, pattern in (("earnings22", "*.wav"), ("librivox-sonnets", "p*.mp3")):
        if not only or folder in only:
            for audio in sorted((LONGFORM / folder).glob(pattern)):
                out.append((audio.stem, audio, audio.with_suffix(".txt").read_text()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--only", default="", help="comma-separated folders of longform/")
    parser.add_argument("--vad-only", action="store_true", help="only the --vad pass (its wall time and RTFx)")
    args = parser.parse_args()

    import jiwer
    from whisper.normalizers import EnglishTextNormalizer

    from batchscribe.api import Transcriber

    normalise = EnglishTextNormalizer()
    todo = files(set(filter(None, args.only.split(","))) or None)
    items = [(item_id, str(path)) for item_id, path, _ in todo]
    refs = {item_id: normalise(text) for item_id, _, text in todo}
    results = {}
    for vad in (True,) if args.vad_only else (False, True):
        t = Transcriber(args.model, device=args.device, batch_size=args.batch_size, vad=vad)
        t0 = time.perf_counter()
        records = t.transcribe(items)
        wall = time.perf_counter() - t0
        audio_s = sum(r["duration"] for r in records)
        print(f"vad={vad}: {wall:.1f} s wall, {audio_s:,.0f} s of audio, RTFx {audio_s / wall:.1f}", flush=True)
        hyps = {r["id"]: normalise(r["text"]) for r in records}
        per_file = {i: jiwer.wer(refs[i], hyps[i]) for i in refs}
        pooled = jiwer.process_words(list(refs.values()), [hyps[i] for i in refs])
        errors = pooled.substitutions + pooled.deletions + pooled.insertions
        results[vad] = (per_file, errors / (pooled.hits + pooled.substitutions + pooled.deletions), wall)
    if args.vad_only:
        print("| file | WER --vad |\n| --- | ---: |")
        for item_id in refs:
            print(f"| {item_id} | {results[True][0][item_id]:.2%} |")
        print(f"| pooled | {results[True][1]:.2%} |\n\nwall: {results[True][2]:.1f} s with --vad ({args.model}, {args.device})")
        return
    print("| file | WER | WER --vad |\n| --- | ---: | ---: |")
    for item_id in refs:
        print(f"| {item_id} | {results[False][0][item_id]:.2%} | {results[True][0][item_id]:.2%} |")
    print(f"| pooled | {results[False][1]:.2%} | {results[True][1]:.2%} |")
    print(f"\nwall: {results[False][2]:.1f} s without, {results[True][2]:.1f} s with --vad ({args.model}, {args.device})")


if __name__ == "__main__":
    main()
