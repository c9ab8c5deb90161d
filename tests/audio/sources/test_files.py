"""Audio files, audio folders and manifests written from the reference rows with plain file writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchscribe.audio.sources import SourceError, SourceItem, SourceOptions, iter_source
from tests.audio.sources.rows import assert_same_rows, payload


def test_audio_folder(flac_folder: Path, reference: list[dict]) -> None:
    items = list(iter_source([str(flac_folder)], SourceOptions()))
    # Derived ids are relative paths without the extension, walked in name order (the speaker
    # folders are all digits, so that is plain sorted order); non-audio is skipped.
    expected = sorted(f"{r['speaker_id']}/{r['id']}" for r in reference)
    assert [i.id for i in items] == expected
    by_id = {r["id"]: r for r in reference}
    for item in items:
        row = by_id[item.id.split("/")[-1]]
        assert item.text == row["text"]  # from the sidecar .txt
        assert item.audio_bytes is None and payload(item) == row["audio"]["bytes"]


def test_a_reference_that_is_not_utf8_costs_its_item_the_reference_not_the_run(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """A Latin-1 `.txt` beside one clip: every clip is still an item, that one without its
    reference, and the warning names the file and the fix (it stopped the run with a traceback)."""
    import logging
    import shutil

    clip = Path(__file__).resolve().parents[3] / "batchscribe" / "demo" / "sense_and_sensibility_01_austen_64kb-0870.flac"
    for name in ("a", "b"):
        shutil.copy(clip, tmp_path / f"{name}.flac")
    (tmp_path / "a.txt").write_text("plain reference", encoding="utf-8")
    (tmp_path / "b.txt").write_bytes("caf\u00e9".encode("latin-1"))
    with caplog.at_level(logging.WARNING):
        items = {i.id: i for i in iter_source([str(tmp_path)], SourceOptions())}
    assert sorted(items) == ["a", "b"]
    assert items["a"].text == "plain reference" and items["b"].text is None
    assert any("b.txt" in r.getMessage() and "UTF-8" in r.getMessage() for r in caplog.records)


def test_jsonl_manifest(flac_folder: Path, reference: list[dict]) -> None:
    manifest = flac_folder / "manifest.jsonl"
    with manifest.open("w") as fh:
        for row in reference:
            rel = f"{row['speaker_id']}/{row['id']}.flac"  # relative to the manifest's folder
            fh.write(json.dumps({"id": row["id"], "path": rel, "text": row["text"]}) + "\n")
    assert_same_rows(list(iter_source([str(manifest)], SourceOptions())), reference)


def test_csv_manifest_derived_ids(flac_folder: Path, reference: list[dict]) -> None:
    manifest = flac_folder / "list.csv"
    lines = ["file_name,text"] + [f"{r['speaker_id']}/{r['id']}.flac,{r['text']}" for r in reference[:5]]
    manifest.write_text("\n".join(lines) + "\n")
    items = list(iter_source([str(manifest)], SourceOptions()))
    assert [i.id for i in items] == [f"{r['speaker_id']}/{r['id']}" for r in reference[:5]]
    assert [payload(i) for i in items] == [r["audio"]["bytes"] for r in reference[:5]]


def test_manifest_without_path_column(tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"wav_file": "a.wav", "id": "a"}) + "\n")
    with pytest.raises(SourceError, match=r"m.jsonl:1: no audio path column.*available columns: wav_file, id.*--audio-column"):
        list(iter_source([str(manifest)], SourceOptions()))
    items = list(iter_source([str(manifest)], SourceOptions(audio_column="wav_file")))
    assert items == [SourceItem("a", None, str(tmp_path / "a.wav"), None, {})]


@pytest.mark.parametrize("bad", ["{oops", json.dumps({"id": "x", "wav": "x.wav"})])
def test_a_bad_manifest_line_is_found_before_the_first_item(tmp_path: Path, bad: str) -> None:
    """Bad JSON, a row without an audio path: on line 41, before line 1's item comes out (it
    stopped runs mid-way, part committed)."""
    manifest = tmp_path / "m.jsonl"
    good = [json.dumps({"id": f"u{k}", "path": f"{k}.wav", "speaker": k}) for k in range(40)]
    manifest.write_text("\n".join([*good, bad]) + "\n")
    items = iter_source([str(manifest)], SourceOptions(passthrough=("speaker",)))
    with pytest.raises(SourceError, match=r"m.jsonl:41: "):
        next(items)
    manifest.write_text("\n".join(good) + "\n")
    assert len(list(iter_source([str(manifest)], SourceOptions(passthrough=("speaker",))))) == 40


def test_a_jsonl_row_may_leave_out_a_column_other_rows_have(tmp_path: Path) -> None:
    """As `datasets`' JSON loader reads such a file: the cell is null (no reference, no prompt, a
    null passthrough value, the id derived from the path). It refused the whole run, naming the
    row. A column that no row has is still refused, before any item."""
    manifest = tmp_path / "m.jsonl"
    full = {"id": "u0", "path": "0.wav", "text": "hello", "speaker": 7, "hint": "Quilter"}
    manifest.write_text(json.dumps(full) + "\n" + json.dumps({"path": "sub/1.wav"}) + "\n")
    opts = SourceOptions(passthrough=("speaker",), prompt_column="hint")
    first, second = iter_source([str(manifest)], opts)
    assert (first.id, first.text, first.extra, first.prompt) == ("u0", "hello", {"speaker": 7}, "Quilter")
    assert (second.id, second.text, second.extra, second.prompt) == ("sub/1", None, {"speaker": None}, None)
    for named in (SourceOptions(passthrough=("age",)), SourceOptions(text_column="words")):
        with pytest.raises(SourceError, match=r"m.jsonl:1: no .*column '(age|words)'; available columns: "
                                              r"id, path, text, speaker, hint"):
            next(iter_source([str(manifest)], named))


def test_unreadable_audio_is_an_item_not_an_error(tmp_path: Path) -> None:
    (tmp_path / "broken.wav").write_bytes(b"RIFF....garbage")
    assert [i.id for i in iter_source([str(tmp_path)], SourceOptions())] == ["broken"]


def test_audiofolder_metadata_and_single_file(tmp_path: Path, reference: list[dict]) -> None:
    # The datasets `audiofolder` convention: metadata.jsonl with file_name beside the audio.
    for row in reference[:3]:
        (tmp_path / f"{row['id']}.flac").write_bytes(row["audio"]["bytes"])
    (tmp_path / "metadata.jsonl").write_text(
        "".join(json.dumps({"file_name": f"{r['id']}.flac", "text": r["text"], "spk": r["speaker_id"]}) + "\n"
                for r in reference[:3])
    )
    items = list(iter_source([str(tmp_path)], SourceOptions(passthrough=("spk",))))
    assert [(i.id, i.text, i.extra) for i in items] == [
        (r["id"], r["text"], {"spk": r["speaker_id"]}) for r in reference[:3]
    ]
    assert [payload(i) for i in items] == [r["audio"]["bytes"] for r in reference[:3]]
    single = list(iter_source([str(tmp_path / f"{reference[0]['id']}.flac")], SourceOptions()))
    assert [(i.id, payload(i)) for i in single] == [(reference[0]["id"], reference[0]["audio"]["bytes"])]


@pytest.mark.parametrize("manifest", ["metadata.jsonl", "metadata.csv"])
def test_audiofolder_files_its_metadata_does_not_list_are_counted_in_a_warning(
        tmp_path: Path, reference: list[dict], manifest: str, caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """As `datasets`' audiofolder, only the listed files are items; the others were skipped without
    a word. The warning counts them and names some; a file listed by another path spelling (./x)
    is listed; a manifest given as a file warns of nothing (it need not describe its folder)."""
    import logging

    for row in reference[:4]:
        (tmp_path / "clips").mkdir(exist_ok=True)
        (tmp_path / "clips" / f"{row['id']}.flac").write_bytes(row["audio"]["bytes"])
    names = [f"./clips/{r['id']}.flac" if k else f"clips/{r['id']}.flac" for k, r in enumerate(reference[:2])]
    if manifest.endswith(".jsonl"):
        (tmp_path / manifest).write_text("".join(json.dumps({"file_name": n}) + "\n" for n in names))
    else:
        (tmp_path / manifest).write_text("file_name\n" + "".join(n + "\n" for n in names))
    with caplog.at_level(logging.WARNING):
        items = list(iter_source([str(tmp_path)], SourceOptions()))
    assert len(items) == 2
    warnings = [r.getMessage() for r in caplog.records if "not listed" in r.getMessage()]
    unlisted = sorted(f"clips/{r['id']}.flac" for r in reference[2:4])
    assert warnings == [f"{tmp_path / manifest}: 2 audio files in its folder are not listed in it and are not "
                        f"transcribed (e.g. {', '.join(unlisted)}); add them to {manifest} to transcribe them"]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert len(list(iter_source([str(tmp_path / manifest)], SourceOptions()))) == 2
    assert not [r for r in caplog.records if "not listed" in r.getMessage()]


def _folder_ids(folder: Path) -> dict[str, str]:
    return {i.id: Path(i.path or "").name for i in iter_source([str(folder)], SourceOptions())}


def test_folder_ids_for_shared_stems_do_not_depend_on_listing_order(tmp_path: Path) -> None:
    """`a.wav` and `a.flac` in one folder keep their extensions; a file added later (sorting first)
    gets its own id and shifts none (the numbered "#k" rule transcribed one file twice)."""
    for name in ("a.wav", "a.flac", "b.wav", "sub/a.wav"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"RIFF")
    before = _folder_ids(tmp_path)
    assert before == {"a.flac": "a.flac", "a.wav": "a.wav", "b": "b.wav", "sub/a": "a.wav"}
    (tmp_path / "a.aac").write_bytes(b"x")  # sorts before both
    (tmp_path / "0.wav").write_bytes(b"x")
    after = _folder_ids(tmp_path)
    assert {k: after[k] for k in before} == before  # every earlier id names the same file
    assert after["a.aac"] == "a.aac" and after["0"] == "0.wav" and len(after) == 6


def test_output_folder_inside_a_folder_input_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "x.wav").write_bytes(b"RIFF")
    out = tmp_path / "out"
    (out / "eval").mkdir(parents=True)
    (out / "y.wav").write_bytes(b"RIFF")  # what a run's output holds is never input
    (out / "records-00000.parquet").write_bytes(b"PAR1")
    opts = SourceOptions(exclude=(str(out.resolve()),))
    assert [i.id for i in iter_source([str(tmp_path)], opts)] == ["x"]
    with pytest.raises(SourceError, match="records-00000.parquet"):  # without it: read as input
        list(iter_source([str(tmp_path)], SourceOptions()))


@pytest.mark.parametrize("manifest, column", [("metadata.csv", "transcription"), ("metadata.jsonl", "sentence"),
                                              ("metadata.jsonl", "normalized_text"), ("metadata.csv", "text")])
def test_audiofolder_reference_column_is_found_by_its_conventional_name(
    tmp_path: Path, reference: list[dict], caplog: pytest.LogCaptureFixture, manifest: str, column: str
) -> None:
    """Hugging Face's audiofolder: `file_name` plus one of the conventional reference columns,
    from metadata.csv or metadata.jsonl; the choice is logged once for the input."""
    rows = [{"file_name": f"{r['id']}.flac", column: r["text"], "other": "x"} for r in reference[:3]]
    if column == "text":  # text wins over a later convention present in the same table
        rows = [{**row, "normalized_text": "not this"} for row in rows]
    for r in reference[:3]:
        (tmp_path / f"{r['id']}.flac").write_bytes(r["audio"]["bytes"])
    if manifest.endswith(".csv"):
        header = list(rows[0])
        lines = [",".join(header)] + [",".join(str(row[k]) for k in header) for row in rows]
        (tmp_path / manifest).write_text("\n".join(lines) + "\n")
    else:
        (tmp_path / manifest).write_text("".join(json.dumps(row) + "\n" for row in rows))
    with caplog.at_level("INFO", logger="batchscribe.audio.sources"):
        items = list(iter_source([str(tmp_path)], SourceOptions()))
    assert [(i.id, i.text) for i in items] == [(r["id"], r["text"]) for r in reference[:3]]
    notes = [rec.getMessage() for rec in caplog.records if rec.name.startswith("batchscribe.audio.sources")]
    assert notes == [f"reference text: column {column!r} (a conventional name; --text-column NAME picks another)"]
    caplog.clear()
    chosen = list(iter_source([str(tmp_path)], SourceOptions(text_column="other")))
    assert [i.text for i in chosen] == ["x"] * 3 and not caplog.records  # a named column: nothing to say


def test_audiofolder_without_a_reference_column(tmp_path: Path, reference: list[dict]) -> None:
    (tmp_path / "a.flac").write_bytes(reference[0]["audio"]["bytes"])
    (tmp_path / "metadata.csv").write_text("file_name,transcript_raw\na.flac,hello\n")
    assert [(i.id, i.text) for i in iter_source([str(tmp_path)], SourceOptions())] == [("a", None)]
