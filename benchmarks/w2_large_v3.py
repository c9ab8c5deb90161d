"""W2: the large-v3 architecture with random bf16 weights, exactly 128 tokens per 30 s window.

batchscribe's engine (slots, CUDA graphs) against transformers' eager generate, in the same process:

    python benchmarks/w2_large_v3.py --tokenizer-from BASE_HF_FOLDER [--windows 1024] [--peer-batch 256]

BASE_HF_FOLDER is a converted multilingual Whisper folder (e.g. `batchscribe models` shows where
`base` was converted); its tokenizer.json is extended with <|yue|> to the large-v3 layout.
Random weights make the text meaningless; the cost per window is the real one. Prints a table and
appends a row to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import common
from batchscribe.config import DecodeOptions, EngineOptions
from batchscribe.engine.engine import build_engine
from batchscribe.engine.scheduler import Scheduler
from batchscribe.engine.setup import EngineConfig, resolve_engine
from batchscribe.engine.windows import WindowPlanner, step_spec
from batchscribe.model.dims import ModelDims
from batchscribe.model.tokenizer import Tokenizer
from batchscribe.model.whisper import Whisper
from batchscribe.output.verbose_json import transcript_record

LARGE_V3 = dict(
    vocab_size=51866, num_mel_bins=128, d_model=1280, encoder_layers=32, decoder_layers=32,
    encoder_attention_heads=20, decoder_attention_heads=20, encoder_ffn_dim=5120, decoder_ffn_dim=5120,
    max_source_positions=1500, max_target_positions=448,
)  # fmt: skip
TURBO = dict(LARGE_V3, decoder_layers=4)  # large-v3-turbo: large-v3's encoder, 4 decoder layers
ARCHS = {"large-v3": LARGE_V3, "turbo": TURBO}
# The workload, set by main() from --arch / --tokens (W2: large-v3 and 128; W4: turbo and 32).
ARCH = LARGE_V3
TOKENS = 128
# --tokens-from: each window's own number of tokens (cycled in admission order); TOKENS is then
# their maximum, the decoding options' sample_len.
BUDGETS: list[int] = []


def large_v3_tokenizer(base_folder: Path, out: Path) -> Tokenizer:
    """base's tokenizer.json with <|yue|> after <|su|>: every later special id moves up by one."""
    data = json.loads((base_folder / "tokenizer.json").read_text())
    su = next(t["id"] for t in data["added_tokens"] if t["content"] == "<|su|>")
    for tok in data["added_tokens"]:
        if tok["id"] > su:
            tok["id"] += 1
    yue = dict(next(t for t in data["added_tokens"] if t["content"] == "<|su|>"), content="<|yue|>", id=su + 1)
    data["added_tokens"].append(yue)
    data["added_tokens"].sort(key=lambda t: t["id"])
    data["post_processor"] = None
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(data))
    tok = Tokenizer.from_folder(out, multilingual=True)
    assert tok.timestamp_begin == 50365 and tok.n_vocab == 51866, (tok.timestamp_begin, tok.n_vocab)
    return tok


def mid_kv() -> int:
    """The prompt, then half a window: the mean self-attention length."""
    return 4 + round(np.mean(BUDGETS) if BUDGETS else TOKENS) // 2


def transcript_budgets(path: Path, tok: Tokenizer, column: str = "text") -> list[int]:
    """Tokens a window of each row decodes: its reference as Whisper writes it (sentence case, a
    full stop; LibriSpeech's are upper case without punctuation), then end-of-text."""
    import pyarrow.parquet as pq

    texts = pq.read_table(path, columns=[column]).column(column).to_pylist()
    return [len(tok.encode(" " + t.strip().lower().capitalize() + ".")) + 1 for t in texts]


def budget_admissions(engine, budgets: list[int]) -> None:
    """Give each admitted window the next budget of `budgets` (cycled): its slot's last sampled
    position, written behind the admission's own set-up in stream order. EOT stays suppressed, so
    a window decodes exactly its budget."""
    from itertools import cycle

    from batchscribe.engine.pinned import to_device_async

    admit, order = engine.admit, cycle(budgets)

    def admit_with_budgets(requests, slots) -> None:
        admit(requests, slots)
        ends = [len(r.prompt) + next(order) - 1 for r in requests]
        state = engine.slots.state
        index = to_device_async(torch.tensor(list(slots[: len(requests)])), engine.device)
        state.sample_end.index_copy_(0, index, to_device_async(torch.tensor(ends), engine.device))

    engine.admit = admit_with_budgets


def random_model(dtype: torch.dtype) -> Whisper:
    """The architecture with random weights on the GPU (layer norms keep unit gains)."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Whisper(ModelDims.from_hf_config(ARCH)).to(dtype=dtype).eval()
    for p in model.parameters():
        if p.dim() >= 2:
            torch.nn.init.normal_(p, std=0.02)
    return model


def exact_options(tok: Tokenizer) -> DecodeOptions:
    """Greedy, no timestamps, no end-of-text: every window decodes exactly TOKENS tokens."""
    return DecodeOptions(
        language="en", without_timestamps=True, temperatures=(0.0,), sample_len=TOKENS,
        suppress_tokens=f"-1,{tok.eot}", compression_ratio_threshold=None, logprob_threshold=None,
        no_speech_threshold=None,
    )  # fmt: skip


def scheduler(model: Whisper, tok: Tokenizer, config: EngineConfig) -> Scheduler:
    options = exact_options(tok)
    engine = build_engine(model, step_spec(tok, options, [], model.dims.n_text_ctx), config)
    return Scheduler(engine, WindowPlanner(tok, options))


def ours(tok: Tokenizer, windows: int, config: EngineConfig, pageable: bool = False) -> dict:
    model = random_model(config.dtype)
    t0 = time.perf_counter()
    sched = scheduler(model, tok, config)
    engine = sched.engine
    capture = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    audio = (rng.standard_normal(16000 * 30) * 0.1).astype(np.float32)
    if not pageable:  # in the pinned arena, where `run`'s decode threads write every item on CUDA
        audio, samples = engine.enable_arena().allocate(audio.size), audio
        audio[:] = samples
    list(sched.run((f"warm{i}", audio) for i in range(min(engine.n_slots, 32))))  # warm-up
    if BUDGETS:
        budget_admissions(engine, BUDGETS)
    common.sync()
    sched.timings.clear(), engine.timings.clear()  # count the timed run only
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    records = [transcript_record(t) for t in sched.run((f"w{i}", audio) for i in range(windows))]
    common.sync()
    seconds = time.perf_counter() - t0
    # Where the wall time goes beyond encoder + steps: host seconds by stage, row-steps (a full
    # packing needs windows x 128), and when the stream first/last admitted and yielded.
    print("engine host seconds by stage:", {k: round(v, 3) for k, v in sched.timings.items()},
          "admission parts:", {k: round(v, 3) for k, v in engine.timings.items()}, flush=True)  # fmt: skip
    print("timeline (s):", {k: round(v - t0, 3) for k, v in sched.marks.items()}, "end", round(seconds, 3), flush=True)
    breakdown = _breakdown(engine, audio)
    n_tokens = [sum(len([t for t in s["tokens"] if t < tok.eot]) for s in r["segments"]) for r in records]
    # Text tokens only: an occasional timestamp-like or special token is not counted.
    assert len(records) == windows
    if BUDGETS:  # every window decoded exactly its budget (EOT suppressed, so no step is lost)
        sampled = sorted(sum(len(s["tokens"]) for s in r["segments"]) for r in records)
        expected = sorted(BUDGETS[k % len(BUDGETS)] for k in range(windows))
        assert sampled == expected, (sampled[:8], expected[:8])
    slots = engine.n_slots  # fewer than asked if allocating them ran out of memory
    del engine, sched, model
    torch.cuda.empty_cache()
    return {"windows_per_s": windows / seconds, "seconds": seconds, "capture_s": capture,
            "tokens_per_window": float(np.mean([len(s["tokens"]) for r in records for s in r["segments"]])),
            "text_tokens": float(np.mean(n_tokens)), "memory": common.peak_gib(), "slots": slots,
            **breakdown}  # fmt: skip


def _breakdown(engine, audio: np.ndarray) -> dict:
    """Device time of the two halves: the encoder per window, one decode step at full slots."""
    encoder, state = engine.encoder, engine.slots.state
    group = 32
    mel = encoder.features(torch.from_numpy(np.stack([audio] * group)).cuda()).to(encoder.dtype)
    with torch.no_grad():
        enc_ms = common.time_ms(lambda: encoder.encode(mel), 5) / group
    runner = engine.graphs
    # Every row running, mid-window (position mid_kv() of 4 + TOKENS), as in the run: after it all rows
    # are inert, and the cross kernel skips inert rows' reads (a step over them would time short).
    state.running.fill_(True)
    state.sample_begin.fill_(4)
    state.sample_end.fill_(engine.n_ctx)
    step_ms = {}
    for kv in runner.kv_buckets:
        state.positions.fill_(min(mid_kv(), kv - 12))  # the 11 replays below stay inside the bucket
        step_ms[kv] = common.time_ms(lambda kv=kv: runner.graphs[runner.buckets[-1], kv, False].replay(), 10)
    return {"encoder_ms_per_window": enc_ms, "step_ms_full_bucket": step_ms}


def peer(batch: int, windows: int, dtype: torch.dtype, whisper_generate: bool) -> dict:
    import transformers

    cfg = transformers.WhisperConfig(**ARCH, decoder_start_token_id=50258, eos_token_id=50257,
                                     pad_token_id=50257, bos_token_id=50257)  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda"):  # random init on the GPU: seconds instead of a minute on the host
        model = transformers.WhisperForConditionalGeneration(cfg).to(dtype=dtype).eval()
    feats = torch.randn(batch, 128, 3000, device="cuda", dtype=dtype)
    prompt = torch.tensor([[50258, 50259, 50360, 50364]] * batch, device="cuda")  # sot en transcribe notimestamps
    gc = model.generation_config
    gc.lang_to_id, gc.task_to_id = {"<|en|>": 50259}, {"transcribe": 50360, "translate": 50359}
    gc.no_timestamps_token_id, gc.is_multilingual, gc.forced_decoder_ids = 50364, True, None

    def one(tokens: int = TOKENS) -> torch.Tensor:
        if whisper_generate:  # WhisperForConditionalGeneration.generate, as users call it
            return model.generate(feats, language="en", task="transcribe", return_timestamps=False,
                                  max_new_tokens=tokens, min_new_tokens=tokens)  # fmt: skip
        # The plain GenerationMixin loop under it, without Whisper's own bookkeeping.
        return super(transformers.WhisperForConditionalGeneration, model).generate(
            input_features=feats, decoder_input_ids=prompt, max_new_tokens=tokens,
            min_new_tokens=tokens, do_sample=False, num_beams=1)  # fmt: skip

    rounds = max(1, windows // batch)
    # With --tokens-from a batch steps until its longest row has ended, as generate does with real
    # audio: its batches take the budgets in order, as the engine's admissions do.
    lengths = [max(BUDGETS[(r * batch + i) % len(BUDGETS)] for i in range(batch)) for r in range(rounds)] \
        if BUDGETS else [TOKENS] * rounds  # fmt: skip
    with torch.no_grad():
        out = one()  # warm-up
        # transformers may or may not return the forced prompt in front of the new tokens.
        new = out.shape[1] - (prompt.shape[1] if torch.equal(out[:, : prompt.shape[1]], prompt) else 0)
        assert new == TOKENS, (out.shape, new)
        common.sync()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for tokens in lengths:
            one(tokens)
        common.sync()
        seconds = time.perf_counter() - t0
    torch.cuda.empty_cache()
    name = ("Whisper generate" if whisper_generate else "GenerationMixin.generate") + f" bs {batch}"
    return {"windows_per_s": rounds * batch / seconds, "batch": batch, "memory": common.peak_gib(), "name": name}


def main(name: str = "W2", arch: str = "large-v3", tokens: int = 128, peer_batches: tuple[int, ...] = (256,),
         configs: tuple[str, ...] = ("flashinfer:fp8",)) -> None:  # fmt: skip
    global ARCH, TOKENS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer-from", type=Path, required=True)
    ap.add_argument("--name", default=name, help="the workload's name in the table and RESULTS.md")
    ap.add_argument("--arch", choices=sorted(ARCHS), default=arch)
    ap.add_argument("--tokens", type=int, default=tokens, help="generated tokens per window (EOT suppressed)")
    ap.add_argument("--tokens-from", type=Path, help="a Parquet with a text column: each window decodes as "
                    "many tokens as a row's transcript (+ end-of-text), rows cycled in admission order; "
                    "transformers' batches each decode their longest")
    ap.add_argument("--durations-from", type=Path, help="a Parquet with duration_s: report the RTFx implied "
                    "at those clips' mean duration")
    ap.add_argument("--windows", type=int, default=1024)
    ap.add_argument("--slots", type=int, default=0, help="0: as many as fit in 60%% of free memory (max 256)")
    ap.add_argument("--peer-batch", type=int, nargs="*", default=list(peer_batches))
    ap.add_argument("--peer-windows", type=int, default=256)
    ap.add_argument("--configs", nargs="*", default=list(configs),
                    help="attention:cross_kv[:encoder_precision[:invariant|variant]] to run, e.g. sdpa:auto "
                         "flashinfer:fp8 auto:auto:fp8 auto:auto:auto:variant (--no-batch-invariant; the default "
                         "on CUDA is batch-invariant)")
    ap.add_argument("--pageable-audio", action="store_true", help="hand the engine ordinary numpy audio "
                    "(the Python API's arrays), which admission packs on the host, instead of samples in "
                    "the pinned arena (what `run` decodes into on CUDA)")
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    ARCH, TOKENS = ARCHS[args.arch], args.tokens
    seconds_per_clip = _mean_duration(args.durations_from)
    dtype = torch.bfloat16
    dims = ModelDims.from_hf_config(ARCH)
    with tempfile.TemporaryDirectory() as tmp:
        tok = large_v3_tokenizer(args.tokenizer_from, Path(tmp))
    if args.tokens_from:
        BUDGETS[:] = transcript_budgets(args.tokens_from, tok)
        TOKENS = max(BUDGETS)
        print(f"--tokens-from: {len(BUDGETS)} transcripts, {np.mean(BUDGETS):.1f} tokens a window "
              f"(min {min(BUDGETS)}, max {TOKENS})", flush=True)  # fmt: skip
    results = []
    for config in args.configs:
        attention, cross_kv, encoder_precision, *flags = config.split(":") + ["auto"] * (config.count(":") < 2)
        options = EngineOptions(device="cuda", dtype="bfloat16", batch_size=args.slots or None, attention=attention,
                                cross_kv=cross_kv, encoder_precision=encoder_precision,
                                batch_invariant=common.batch_invariant(flags))  # fmt: skip
        r = ours(tok, args.windows, resolve_engine(options, dims).with_slots(dims), args.pageable_audio)
        r["config"] = config
        print(f"batchscribe {config}: {r}", flush=True)
        results.append(r)
    peers = [peer(b, args.peer_windows, dtype, w) for b in args.peer_batch for w in (True, False)]
    best = max(peers, key=lambda p: p["windows_per_s"]) if peers else None
    per_window = f"{np.mean(BUDGETS):.1f} tokens/window ({args.tokens_from.name}'s transcripts)" if BUDGETS \
        else f"{TOKENS} tokens/window"  # fmt: skip
    print(f"\n{args.name} {args.arch} random bf16, {per_window}, {common.hardware()}, commit {common.commit()}")
    print(f"{'system':<44}{'windows/s':>12}{'tokens/s':>12}{'peak mem':>12}")
    for r in results:
        print(f"{'batchscribe ' + r['config'] + ' (' + str(r['slots']) + ' slots)':<44}{r['windows_per_s']:>12.1f}"
              f"{r['windows_per_s'] * r['tokens_per_window']:>12.0f}{r['memory']:>12}")  # fmt: skip
    for p in peers:
        print(f"{p['name']:<44}{p['windows_per_s']:>12.1f}"
              f"{p['windows_per_s'] * TOKENS:>12.0f}{p['memory']:>12}")  # fmt: skip
    for r in results:
        print(f"{r['config']}: capture {r['capture_s']:.1f} s; tokens per window {r['tokens_per_window']:.1f}; "
              f"encoder {r['encoder_ms_per_window']:.2f} ms/window; decode step at {r['slots']} running rows, self-attention over ~{mid_kv()} positions, by kv bucket (ms): "
              + ", ".join(f"{k}: {v:.2f}" for k, v in r["step_ms_full_bucket"].items()))  # fmt: skip
        if best:
            ratio = r["windows_per_s"] / best["windows_per_s"]
            print(f"{r['config']}: ratio vs best transformers batch: {ratio:.2f}x")
            rtfx = f"; RTFx {r['windows_per_s'] * seconds_per_clip:,.0f} at {seconds_per_clip:.1f} s per clip" if seconds_per_clip else ""
            print(f"{r['config']}: {r['windows_per_s']:.1f} windows/s{rtfx}")
            if not args.no_append:
                common.append_result({
                    "workload": f"{args.name} {args.arch} random bf16, {per_window.replace('tokens/window', 'tok/window')}, attention:cross_kv[:encoder] {r['config']}",
                    "ours": f"{r['windows_per_s']:.1f} windows/s ({r['slots']} slots)",
                    "peer": "; ".join(f"transformers {p['name']}: {p['windows_per_s']:.1f} windows/s" for p in peers),
                    "ratio": f"{ratio:.2f}x", "memory": r["memory"], "capture": f"{r['capture_s']:.1f} s",
                    "notes": f"{args.windows} windows; encoder {r['encoder_ms_per_window']:.2f} ms/window, "
                    f"step {max(r['step_ms_full_bucket'].values()):.1f} ms at {r['slots']} running rows{rtfx}; "
                    f"audio {'pageable (--pageable-audio)' if args.pageable_audio else 'in the pinned arena'}",
                })  # fmt: skip


def _mean_duration(path: Path | None) -> float | None:
    if path is None:
        return None
    import pyarrow.parquet as pq

    return float(np.mean(pq.read_table(path, columns=["duration_s"]).column("duration_s").to_numpy()))


if __name__ == "__main__":
    main()
