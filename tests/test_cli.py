"""The command line: help, exit codes (0 ok, 1 too many item errors, 2 usage), the real demo run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import batchscribe.run
from batchscribe.cli import app, demo_manifest
from batchscribe.run_options import RunOptions
from tests.test_run import FakeTranscriber, needs_api, read_all

runner = CliRunner()


def use_fake(monkeypatch: pytest.MonkeyPatch, make: Callable[[RunOptions], FakeTranscriber]) -> None:
    """run() makes its transcriber with `make`, and checks no real model first."""
    monkeypatch.setattr(batchscribe.run, "check_model", lambda opts, prewarm=False: None)
    monkeypatch.setattr(batchscribe.run, "default_transcriber", lambda opts, files=None: make(opts))


@pytest.fixture
def fake_model(monkeypatch: pytest.MonkeyPatch) -> FakeTranscriber:
    # Narrow: exit-code mapping only. The real model runs in test_demo_subprocess_real_model.
    fake = FakeTranscriber()
    use_fake(monkeypatch, lambda opts: fake)
    return fake


def test_help_lists_commands_and_examples() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("run", "models", "demo", "export"):
        assert command in result.output
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "160"})
    assert result.exit_code == 0
    for text in ("--output", "--max-errors", "--num-shards", "--word-timestamps", "--initial-prompt", "Examples",
                 "--condition-on-previous-text",
                 "batchscribe run --demo -o demo-out"):
        assert text in result.output


def test_python_dash_m_help() -> None:
    proc = subprocess.run([sys.executable, "-m", "batchscribe", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "run" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["run", "--bogus-flag"], "No such option"),
    (["run", "x.parquet", "-o", "OUT", "--format", "xml"], "xml"),
    (["run", "-o", "OUT"], "no input given"),
    (["run", "missing-file.parquet", "-o", "OUT"], "missing-file.parquet"),
    (["run", "--demo"], "--output"),
    (["run", "--demo", "-o", "OUT", "--num-shards", "2", "--shard-index", "2"], "shard_index=2"),
    (["run", "--demo", "-o", "/dev/null/out"], "/dev/null/out is not writable"),
    (["run", "--demo", "-o", "OUT", "--passthrough", "speaker,text"], "would overwrite record fields"),
    # Out of range: the flag's own name, not the options object's field (num_shards=0 ...).
    (["run", "--demo", "-o", "OUT", "--num-shards", "0"], "Invalid value for '--num-shards'"),
    (["run", "--demo", "-o", "OUT", "--batch-size", "0"], "Invalid value for '--batch-size'"),
    (["run", "--demo", "-o", "OUT", "--audio-memory", "0"], "Invalid value for '--audio-memory'"),
    (["run", "--demo", "-o", "OUT", "--shard-size", "0"], "Invalid value for '--shard-size'"),
    (["run", "--demo", "-o", "OUT", "--limit", "-1"], "Invalid value for '--limit'"),
    # Not "every item already has a committed record": nothing was asked for.
    (["run", "--demo", "-o", "OUT", "--limit", "0"], "Invalid value for '--limit': Input should be greater than or equal to 1"),
    (["run", "--demo", "-o", "OUT", "--max-errors", "-1"], "Invalid value for '--max-errors'"),
])
def test_usage_errors_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_model: FakeTranscriber,
                             args: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert fake_model.seen == []


def test_missing_column_lists_available_ones(tmp_path: Path, fake_model: FakeTranscriber) -> None:
    table = pa.table({"key": ["a"], "sound": [b"RIFF"], "transcript": ["hi"]})
    pq.write_table(table, tmp_path / "t.parquet")
    result = runner.invoke(app, ["run", str(tmp_path / "t.parquet"), "-o", str(tmp_path / "o")],
                           env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert "'audio'" in result.output and "key, sound, transcript" in result.output
    assert "--audio-column" in result.output
    ok = runner.invoke(app, ["run", str(tmp_path / "t.parquet"), "-o", str(tmp_path / "o"),
                             "--audio-column", "sound", "--id-column", "key", "--no-progress"])
    assert ok.exit_code == 0, ok.output  # the item fails to decode, which is data, not a usage error
    assert read_all(tmp_path / "o")[0]["id"] == "a"


def test_too_many_item_errors_exit_1(tmp_path: Path, fake_model: FakeTranscriber) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for i in range(3):
        (bad / f"{i}.wav").write_bytes(b"not audio")
    args = ["run", str(bad), "-o", str(tmp_path / "o"), "--workers", "0", "--no-progress"]
    result = runner.invoke(app, [*args, "--max-errors", "1"], env={"COLUMNS": "300"})
    assert result.exit_code == 1 and "--max-errors 1" in result.output
    result = runner.invoke(app, [*args, "--max-errors", "3", "--no-report"])
    assert result.exit_code == 0, result.output  # 3 errors do not exceed 3; resumed, not redone
    assert sorted(r["id"] for r in read_all(tmp_path / "o")) == ["0", "1", "2"]


def test_changed_settings_exit_2(tmp_path: Path, fake_model: FakeTranscriber) -> None:
    args = ["run", "--demo", "-o", str(tmp_path / "o"), "--workers", "0", "--no-progress", "--no-report"]
    assert runner.invoke(app, args).exit_code == 0
    result = runner.invoke(app, [*args, "--language", "en"], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "--language: before null" in result.output and "--overwrite" in result.output
    assert runner.invoke(app, [*args, "--language", "en", "--overwrite"]).exit_code == 0


def test_engine_flags_reach_the_transcriber_as_one_options_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--device, --dtype, --batch-size, --attention, --cross-kv, --no-cuda-graphs, --audio-memory and
    --[no-]batch-invariant arrive together as RunOptions.engine, the EngineOptions the transcriber is built from."""
    from batchscribe.config import EngineOptions

    seen: list = []
    use_fake(monkeypatch, lambda opts: seen.append(opts) or FakeTranscriber())
    args = ["run", "--demo", "-o", str(tmp_path / "o"), "--workers", "0", "--no-progress", "--no-report",
            "--device", "cpu", "--dtype", "float32", "--batch-size", "3", "--attention", "sdpa", "--cross-kv", "fp8",
            "--no-cuda-graphs"]  # fmt: skip
    assert runner.invoke(app, args).exit_code == 0
    assert seen[0].engine == EngineOptions(device="cpu", dtype="float32", batch_size=3, cuda_graphs=False,
                                           attention="sdpa", cross_kv="fp8")  # fmt: skip
    assert runner.invoke(app, [*args[:-1], "--cuda-graphs", "--overwrite"]).exit_code == 0
    assert seen[1].engine.cuda_graphs and seen[1].engine.batch_invariant is None  # the device decides
    for flag, value in (("--batch-invariant", True), ("--no-batch-invariant", False)):
        assert runner.invoke(app, [*args, flag, "--overwrite"]).exit_code == 0
        assert seen[-1].engine.batch_invariant is value
    assert seen[0].engine.audio_memory is None  # the machine decides
    assert runner.invoke(app, [*args, "--audio-memory", "2.5", "--overwrite"]).exit_code == 0
    assert seen[-1].engine.audio_memory == 2_500_000_000


def test_demo_manifest_is_packaged() -> None:
    rows = [json.loads(x) for x in demo_manifest().read_text().splitlines()]
    assert len(rows) == 3
    total = sum((demo_manifest().parent / r["path"]).stat().st_size for r in rows)
    assert total < 1_000_000 and (demo_manifest().parent / "LICENSE").is_file()


def _loading_available() -> bool:
    try:
        import batchscribe.weights  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _loading_available(), reason="batchscribe.model.loading is not in the tree yet")
def test_unknown_model_exit_2_lists_aliases(tmp_path: Path) -> None:
    from batchscribe.weights.aliases import ALIASES

    result = runner.invoke(app, ["run", "--demo", "-o", str(tmp_path / "o"), "--model", "no-such-model"],
                           env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    assert "no-such-model" in result.output and "tiny.en" in result.output
    models = runner.invoke(app, ["models"], env={"COLUMNS": "200"})
    assert models.exit_code == 0 and all(name in models.output for name in ALIASES)


@needs_api
def test_demo_subprocess_real_model(tmp_path: Path, tiny_en_dir: Path) -> None:
    from openai.types.audio import TranscriptionVerbose

    out = tmp_path / "demo-out"
    cmd = [sys.executable, "-m", "batchscribe", "run", "--demo", "-o", str(out), "--model", str(tiny_en_dir),
           "--device", "cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    records = read_all(out)
    assert len(records) == 3
    for r in records:
        TranscriptionVerbose.model_validate(r)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] == 3 and summary["rtfx"] > 0
    assert (out / "eval").is_dir() and "WER" in proc.stderr
    # Start-up apart from transcription: the summary.json figures, as printed.
    assert f"of which {summary['model_load_seconds']:.1f} s start-up" in proc.stderr
    assert f"({summary['rtfx_excluding_model_load']:.1f} after start-up)" in proc.stderr
    # The same command again: nothing left, said so, the records untouched, the model not loaded.
    shards = {p.name: p.read_bytes() for p in out.glob("records-*")}
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "nothing left to do" in again.stderr and "0 new, 3 already done" in again.stderr
    assert {p.name: p.read_bytes() for p in out.glob("records-*")} == shards
    rerun = json.loads((out / "summary.json").read_text())
    assert rerun["this_run"]["nothing_left"] and rerun["model_load_seconds"] == 0 and rerun["ok"] == 3
    assert rerun["model"] == summary["model"]  # how the records were made is kept
    # The README's example record is this run's (it had a compression ratio from before openai's
    # stripped-text rule): text, tokens and ratio exact, the float32 sums to the CPU's rounding.
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    shown = json.loads(readme.split("From `batchscribe run --demo`:\n\n```json\n", 1)[1].split("```", 1)[0])
    real = next(r for r in records if r["id"] == shown["id"])
    for seg in shown["segments"]:
        seg.update({k: pytest.approx(seg[k], abs=1e-4) for k in ("avg_logprob", "no_speech_prob")})
    assert real == shown


def test_eval_command_matches_jiwer(tmp_path: Path) -> None:
    import jiwer

    from batchscribe.output.writers import ShardWriter

    records = [
        {"id": "a", "text": " The cat sat.", "language": "english", "duration": 1.0, "segments": [],
         "reference": "THE CAT SAT ON THE MAT"},
        {"id": "b", "text": " hello world", "language": "english", "duration": 1.0, "segments": [],
         "reference": "HELLO WORD"},
        {"id": "c", "error": "c: broken", "duration": None, "reference": "GONE AWAY"},
    ]
    (tmp_path / "run").mkdir()
    w = ShardWriter(tmp_path / "run", "jsonl")
    for r in records:
        w.add(r)
    w.flush()
    result = runner.invoke(app, ["eval", str(tmp_path / "run"), "-o", str(tmp_path / "rep"), "--normalizer",
                                 "basic", "--bootstrap", "0"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    corpus = json.loads((tmp_path / "rep" / "report.json").read_text())["corpus"]
    # An error record counts as an empty hypothesis: all its reference words are deletions.
    expected = jiwer.wer(["the cat sat on the mat", "hello word", "gone away"], ["the cat sat", "hello world", ""])
    assert corpus["wer"] == pytest.approx(expected)
    missing = runner.invoke(app, ["eval", str(tmp_path / "nothing"), "-o", str(tmp_path / "rep2")])
    assert missing.exit_code == 2


def test_unavailable_attention_kernel_is_a_usage_error(tmp_path: Path) -> None:
    """--attention flashinfer where it cannot run: exit 2 with the fix, brackets printed as is."""
    result = runner.invoke(app, ["run", "--demo", "-o", str(tmp_path / "o"), "--device", "cpu", "--dtype", "float16",
                                 "--attention", "flashinfer", "--no-progress"], env={"COLUMNS": "300"})  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "needs FlashInfer on a CUDA device" in result.output and "batchscribe[gpu]" in result.output


def _timed_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess]:
    import os
    import time

    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "batchscribe", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "400", **(env or {})})  # fmt: skip
    return time.perf_counter() - start, proc


@pytest.mark.parametrize("model", ["./modles/tiny.en", "models/tiny.en", "~/no-such-model-folder"])
def test_mistyped_model_path_fails_fast_naming_it(tmp_path: Path, model: str) -> None:
    """No hub, no retries: the path is named with the folder that lacks it, and the fix."""
    (tmp_path / "models").mkdir()
    seconds, proc = _timed_cli(["run", "--demo", "-o", "out", "--model", model, "--no-progress"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    # The process's start-up (torch's import among it) is inside the bound; the retries this
    # replaced took ~29 s. Loose enough for a loaded 2-core CI machine.
    assert seconds < 10.0, seconds
    assert f"model path {model!r} does not exist" in proc.stderr and "pass an alias" in proc.stderr
    assert "Traceback" not in proc.stderr and "Name or service" not in proc.stderr


def test_unreachable_hub_id_fails_fast_naming_the_model_and_fix(tmp_path: Path) -> None:
    import socket

    silent = socket.socket()  # accepts and never answers: a black-holed hub
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{silent.getsockname()[1]}", "HF_HUB_CACHE": str(tmp_path / "hub")}
    try:
        seconds, proc = _timed_cli(["run", "--demo", "-o", "out", "--model", "someone/whisper-x", "--no-progress"],
                                   tmp_path, env)  # fmt: skip
    finally:
        silent.close()
    assert proc.returncode == 2, proc.stderr
    assert seconds < 12.0, seconds  # start-up plus one 3 s try (huggingface_hub alone: > 120 s)
    assert "'someone/whisper-x'" in proc.stderr and "unreachable" in proc.stderr
    assert "hf download someone/whisper-x" in proc.stderr


def _help_at_80(args: list[str]) -> str:
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", [[], ["run"], ["demo"], ["eval"], ["models"]])
def test_help_is_legible_at_80_columns(command: list[str]) -> None:
    """Every flag of the command, whole, on lines that fit; no '<bool>' metavar, nothing cut."""
    import typer.main

    from batchscribe.attention.names import kernel_help

    text = _help_at_80(command)
    cmd = typer.main.get_command(app)
    if command:
        cmd = cmd.commands[command[0]]  # type: ignore[attr-defined]
    # typer vendors its own click: options are told apart by their kind, not by click's class.
    # (a hidden option, --fleet-devices, is a testing hook and not in the help)
    flags = [o for p in cmd.params if p.param_type_name == "option" and not getattr(p, "hidden", False)
             for o in (*p.opts, *p.secondary_opts)]
    assert flags and all(re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text) for f in flags), (flags, text)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text and "<bool>" not in text and "[bold]" not in text
    if command == ["run"]:
        for name in re.findall(r"[a-z_][a-z_0-9]*", kernel_help().split("(", 1)[-1]):
            assert re.search(rf"(?<![\w-]){name}(?![\w-])", text), name  # every kernel name whole
    if not command:
        for name in ("run", "demo", "eval", "models"):
            assert re.search(rf"^  {name} +\S", text, re.M)


def test_version_flag() -> None:
    from batchscribe.version import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"batchscribe {__version__}"
    proc = subprocess.run([sys.executable, "-m", "batchscribe", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == f"batchscribe {__version__}"


def test_models_listing_at_80_columns_copies_whole(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Package names and hub ids uncut; a missing package's pip command on one line of its own."""
    from batchscribe.weights import aliases

    missing = aliases.ALIASES["base"]
    monkeypatch.setattr(aliases, "package_dirs", lambda alias: None if alias is missing else [tmp_path])
    cached = tmp_path / "cache" / "converted" / "some-model"
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")
    result = runner.invoke(app, ["models", "--cache-dir", str(tmp_path / "cache")], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    # Only the pip command and paths may run past 80 (soft-wrapped by the terminal, copied whole).
    assert all(len(line) <= 80 for line in lines if missing.pip_install not in line and str(tmp_path) not in line)
    assert "…" not in result.output
    assert [line.strip() for line in lines].count(missing.pip_install) == 1
    assert [line.strip() for line in lines].count(str(cached)) == 1
    for alias in aliases.ALIASES.values():
        assert alias.hub_id in result.output and all(p.distribution in result.output for p in alias.packages)
    assert aliases.ALIASES["tiny.en"].pip_install not in result.output  # installed: no hint


def test_audiofolder_reference_column_is_detected_and_named(tmp_path: Path, fake_model: FakeTranscriber) -> None:
    """metadata.csv with `transcription` (FLEURS' name): records carry it as the reference, and
    stderr says which column it was, once."""
    folder = tmp_path / "clips"
    folder.mkdir()
    rows = [json.loads(x) for x in demo_manifest().read_text().splitlines()]
    lines = ["file_name,transcription"]
    for r in rows:
        (folder / r["path"]).write_bytes((demo_manifest().parent / r["path"]).read_bytes())
        lines.append(f"{r['path']},{r['text']}")
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n")
    result = runner.invoke(app, ["run", str(folder), "-o", str(tmp_path / "o"), "--workers", "0", "--no-progress",
                                 "--no-report"], env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.count("note: reference text: column 'transcription'") == 1
    assert {r["id"]: r["reference"] for r in read_all(tmp_path / "o")} == {r["id"]: r["text"] for r in rows}


def test_language_auto_is_detect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list = []
    use_fake(monkeypatch, lambda opts: seen.append(opts) or FakeTranscriber())
    args = ["run", "--demo", "-o", str(tmp_path / "o"), "--workers", "0", "--no-progress", "--no-report"]
    assert runner.invoke(app, [*args, "--language", "auto"]).exit_code == 0
    assert seen[0].decode.language is None
    # The same settings as no --language: the rerun resumes instead of being refused.
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output


@needs_api
def test_language_the_model_cannot_do_exits_2_with_the_fix(tmp_path: Path, tiny_en_dir: Path) -> None:
    """tiny.en is English-only: `--language de` is a usage error with the ways out, not a traceback;
    `--language auto` transcribes (the real model)."""
    base = ["run", "--demo", "--model", str(tiny_en_dir), "--device", "cpu", "--workers", "0", "--no-progress",
            "--no-report"]  # fmt: skip
    result = runner.invoke(app, [*base, "-o", str(tmp_path / "de"), "--language", "de"], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert "language 'de' (german) cannot be decoded by an English-only model" in result.output
    assert "'auto'" in result.output and "multilingual model" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    auto = runner.invoke(app, [*base, "-o", str(tmp_path / "auto"), "--language", "auto"])
    assert auto.exit_code == 0, auto.output
    records = read_all(tmp_path / "auto")
    from tests.engine.helpers import openai_wer

    refs = {r["id"]: r["text"] for r in map(json.loads, demo_manifest().read_text().splitlines())}
    assert sorted(r["id"] for r in records) == sorted(refs) and all(r["language"] == "english" for r in records)
    assert all(openai_wer(refs[r["id"]], r["text"]) < 0.25 for r in records)


@pytest.mark.parametrize("seconds, text", [(0, "0.0 s"), (18.44, "18.4 s"), (59.9, "59.9 s"), (60, "1.0 min"),
                                           (768, "12.8 min"), (3600, "1.00 h"), (10440, "2.90 h")])
def test_audio_lengths_read_at_their_size(seconds: float, text: str) -> None:
    from batchscribe.cli_text import audio_length

    assert audio_length(seconds) == text


def test_progress_line_counts_items_and_audio_in_readable_units(tmp_path: Path) -> None:
    from rich.console import Console

    from batchscribe.cli import _Bar
    from batchscribe.sink import RunProgress

    with open(tmp_path / "bar.txt", "w") as sink:
        bar = _Bar(Console(file=sink, width=200))
        bar(RunProgress(done=5, ok=5, errors=0, skipped=0, audio_seconds=18.4, elapsed_s=2.0, total=None))
        assert bar.progress.tasks[0].fields["count"] == "5 items"
        assert bar.progress.tasks[0].fields["audio"] == "18.4 s"
        bar(RunProgress(done=5, ok=5, errors=0, skipped=0, audio_seconds=900.0, elapsed_s=2.0, total=9, startup_s=1.5))
        assert bar.progress.tasks[0].fields["count"] == "5/9" and bar.progress.tasks[0].fields["audio"] == "15.0 min"
        assert bar.progress.tasks[0].fields["rtfx"] == pytest.approx(900.0 / 0.5)  # start-up apart
        bar.progress.stop()
    assert "5/9" in (tmp_path / "bar.txt").read_text() and "15.0 min audio" in (tmp_path / "bar.txt").read_text()


def test_save_to_disk_records_are_named_by_their_audio_files(tmp_path: Path, fake_model: FakeTranscriber) -> None:
    """A datasets save_to_disk folder without an id column: record ids are the audio files' names
    (as for a folder of the same files), not train:0, train:1, ..."""
    datasets = pytest.importorskip("datasets")
    rows = [json.loads(x) for x in demo_manifest().read_text().splitlines()]
    paths = [str(demo_manifest().parent / r["path"]) for r in rows]
    ds = datasets.Dataset.from_dict({"audio": paths, "text": [r["text"] for r in rows]})
    ds.cast_column("audio", datasets.Audio()).save_to_disk(str(tmp_path / "saved"))
    result = runner.invoke(app, ["run", str(tmp_path / "saved"), "-o", str(tmp_path / "o"), "--workers", "0",
                                 "--no-progress", "--no-report"], env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert sorted(r["id"] for r in read_all(tmp_path / "o")) == sorted(Path(p).stem for p in paths)


def test_ray_without_an_address_means_a_local_cluster() -> None:
    from batchscribe.cli import optional_ray_address

    assert optional_ray_address(["run", "x", "--ray"]) == ["run", "x", "--ray", "local"]
    assert optional_ray_address(["run", "x", "--ray", "--ray-workers", "2"]) == [
        "run", "x", "--ray", "local", "--ray-workers", "2"]
    assert optional_ray_address(["run", "x", "--ray", "10.0.0.1:6379"]) == ["run", "x", "--ray", "10.0.0.1:6379"]


def test_the_reports_workers_fork_with_the_cli_and_the_scoring_code_imported(tmp_path: Path) -> None:
    """`run` starts the scoring workers' forkserver before the run: a worker forked after it has
    batchscribe.cli (which the console script re-runs in every worker) and the scoring code
    imported already, without importing anything itself. In a fresh process: the forkserver is
    one a process, and the test process's may have started with other preloads."""
    import textwrap

    script = tmp_path / "check.py"
    script.write_text(textwrap.dedent("""
        import sys
        from concurrent.futures import ProcessPoolExecutor

        def loaded(_):
            return sorted(m for m in ("batchscribe.cli", "batchscribe.eval.report") if m in sys.modules)

        if __name__ == "__main__":
            from batchscribe.cli.app import _prepare_report
            from batchscribe.process_context import process_context

            _prepare_report()
            with ProcessPoolExecutor(1, mp_context=process_context(["batchscribe.eval.report"])) as pool:
                print(pool.submit(loaded, 0).result())
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['batchscribe.cli', 'batchscribe.eval.report']"


def test_a_run_that_timed_no_audio_shows_no_rate(tmp_path: Path, fake_model: FakeTranscriber) -> None:
    """--retry-errors on an input that is still missing decodes no audio: its RTFx is undefined,
    shown as "-" (as with nothing left to do) and null in summary.json, not 0.0."""
    manifest = tmp_path / "in.jsonl"
    manifest.write_text(json.dumps({"id": "gone", "path": str(tmp_path / "gone.flac")}) + "\n")
    args = ["run", str(manifest), "-o", str(tmp_path / "o"), "--workers", "0", "--no-progress", "--no-report"]
    assert runner.invoke(app, args).exit_code == 0
    result = runner.invoke(app, [*args, "--retry-errors"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["this_run"]["retried_errors"] == 1 and summary["this_run"]["audio_hours"] == 0
    assert summary["rtfx"] is None and summary["rtfx_excluding_model_load"] is None
    assert re.search(r"^RTFx +- *$", result.output, re.MULTILINE), result.output


@pytest.mark.parametrize("cross_kv,cache", [("fp8", "float8_e4m3fn"), ("int4", "int4")])
def test_cross_kv_runs_on_the_cpu_as_its_help_says(tmp_path: Path, tiny_en_dir: Path, cross_kv: str, cache: str) -> None:
    """--cross-kv fp8 and int4 are not GPU-only (fp8's help said "GPU"): on the CPU the cache is fp8
    (SDPA reads it upcast) or int4 (dequantised)."""
    help_text = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "300"}).output
    help_kv = " ".join(help_text[help_text.index("--cross-kv"):].split("--encoder-precision")[0].split())
    assert "GPU and the CPU" in help_kv and "GPU)" not in help_kv and "int4 (4 bits" in help_kv
    out = tmp_path / "o"
    result = runner.invoke(app, ["run", "--demo", "-o", str(out), "--model", str(tiny_en_dir), "--device", "cpu",
                                 "--cross-kv", cross_kv, "--limit", "1", "--workers", "0", "--no-progress",
                                 "--no-report"])  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"]["device"] == "cpu" and summary["ok"] == 1
    assert summary["model"]["info"]["attention"].endswith(f"/{cache}")


def test_warnings_carry_the_warning_prefix(tmp_path: Path, fake_model: FakeTranscriber) -> None:
    """A warning logged by the package (here: a reference .txt that is not UTF-8) reaches stderr as
    'warning: ...', as the CLI's own warnings do, once; notes stay 'note: ...'."""
    import shutil

    from batchscribe.cli import demo_manifest

    clips = tmp_path / "clips"
    clips.mkdir()
    shutil.copy(next(demo_manifest().parent.glob("*.flac")), clips / "a.flac")
    (clips / "a.txt").write_bytes("caf\xe9".encode("latin-1"))
    result = runner.invoke(app, ["run", str(clips), "-o", str(tmp_path / "o"), "--workers", "0", "--no-progress",
                                 "--no-report"], env={"COLUMNS": "400"})  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "reference transcript not read" in line]
    assert len(lines) == 1 and lines[0].startswith(f"warning: {clips / 'a.txt'}: reference transcript not read")


def test_export_and_eval_say_when_a_run_is_still_writing(tmp_path: Path) -> None:
    """Reading a folder a run still writes gives what is committed so far: export and eval say so,
    naming the live run; once it has finished they do not. A folder that was never a run's gets no
    lock file from the check (found by QA: both read a live folder silently)."""
    import os

    from batchscribe.output.lock import CLAIMS_LOCK, lock_output
    from batchscribe.run import run
    from tests.test_run import make_manifest

    manifest, _ = make_manifest(tmp_path)
    out = tmp_path / "out"
    run([str(manifest)], out, RunOptions(workers=0), lambda _: FakeTranscriber())
    commands = (["export", str(out), "-f", "txt", "-o", str(tmp_path / "txt")],
                ["eval", str(out), "-o", str(tmp_path / "rep"), "--bootstrap", "0"])  # fmt: skip
    with lock_output(out, "records-part00001of00002"):  # another part, alive
        for args in commands:
            said = runner.invoke(app, args, env={"COLUMNS": "300"}).output
            assert f"warning: a batchscribe run (pid {os.getpid()} on " in said and "is still writing into" in said, said
    for args in commands:
        assert "still writing" not in runner.invoke(app, args, env={"COLUMNS": "300"}).output
    plain = tmp_path / "shards"
    plain.mkdir()
    (plain / "a.jsonl").write_text(json.dumps({"id": "a", "text": " x", "reference": "x"}) + "\n")
    runner.invoke(app, ["eval", str(plain), "-o", str(tmp_path / "rep3"), "--bootstrap", "0"])
    assert not (plain / CLAIMS_LOCK).exists()


def test_a_ctrl_c_while_the_cli_loads_is_one_line_and_exit_130() -> None:
    """The console script imports the CLI inside its entry point (batchscribe/__main__.py): a
    KeyboardInterrupt there printed a traceback of half-imported modules and exited by signal."""
    code = ("import builtins, sys\n"
            "real = builtins.__import__\n"
            "def interrupted(name, *a, **k):\n"
            "    if name == 'batchscribe.cli':\n"
            "        raise KeyboardInterrupt\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = interrupted\n"
            "sys.argv = ['batchscribe', 'run', '--demo', '-o', 'never']\n"
            "from batchscribe.__main__ import main\n"
            "main()\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (130, "error: interrupted while starting: nothing was read or written; "
                                                   "rerun the same command to resume\n")


@pytest.mark.parametrize("where", ["parsing", "summary"])
def test_a_ctrl_c_outside_the_commands_own_handling_is_said_once(where: str, tmp_path: Path, fake_model: FakeTranscriber,
                                                                 monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # fmt: skip
    """Typer makes a KeyboardInterrupt outside our handling exit 130 with nothing printed: while
    it parses the arguments (a Ctrl-C ~0.4 s after start, as it imports pydantic) or after the run
    (its summary). The entry point now says which: nothing written yet, or the records committed."""
    import typer.core

    import batchscribe.cli
    import batchscribe.cli.run_cmd

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "parsing":
        monkeypatch.setattr(typer.core.TyperCommand, "parse_args", interrupted)
    else:
        monkeypatch.setattr(batchscribe.cli.run_cmd, "_print_summary", interrupted)
    out = tmp_path / "o"
    monkeypatch.setattr(sys, "argv", ["batchscribe", "run", "--demo", "-o", str(out), "--workers", "0",
                                      "--no-progress", "--no-report"])  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        batchscribe.cli.main()
    assert exit_info.value.code == 130
    said = capsys.readouterr().err
    if where == "parsing":
        assert said == "error: interrupted while starting: nothing was read or written; rerun the same command to resume\n"
        assert not out.exists()
    else:
        assert said.count("error: interrupted") == 1
        assert "error: interrupted: the records finished so far are committed; rerun the same command to resume" in said
        assert len(read_all(out)) == 3


def test_a_ctrl_c_while_the_report_is_scored_names_eval(tmp_path: Path, fake_model: FakeTranscriber,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """After the summary every record is committed; an interrupted report said nothing (Typer's
    'Aborted.', exit 1). Now it says so, and which command writes the report."""
    import batchscribe.eval.report

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(batchscribe.eval.report, "evaluate", interrupted)
    out = tmp_path / "o"
    result = runner.invoke(app, ["run", "--demo", "-o", str(out), "--workers", "0", "--no-progress"],
                           env={"COLUMNS": "400"})  # fmt: skip
    assert result.exit_code == 130, result.output
    assert ("error: interrupted while scoring: every record is committed; rerun the same command to resume (it "
            f"writes the WER report), or run `batchscribe eval {out}`") in result.output
    assert len(read_all(out)) == 3


def test_a_part_that_finishes_while_another_writes_leaves_the_report_to_it(tmp_path: Path,
                                                                           fake_model: FakeTranscriber) -> None:  # fmt: skip
    """`--num-shards 2 --shard-index 0` finishing first scored the folder as it stood: a report
    of half the items, written as if whole. It now says who still writes and leaves the report to
    the last part (or to `batchscribe eval`); the last part writes it over every item."""
    import os

    from batchscribe.output.lock import lock_output
    from batchscribe.output.resume import output_prefix

    out = tmp_path / "o"
    args = ["run", "--demo", "-o", str(out), "--workers", "0", "--no-progress", "--num-shards", "2"]
    with lock_output(out, output_prefix(2, 1)):  # part 1 of 2, alive
        first = runner.invoke(app, [*args, "--shard-index", "0"], env={"COLUMNS": "400"})
    assert first.exit_code == 0, first.output
    assert f"note: no WER report yet: 1 other run(s) still writing into {out} (pid {os.getpid()} on " in first.output
    assert not (out / "eval").exists()
    last = runner.invoke(app, [*args, "--shard-index", "1"], env={"COLUMNS": "400"})
    assert last.exit_code == 0, last.output
    assert "over 3 items" in last.output and (out / "eval" / "report.md").is_file()
