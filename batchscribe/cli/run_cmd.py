"""`batchscribe run` and `batchscribe demo`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional

import typer

from batchscribe.audio.sources import SourceOptions
from batchscribe.cli.app import _Bar, _die, _handled, _prepare_report, _print_summary, _report_wer, app, err
from batchscribe.cli.options import (
    Attention, AudioColumnOpt, AudioMemory, BatchInvariant, BatchSize, CacheDir, ConditionOnPrevious, ConfigName, CrossKVOpt,
    CudaGraphs, Demo, Device, DTypeOpt, EncoderPrecision, FleetDevices, FormatOpt, Gpus, IdColumnOpt, InitialPrompt,
    Inputs, Language, Limit, MaxErrors, Model, NoTimestamps, NumShards, Output, Overwrite, Passthrough,
    PromptColumnOpt, Ray, RayWorkers, Report, RetryErrors, ShardIndex, ShardSize, ShowProgress, Split, TaskOpt,
    Temperature, TextColumnOpt, Vad, WordTimestamps, Workers,
)
from batchscribe.cli_text import DEFAULT_TEMPERATURES, RUN_EXAMPLES, demo_manifest, parse_temperatures, split_columns
from batchscribe.config import ConfigError, DecodeOptions, EngineOptions
from batchscribe.run import RunOptions, RunResult, run
from batchscribe.sink import ProgressCallback


@app.command("run", epilog=RUN_EXAMPLES, short_help="Transcribe datasets into JSONL/Parquet record shards.")
def run_command(
    inputs: Inputs = None, output: Output = None, demo: Demo = False, model: Model = "tiny.en",
    device: Device = "auto", dtype: DTypeOpt = None, batch_size: BatchSize = None, attention: Attention = "auto",
    cross_kv: CrossKVOpt = "auto", encoder_precision: EncoderPrecision = "auto", cuda_graphs: CudaGraphs = True,
    batch_invariant: BatchInvariant = None, audio_memory: AudioMemory = None,
    language: Language = None, task: TaskOpt = "transcribe", without_timestamps: NoTimestamps = False,
    word_timestamps: WordTimestamps = False, initial_prompt: InitialPrompt = None,
    condition_on_previous_text: ConditionOnPrevious = False, vad: Vad = False,
    temperature: Temperature = DEFAULT_TEMPERATURES, limit: Limit = None, fmt: FormatOpt = "jsonl",
    audio_column: AudioColumnOpt = "audio", id_column: IdColumnOpt = None,
    text_column: TextColumnOpt = None, prompt_column: PromptColumnOpt = None, passthrough: Passthrough = None,
    config_name: ConfigName = None,
    split: Split = None, num_shards: NumShards = 1, shard_index: ShardIndex = 0, workers: Workers = None,
    max_errors: MaxErrors = None, shard_size: ShardSize = 1000, overwrite: Overwrite = False,
    retry_errors: RetryErrors = False, cache_dir: CacheDir = None, progress: ShowProgress = True, report: Report = True,
    gpus: Gpus = None, fleet_devices: FleetDevices = None, ray: Ray = None, ray_workers: RayWorkers = None,
) -> None:
    """Transcribe datasets into JSONL/Parquet record shards (one verbose_json record per item).

    Rerunning into the same --output resumes: committed items are skipped, in-flight ones redone.
    """
    items = list(inputs or [])
    if demo:
        if items:
            _die("--demo transcribes the bundled clips; drop the inputs or drop --demo", 2)
        items = [str(demo_manifest())]
    if not items:
        _die("no input given; pass a Parquet file, folder, glob, manifest or dataset id (or --demo)", 2)
    if output is None:
        _die("missing --output/-o DIR: the directory to write records into", 2)
    if initial_prompt is not None and prompt_column is not None:
        _die("--initial-prompt and --prompt-column both give the prompt: pass one (put a shared prompt into "
             "the column's rows)", 2)
    with _handled():
        opts = RunOptions(
            model=model, cache_dir=cache_dir,
            engine=EngineOptions(device=device, dtype=dtype, batch_size=batch_size, cuda_graphs=cuda_graphs,
                                 attention=attention, cross_kv=cross_kv, encoder_precision=encoder_precision,
                                 batch_invariant=batch_invariant,
                                 audio_memory=None if audio_memory is None else int(audio_memory * 1e9)),
            decode=DecodeOptions(task=task, language=language, without_timestamps=without_timestamps,
                                 word_timestamps=word_timestamps, initial_prompt=initial_prompt,
                                 condition_on_previous_text=condition_on_previous_text, vad=vad,
                                 temperatures=parse_temperatures(temperature)),
            source=SourceOptions(audio_column=audio_column, id_column=id_column, text_column=text_column,
                                 prompt_column=prompt_column,
                                 passthrough=split_columns(passthrough), config=config_name, split=split,
                                 num_shards=num_shards, shard_index=shard_index, limit=limit),
            format=fmt, workers=workers, max_errors=max_errors, overwrite=overwrite, shard_size=shard_size,
            retry_errors=retry_errors,
        )  # fmt: skip
        runner = _runner(device, gpus, fleet_devices, ray, ray_workers)
    _execute(items, output, opts, progress, report, runner)


Runner = Callable[[list[str], Path, RunOptions, Optional[ProgressCallback]], RunResult]


def _runner(device: str, gpus: str | None, fleet_devices: str | None, ray: str | None,
            ray_workers: int | None) -> Runner:  # fmt: skip
    """The plain run, a --gpus run over child processes, or a run on Ray Data."""
    if ray is not None and (gpus or fleet_devices):
        raise ConfigError("--ray and --gpus both spread the run; pass one (--ray-workers sets Ray's GPU actors)")
    if ray_workers is not None and ray is None:
        raise ConfigError(f"--ray-workers {ray_workers} is for a run on Ray; add --ray (or --ray ADDRESS)")
    if ray is not None:
        from batchscribe.ray.driver import RayPlan, run_on_ray

        plan = RayPlan.parse(ray, ray_workers)
        return lambda items, output, o, bar: run_on_ray(items, output, o, plan, progress=bar)
    if gpus is None and fleet_devices is None:
        return lambda items, output, o, bar: run(items, output, o, progress=bar)
    from batchscribe.fleet.supervise import Supervisor, gpu_devices

    devices = fleet_devices.split(",") if fleet_devices else gpu_devices(gpus or "all", device)
    return lambda items, output, o, bar: Supervisor(items, output, o, devices, progress=bar).run()


def _execute(items: list[str], output: Path, opts: RunOptions, progress: bool, report: bool,
             runner: Runner | None = None) -> None:  # fmt: skip
    with _handled():
        if report:
            _prepare_report()
        result = _run_with_bar(items, output, opts, progress, runner or _runner("auto", None, None, None, None))
    _print_summary(result)
    if report:
        _report_wer(output)


def _run_with_bar(items: list[str], output: Path, opts: RunOptions, show: bool, runner: Runner) -> RunResult:
    if not show:
        return runner(items, output, opts, None)
    bar = _Bar(err)
    try:
        return runner(items, output, opts, bar)
    finally:
        bar.progress.stop()


@app.command("demo")
def demo_command(
    output: Annotated[Path, typer.Option("--output", "-o", help="Output directory.")] = Path("batchscribe-demo"),
    model: Annotated[str, typer.Option(help="Model alias or folder.")] = "tiny.en",
    device: Device = "auto",
) -> None:
    """Transcribe the bundled demo clips (same as `run --demo`)."""
    with _handled():
        opts = RunOptions(model=model, engine=EngineOptions(device=device))
    _execute([str(demo_manifest())], output, opts, progress=True, report=True)

