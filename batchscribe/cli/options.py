"""`run`'s options, declared here so that the command reads as a list of names."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

from batchscribe.attention.names import kernel_help

Format = Literal["jsonl", "parquet"]
Task = Literal["transcribe", "translate"]
DType = Literal["float32", "float16", "bfloat16"]
CrossKV = Literal["auto", "fp8", "int4"]
Precision = Literal["auto", "fp8"]

Inputs = Annotated[list[str] | None, typer.Argument(metavar="INPUT...",
    help="Parquet files/dirs/globs, HF dataset ids or folders, audio folders, JSONL/CSV manifests.", show_default=False)]
Output = Annotated[Path | None, typer.Option("--output", "-o", help="Output directory (created; reruns resume).",
                                             show_default=False)]
Demo = Annotated[bool, typer.Option("--demo", help="Transcribe the bundled public-domain demo clips.")]
Model = Annotated[str, typer.Option(help="Alias (tiny.en, base, ...), HF folder or CTranslate2 folder.")]
Device = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")]
DTypeOpt = Annotated[DType | None, typer.Option("--dtype", help="Default: float16 on CUDA, float32 on CPU.",
                                                show_default=False)]
BatchSize = Annotated[Optional[int], typer.Option(min=1, help="Decoder slots (windows decoded together); default: 16 on the "
                                                  "CPU, sized from free memory on CUDA (up to 256).")]
Attention = Annotated[str, typer.Option(help="Attention kernels: auto (on CUDA in float16/bfloat16: Triton "
                                        "self-attention, FlashInfer or Triton cross-attention, FlashInfer's FA3 in "
                                        "the encoder on Hopper GPUs; else SDPA), sdpa, flashinfer, or "
                                        "SELF/CROSS[/ENCODER] such as triton/flashinfer_hnd/fa3 (the encoder's is "
                                        f"sdpa unless named; {kernel_help()}).")]
CrossKVOpt = Annotated[CrossKV, typer.Option("--cross-kv", help="Cross-attention K/V storage: auto (the model's "
                                             "dtype), fp8 (e4m3: less cache memory per slot on the GPU and the "
                                             "CPU; on a GPU also fewer bytes read per decode step; may change some "
                                             "transcripts slightly) or int4 (4 bits and a scale per frame and head: "
                                             "half fp8's bytes; changes more transcripts, see docs/GPU_NOTES.md).")]
EncoderPrecision = Annotated[Precision, typer.Option(help="Encoder GEMMs: auto (the model's dtype) or fp8 (e4m3).")]
CudaGraphs = Annotated[bool, typer.Option("--cuda-graphs/--no-cuda-graphs", help="Replay the decode steps and the "
                                          "encoder as CUDA graphs (CUDA only); off: launch them eagerly.")]
AudioMemory = Annotated[Optional[float], typer.Option(
    min=0.001, metavar="GB", show_default="a quarter of this machine's memory, shared by --gpus children",
    help="Decoded audio the items being transcribed may hold, in GB (each keeps its whole audio in memory "
    "until its last window): past it, no new item starts until one finishes. The whole run's: --gpus children "
    "share it (each --ray actor holds its own). Lower it for hour-long files on a small machine; raise it if a "
    "run warns that the budget keeps decoder slots idle.")]
BatchInvariant = Annotated[Optional[bool], typer.Option(
    "--batch-invariant/--no-batch-invariant", show_default="on with CUDA, off on the CPU",
    help="Records that do not depend on which items run together: bit for bit the same from one GPU or many, "
    "--ray or --gpus, a resumed run or a fresh one (on one kind of device, with the same --batch-size). Windows "
    "are encoded in chunks of one size and every decode step runs over all the slots: no measurable cost on "
    "the H200; on the CPU decoding is ~15 % slower.")]
Language = Annotated[str | None, typer.Option(help="Language code or name (e.g. en, de, german); auto or unset: "
                                              "detect.", show_default=False)]
TaskOpt = Annotated[Task, typer.Option("--task", help="transcribe, or translate to English.")]
NoTimestamps = Annotated[bool, typer.Option("--without-timestamps", help="Decode without timestamp tokens.")]
InitialPrompt = Annotated[str | None, typer.Option("--initial-prompt", metavar="TEXT", show_default=False,
                          help="Text the first window is conditioned on (names, spelling, style).")]
ConditionOnPrevious = Annotated[bool, typer.Option("--condition-on-previous-text", help="Prompt each next window "
                               "with the item's text so far (openai's default; off: windows stay independent).")]
Vad = Annotated[bool, typer.Option("--vad", help="Decode only the speech Silero VAD finds, in chunks of at most "
                                   "30 s (needs pip install 'batchscribe[vad]').")]
WordTimestamps = Annotated[bool, typer.Option("--word-timestamps",
                                              help="Time each word (openai's cross-attention alignment).")]
Temperature = Annotated[str, typer.Option(help="Temperature fallback ladder, comma-separated; '0' decodes greedily "
                                          "with no fallback.")]
Limit = Annotated[int | None, typer.Option(min=1, help="Only the first N items (of this shard).", show_default=False)]
FormatOpt = Annotated[Format, typer.Option("--format", help="Record shard format.")]
AudioColumnOpt = Annotated[str, typer.Option(help="Column holding audio ({bytes, path} or a path).")]
IdColumnOpt = Annotated[str | None, typer.Option(help="Id column; default 'id' when present, else derived.",
                                              show_default=False)]
TextColumnOpt = Annotated[str | None, typer.Option(
    help="Reference text column, copied as 'reference' (default: the first of text, transcription, sentence, "
    "normalized_text present); enables a WER report.",
    show_default=False)]
PromptColumnOpt = Annotated[str | None, typer.Option(metavar="COL", help="Column holding each item's initial "
                            "prompt (names, domain terms); null or empty: no prompt for that item.", show_default=False)]
Passthrough = Annotated[list[str] | None, typer.Option(metavar="COLUMNS",
    help="Columns copied into every record (comma-separated, repeatable).", show_default=False)]
ConfigName = Annotated[str | None, typer.Option("--config", help="Hugging Face dataset config.", show_default=False)]
Split = Annotated[str | None, typer.Option(help="Hugging Face dataset split.", show_default=False)]
NumShards = Annotated[int, typer.Option(min=1, help="Split the input between this many machines.")]
ShardIndex = Annotated[int, typer.Option(min=0, help="Which part this machine does (0-based).")]
Workers = Annotated[int | None, typer.Option(min=0, help="Audio decoding processes (0: in-process); default: cores - 1 on "
                                             "the CPU, and on a GPU three quarters of the cores (at most 12) as "
                                             "threads.", show_default=False)]
MaxErrors = Annotated[int | None, typer.Option(min=0, help="Stop with exit code 1 once more items than this have failed "
                                               "(committed error records count; see --retry-errors).", show_default=False)]
ShardSize = Annotated[int, typer.Option(min=1, help="Records per shard file (a shard is also committed after 60 s).")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Delete earlier records in --output (every --shard-index part's) instead of resuming.")]
RetryErrors = Annotated[bool, typer.Option("--retry-errors", help="Transcribe again the items whose committed record is "
                                           "an error (after fixing them); each is replaced, once.")]
CacheDir = Annotated[Path | None, typer.Option(help="Where converted models are cached.", show_default=False)]
ShowProgress = Annotated[bool, typer.Option("--progress/--no-progress", help="Show the progress bar.")]
Report = Annotated[bool, typer.Option("--report/--no-report", help="Write a WER report (eval/) when records carry "
                                      "references.")]

Gpus = Annotated[str | None, typer.Option("--gpus", metavar="all|N|LIST", help="One engine per GPU of this host, "
                                          "each in a child process, into one --output (all, a count, or indices "
                                          "such as 0,1,3).", show_default=False)]
# Testing only: --gpus's children on these devices (e.g. cpu,cpu), so the planning and restart
# paths run end to end without CUDA. Hidden: the user-facing --gpus still refuses a host without CUDA.
FleetDevices = Annotated[str | None, typer.Option("--fleet-devices", hidden=True)]
# `--ray` alone means `--ray local`: cli.main() supplies the value (Typer has no optional values).
Ray = Annotated[str | None, typer.Option("--ray", metavar="[ADDRESS]", help="Run on Ray Data: --ray alone (or "
                                         "--ray local) starts a local cluster; --ray ADDRESS (or auto) joins one "
                                         "(needs the ray extra).", show_default=False)]
RayWorkers = Annotated[int | None, typer.Option("--ray-workers", min=1, help="Transcribing Ray actors (one engine each; "
                                                "one GPU each on a GPU cluster); default 1.", show_default=False)]
