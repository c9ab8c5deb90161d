"""--vad's detector alone: silero-vad's get_speech_timestamps item by item (what --vad ran before)
against batchscribe's batched paths (SpeechDetector on batches cut by VadBatching, the rules on
the host), stepwise (the model's audio_forward over rows) and sequence (encoder over all chunks,
LSTM over sequences; the default) and the sequence path at fixed shapes (`--batch-invariant`),
over the long-form files and, with --librispeech N, N
LibriSpeech rows.

    python benchmarks/vad_speed.py [--batch-sizes 1,2,4,8,64] [--librispeech 256] [--repeat 2] [--device cuda] [--append]

Audio is decoded before the clock starts. Each configuration runs once as a warm-up, then
`--repeat` times; the best wall time is kept. x real time = audio seconds / wall seconds; "padded"
is what the model steps (each batch's items x its longest). Every batched result is checked
against the per-item reference: "same spans" counts items whose spans are identical. The "stage"
row runs the same items through SpeechStage (reader and scoring threads, default batching) as the
scheduler would consume them. `--append` adds rows to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import io
import os
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def load_items(librispeech: int) -> list[tuple[str, "object"]]:
    """(id, float32 16 kHz samples): the long-form files, then LibriSpeech train-clean-5 rows."""
    import pyarrow.parquet as pq
    import soundfile as sf

    from batchscribe.audio.decode import decode_audio

    longform = DATA / "longform"
    paths = sorted((longform / "librispeech-concat").glob("*.flac")) + sorted((longform / "earnings22").glob("*.wav"))
    paths += sorted((longform / "librivox-sonnets").glob("p*.mp3"))
    items = [(p.stem, decode_audio(str(p))) for p in paths]
    if librispeech:
        table = pq.read_table(DATA / "librispeech" / "train-clean-5-00000-of-00008.parquet", columns=["id", "audio"])
        for row in table.slice(0, librispeech).to_pylist():
            items.append((row["id"], sf.read(io.BytesIO(row["audio"]["bytes"]), dtype="float32")[0]))
    return items


def best_of(fn, repeat: int) -> tuple[float, object]:
    """The best wall seconds of `repeat` calls after one warm-up call, and the last result."""
    out = fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def per_item(items: list) -> list[list[tuple[int, int]]]:
    """silero-vad's get_speech_timestamps on each item with vad.py's settings (one model)."""
    import torch
    from silero_vad import get_speech_timestamps, load_silero_vad

    from batchscribe.audio import vad

    model = load_silero_vad()
    out = []
    for _, audio in items:
        found = get_speech_timestamps(torch.from_numpy(audio), model, threshold=vad.THRESHOLD, sampling_rate=16000,
                                      min_silence_duration_ms=vad.MIN_SILENCE_MS, speech_pad_ms=vad.SPEECH_PAD_MS,
                                      max_speech_duration_s=vad.MAX_CHUNK_SECONDS)  # fmt: skip
        out.append([(int(d["start"]), int(d["end"])) for d in found])
    return out


def batched(detector, items: list, batching) -> tuple[list[list[tuple[int, int]]], int]:
    """The batched path's unmerged spans (comparable with get_speech_timestamps), and the padded
    samples the model stepped: batches cut as the stage cuts them, each scored as
    SpeechDetector.detect scores it (one call of the model per length group)."""
    from batchscribe.audio.vad import RULES, length_groups
    from batchscribe.audio.vad_spans import speech_spans

    spans, padded, k = [], 0, 0
    while k < len(items):
        n = batching.take([len(a) for _, a in items[k:]])
        audios = [a for _, a in items[k : k + n]]
        found: list = [None] * n
        for group in length_groups([len(a) for a in audios]):
            for j, probs in zip(group, detector.probabilities([audios[j] for j in group])):
                found[j] = speech_spans(probs, len(audios[j]), RULES)
            padded += len(group) * max(len(audios[j]) for j in group)
        spans += found
        k += n
    return spans, padded


def through_stage(detector, items: list) -> int:
    """Items through SpeechStage, taken and finished as a scheduler would; how many came out."""
    from batchscribe.audio.vad_stream import SpeechStage

    n = 0
    with SpeechStage(iter(items), detector) as stage:
        for entry in stage:
            if entry is not None:
                stage.finished(entry[0])
                n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,2,4,8,64")
    parser.add_argument("--librispeech", type=int, default=0, help="also this many LibriSpeech rows")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--append", action="store_true", help="add rows to benchmarks/RESULTS.md")
    parser.add_argument("--device", default="cpu", help="where the batched paths score (the per-item peer stays on the CPU, as silero runs it)")
    args = parser.parse_args()

    import torch

    from batchscribe.audio.vad import SpeechDetector
    from batchscribe.audio.vad_stream import VadBatching
    from common import append_result, commit, hardware

    items = load_items(args.librispeech)
    audio_s = sum(len(a) for _, a in items) / 16000
    print(f"{len(items)} items, {audio_s:,.0f} s of audio; {hardware()}, {os.cpu_count()} cores, batched paths on "
          f"{args.device}, commit {commit()}")
    wall, reference = best_of(lambda: per_item(items), args.repeat)
    rows = [("silero get_speech_timestamps, per item", wall, audio_s, len(items))]
    default = SpeechDetector(args.device)
    for name, detector in (("stepwise (audio_forward)", SpeechDetector(args.device, sequence=False)),
                           ("sequence", default),
                           ("sequence at fixed shapes (--batch-invariant)", SpeechDetector(args.device, invariant=True))):  # fmt: skip
        for size in [int(s) for s in args.batch_sizes.split(",")]:
            batching = VadBatching(max_items=size)
            wall, (spans, padded) = best_of(lambda: batched(detector, items, batching), args.repeat)
            same = sum(a == b for a, b in zip(spans, reference))
            rows.append((f"{name}, max_items {size}", wall, padded / 16000, same))
    wall, n = best_of(lambda: through_stage(default, items), args.repeat)
    rows.append((f"SpeechStage, default {VadBatching()}", wall, float("nan"), n))
    print("\n| path | wall s | items/s | x real time | padded s | same spans |\n| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, wall, padded_s, same in rows:
        print(f"| {name} | {wall:.2f} | {len(items) / wall:.1f} | {audio_s / wall:,.0f} | {padded_s:,.0f} | {same}/{len(items)} |")
    if args.append:
        base = rows[0][1]
        workload = f"--vad detector alone: {len(items)} items, {audio_s:,.0f} s (long-form files"
        workload += f" + {args.librispeech} LibriSpeech rows)" if args.librispeech else ")"
        for name, wall, _, same in rows[1:]:
            append_result({"workload": workload, "ours": f"x{audio_s / wall:,.0f} real time ({name})",
                           "peer": f"silero get_speech_timestamps per item: x{audio_s / base:,.0f}",
                           "ratio": f"{base / wall:.1f}x", "memory": "-",
                           "notes": f"batched on {args.device}; same spans {same}/{len(items)}; torch threads {torch.get_num_threads()}"})  # fmt: skip


if __name__ == "__main__":
    main()
