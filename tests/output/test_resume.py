"""Exactly-once bookkeeping: manifest, repair after crashes, run_config refusal, overwrite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchscribe.output import resume
from batchscribe.output.formats import encode_shard, read_shard
from batchscribe.output.identity import check_run_config, write_run_config
from batchscribe.output.resume import OutputDirError, ResumeConflictError, open_output
from batchscribe.output.writers import ShardWriter, write_atomic


def committed_ids(directory: Path) -> set[str]:
    """Ids in the committed shard files themselves (not the manifest): what a reader would see."""
    return {str(r["id"]) for p in sorted(directory.glob("records-*")) if p.suffix in (".jsonl", ".parquet")
            for r in read_shard(p)}


def rec(i: int, ok: bool = True) -> dict[str, Any]:
    if ok:
        return {"id": f"u{i}", "text": " hi", "language": "english", "duration": 1.5, "segments": []}
    return {"id": f"u{i}", "error": "broken", "duration": None}


def commit(directory: Path, records: list[dict[str, Any]], fmt: str = "jsonl",
           shard_size: int = 2) -> resume.OutputState:
    state = open_output(directory, fmt)
    w = ShardWriter(directory, fmt, first_index=state.next_index, shard_size=shard_size,
                    on_commit=state.on_commit)
    for r in records:
        w.add(r)
    w.flush()
    return state


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_reopen_sees_committed_ids_and_continues_numbering(tmp_path: Path, fmt: str) -> None:
    commit(tmp_path, [rec(0), rec(1, ok=False), rec(2)], fmt)
    state = open_output(tmp_path, fmt)
    assert state.completed == {"u0", "u1", "u2"} == committed_ids(tmp_path)
    assert state.next_index == 2
    assert state.totals() == {"items": 3, "ok": 2, "errors": 1, "audio_seconds": 3.0, "shards": 2}
    commit(tmp_path, [rec(3)], fmt)
    assert (tmp_path / f"records-00002.{fmt}").exists()
    assert open_output(tmp_path, fmt).completed == {"u0", "u1", "u2", "u3"}


def test_shard_renamed_but_manifest_line_lost_is_adopted(tmp_path: Path) -> None:
    commit(tmp_path, [rec(0), rec(1)])
    # The crash window between os.replace and the manifest append: a committed shard unlisted.
    write_atomic(tmp_path / "records-00001.jsonl", encode_shard([rec(2), rec(3)], "jsonl"))
    state = open_output(tmp_path, "jsonl")
    assert state.completed == {"u0", "u1", "u2", "u3"}
    assert state.next_index == 2
    lines = (tmp_path / "_manifest.ndjson").read_text().splitlines()
    assert [json.loads(x)["shard"] for x in lines] == ["records-00000.jsonl", "records-00001.jsonl"]


def test_torn_manifest_line_is_dropped_and_rewritten(tmp_path: Path) -> None:
    commit(tmp_path, [rec(0), rec(1), rec(2), rec(3)])
    manifest = tmp_path / "_manifest.ndjson"
    whole = manifest.read_bytes()
    manifest.write_bytes(whole[: len(whole) - 20])  # the second line cut mid-write
    state = open_output(tmp_path, "jsonl")
    assert state.completed == {"u0", "u1", "u2", "u3"}  # its shard was recovered from the file
    for line in manifest.read_text().splitlines():
        json.loads(line)
    assert manifest.read_bytes().endswith(b"\n")


def test_missing_shard_file_means_redo(tmp_path: Path) -> None:
    commit(tmp_path, [rec(0), rec(1), rec(2)])
    (tmp_path / "records-00000.jsonl").unlink()
    state = open_output(tmp_path, "jsonl")
    assert state.completed == {"u2"}


def test_temp_files_are_removed_and_never_read(tmp_path: Path) -> None:
    commit(tmp_path, [rec(0)])
    leftovers = [".records-00001.jsonl.tmp", "._manifest.ndjson.tmp", ".summary.json.tmp"]
    for name in leftovers:
        (tmp_path / name).write_text('{"id": "half"')
    state = open_output(tmp_path, "jsonl")
    assert state.completed == {"u0"}
    assert not [name for name in leftovers if (tmp_path / name).exists()]


def test_run_config_refuses_changed_settings(tmp_path: Path) -> None:
    base = {"model": "tiny.en", "decode_options": {"language": None}, "format": "jsonl",
            "inputs": ["/data/a.parquet"], "source_options": {}, "num_shards": 1}
    write_run_config(tmp_path, base)
    check_run_config(tmp_path, base | {"batchscribe_version": "9"})  # no records yet: anything goes
    commit(tmp_path, [rec(0)])
    check_run_config(tmp_path, dict(base))  # same settings: resume
    with pytest.raises(ResumeConflictError) as err:
        check_run_config(tmp_path, base | {"model": "base"})
    msg = str(err.value)
    assert "model" in msg and '"tiny.en"' in msg and '"base"' in msg and "--overwrite" in msg
    with pytest.raises(ResumeConflictError, match=r"--language: before null, now \"en\""):
        check_run_config(tmp_path, base | {"decode_options": {"language": "en"}})


def test_overwrite_removes_only_our_files(tmp_path: Path) -> None:
    commit(tmp_path, [rec(0), rec(1), rec(2)])
    write_run_config(tmp_path, {"model": "x"})
    (tmp_path / "notes.txt").write_text("mine")
    state = open_output(tmp_path, "jsonl", overwrite=True)
    assert state.completed == set() and state.next_index == 0
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_unwritable_output_dir_names_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OutputDirError, match=str(blocker / "out")):
        open_output(blocker / "out", "jsonl")


def test_ids_never_become_paths(tmp_path: Path) -> None:
    out = tmp_path / "out"
    evil = [{"id": "../../escape", "error": "x", "duration": None},
            {"id": "/etc/passwd", "error": "x", "duration": None}]
    commit(out, evil)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in out.iterdir()) == ["_manifest.ndjson", "records-00000.jsonl"]
    assert read_shard(out / "records-00000.jsonl") == evil


def test_machines_sharing_a_directory_use_disjoint_names(tmp_path: Path) -> None:
    for index in range(2):
        prefix = resume.output_prefix(2, index)
        state = open_output(tmp_path, "jsonl", prefix)
        w = ShardWriter(tmp_path, "jsonl", prefix, on_commit=state.on_commit)
        w.add(rec(index))
        w.flush()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["_manifest-records-part00000of00002.ndjson",
                     "_manifest-records-part00001of00002.ndjson",
                     "records-part00000of00002-00000.jsonl", "records-part00001of00002-00000.jsonl"]
    assert open_output(tmp_path, "jsonl", resume.output_prefix(2, 1)).completed == {"u1"}
