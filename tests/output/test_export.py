"""`batchscribe export` (output/export.py, cli/export_cmd.py): one file per committed ok record,
equal to openai-whisper's own writers (whisper.utils.get_writer) on the same records; safe, unique
and stable names; idempotent reruns; nothing partial after a failure; clear usage errors."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import batchscribe.output.writers as writers
from batchscribe.cli import app
from batchscribe.output.export import ExportError, export_run, file_stem, file_stems
from batchscribe.output.resume import open_output, output_prefix
from batchscribe.output.subtitles import SUBTITLE_FORMATS
from batchscribe.output.writers import ShardWriter
from tests.output.sample_records import error_record, ok_record

whisper_utils = pytest.importorskip("whisper.utils")
runner = CliRunner()

ODD_IDS = ["plain-1", "dir/sub/clip.flac", "../escape", "CON", "Case", "case", "", " spaced out ", "ünïcödé",
           "x" * 300, ".hidden", "tail."]


def _record(i: int, item_id: str) -> dict[str, Any]:
    r = ok_record(i)
    r["id"] = item_id
    r["segments"] = r["segments"] + [{**r["segments"][0], "id": 1, "start": 2.5 + i, "end": 3725.25 + i,
                                      "text": " --> second\tline "}]
    return r


def _write_run(folder: Path, records: list[dict[str, Any]], fmt: str = "jsonl", num_shards: int = 1,
               shard_index: int = 0) -> None:
    prefix = output_prefix(num_shards, shard_index)
    state = open_output(folder, fmt, prefix)  # type: ignore[arg-type]
    writer = ShardWriter(folder, fmt, prefix, shard_size=3, on_commit=state.on_commit)  # type: ignore[arg-type]
    for r in records:
        writer.add(r)
    writer.flush()


def _openai(record: dict[str, Any], fmt: str) -> bytes:
    out = io.StringIO()
    whisper_utils.get_writer(fmt, ".").write_result(
        record, out, {"max_line_width": None, "max_line_count": None, "highlight_words": False})
    return out.getvalue().encode("utf-8")


@pytest.mark.parametrize("shard_fmt", ["jsonl", "parquet"])
@pytest.mark.parametrize("fmt", SUBTITLE_FORMATS)
def test_files_equal_openai_whisper_writers(tmp_path: Path, fmt: str, shard_fmt: str) -> None:
    records = [_record(i, item_id) for i, item_id in enumerate(ODD_IDS)]
    # Two writers of a sharded run, and error records among the ok ones.
    _write_run(tmp_path / "run", records[:6] + [error_record(0)], shard_fmt, 2, 0)
    _write_run(tmp_path / "run", records[6:] + [error_record(1)], shard_fmt, 2, 1)
    result = export_run(tmp_path / "run", fmt, tmp_path / "subs")
    assert (result.written, result.unchanged, result.errors) == (len(records), 0, 2)
    stems = file_stems(ODD_IDS)
    files = sorted(p.name for p in (tmp_path / "subs").iterdir())
    assert files == sorted(f"{stems[i]}.{fmt}" for i in ODD_IDS)  # one per ok record, nothing else
    for r in records:
        assert (tmp_path / "subs" / f"{stems[r['id']]}.{fmt}").read_bytes() == _openai(r, fmt), r["id"]


def test_names_are_safe_unique_and_stable() -> None:
    stems = file_stems(ODD_IDS)
    assert len({s.casefold() for s in stems.values()}) == len(ODD_IDS)  # unique, even ignoring case
    assert stems["plain-1"] == "plain-1"  # a portable id is kept as it is
    for item_id, stem in stems.items():
        assert stem == Path(stem).name and not stem.startswith(".") and 0 < len(stem.encode()) <= 120, item_id
        assert stem.split(".")[0].lower() != "con"
    assert stems == file_stems(list(reversed(ODD_IDS)))  # the same names whatever the order
    # A plain id can never take a hashed name's place: ids that look hashed are hashed themselves.
    hashed = file_stem("dir/x")
    assert file_stem(hashed) != hashed


def test_rerun_is_idempotent(tmp_path: Path) -> None:
    _write_run(tmp_path / "run", [_record(i, f"u{i}") for i in range(5)])
    first = export_run(tmp_path / "run", "srt", tmp_path / "subs")
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "subs").iterdir()}
    again = export_run(tmp_path / "run", "srt", tmp_path / "subs")
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "subs").iterdir()}
    assert (first.written, again.written, again.unchanged) == (5, 0, 5)
    assert after == before  # same bytes, not even rewritten


def test_a_failure_leaves_nothing_partial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_run(tmp_path / "run", [_record(i, f"u{i}") for i in range(5)])
    real_replace, calls = writers.os.replace, []  # export writes through writers.write_atomic

    def failing_replace(src: Any, dst: Any) -> None:
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(writers.os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space"):
        export_run(tmp_path / "run", "vtt", tmp_path / "subs")
    names = sorted(p.name for p in (tmp_path / "subs").iterdir())
    assert names == ["u0.vtt", "u1.vtt"]  # the finished files, whole; no temp file, no partial third
    monkeypatch.setattr(writers.os, "replace", real_replace)
    result = export_run(tmp_path / "run", "vtt", tmp_path / "subs")
    assert (result.written, result.unchanged) == (3, 2)
    for i in range(5):
        assert (tmp_path / "subs" / f"u{i}.vtt").read_bytes() == _openai(_record(i, f"u{i}"), "vtt")


def test_a_damaged_shard_is_skipped_and_named(tmp_path: Path) -> None:
    _write_run(tmp_path / "run", [_record(i, f"u{i}") for i in range(6)])  # two shards of 3
    (tmp_path / "run" / "records-00001.jsonl").write_text('{"id": "u3"}\n{"trunc')
    result = export_run(tmp_path / "run", "txt", tmp_path / "subs")
    assert result.bad_shards == ("records-00001.jsonl",) and result.written == 3
    assert "1 damaged shard(s) skipped" in result.summary()
    assert not (tmp_path / "run" / "records-00001.jsonl.bad").exists()  # export only reads the run folder


def test_cli_summary_and_usage_errors(tmp_path: Path) -> None:
    _write_run(tmp_path / "run", [_record(0, "a"), error_record(1)])
    ok = runner.invoke(app, ["export", str(tmp_path / "run"), "--format", "tsv", "-o", str(tmp_path / "subs")],
                       env={"COLUMNS": "300"})
    assert ok.exit_code == 0, ok.output
    assert "exported 1 tsv file to" in ok.output and "1 error record skipped" in ok.output
    missing = runner.invoke(app, ["export", str(tmp_path / "nope"), "--format", "srt", "-o", str(tmp_path / "s")],
                            env={"COLUMNS": "300"})
    assert missing.exit_code == 2 and "no such folder" in missing.output
    (tmp_path / "empty").mkdir()
    empty = runner.invoke(app, ["export", str(tmp_path / "empty"), "-f", "srt", "-o", str(tmp_path / "s")],
                          env={"COLUMNS": "300"})
    assert empty.exit_code == 2 and "no committed records" in empty.output
    bad_format = runner.invoke(app, ["export", str(tmp_path / "run"), "-f", "ass", "-o", str(tmp_path / "s")])
    assert bad_format.exit_code == 2
    with pytest.raises(ExportError, match="srt, vtt, txt, tsv"):
        export_run(tmp_path / "run", "ass", tmp_path / "s")
