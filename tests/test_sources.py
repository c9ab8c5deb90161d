"""Sources: the same 100 LibriSpeech rows read as Parquet, datasets folders, audio files and manifests.

The reference is pyarrow reading the shared Parquet file directly; every other representation is
built from it in tmp with independent tools (datasets, plain file writes) and must give the same
ids, texts and byte-identical audio.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchscribe.audio.sources import SourceError, SourceItem, SourceOptions, iter_source, shard_of
from batchscribe.config import ConfigError

TEST_OTHER = "librispeech/test-other-subset-00000-of-00001.parquet"


@pytest.fixture(scope="module")
def parquet_path(shared_data: Path) -> Path:
    return shared_data / TEST_OTHER


@pytest.fixture(scope="module")
def reference(parquet_path: Path) -> list[dict]:
    """(id, text, flac bytes, speaker_id, duration_s) per row, straight from pyarrow."""
    table = pq.read_table(parquet_path, columns=["id", "text", "audio", "speaker_id", "duration_s"])
    return table.to_pylist()


@pytest.fixture(scope="module")
def flac_folder(tmp_path_factory: pytest.TempPathFactory, reference: list[dict]) -> Path:
    """The rows as <speaker>/<id>.flac (the original FLAC bytes) + <id>.txt, plus non-audio files."""
    root = tmp_path_factory.mktemp("flac")
    for row in reference:
        path = root / row["speaker_id"] / f"{row['id']}.flac"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(row["audio"]["bytes"])
        path.with_suffix(".txt").write_text(row["text"] + "\n", encoding="utf-8")
    (root / "notes.md").write_text("not audio")
    (root / "cover.jpg").write_bytes(b"\xff\xd8\xff")
    return root


def _payload(item: SourceItem) -> bytes:
    if item.audio_bytes is not None:
        return item.audio_bytes
    assert item.path is not None
    return Path(item.path).read_bytes()


def _assert_same_rows(items: list[SourceItem], reference: list[dict]) -> None:
    assert [i.id for i in items] == [r["id"] for r in reference]
    assert [i.text for i in items] == [r["text"] for r in reference]
    for item, row in zip(items, reference):
        assert _payload(item) == row["audio"]["bytes"], item.id


def test_parquet_file(parquet_path: Path, reference: list[dict]) -> None:
    items = list(iter_source([str(parquet_path)], SourceOptions()))
    _assert_same_rows(items, reference)
    assert items[0].path == reference[0]["audio"]["path"]  # the file name stored with the bytes


def test_parquet_bytes_are_views_of_arrow_buffers_and_pickle_as_bytes(tmp_path: Path, parquet_path: Path,
                                                                    reference: list[dict]) -> None:
    """With audio_views, encoded audio is handed out without a copy (a flat read-only byte view), for
    a {bytes, path} struct column (nulls included) and a plain binary column; pickling (to a decode
    process) sends bytes. Without, bytes. pyarrow's own to_pylist is the reference."""
    import pickle

    import pyarrow as pa
    import pyarrow.parquet as pq

    assert all(type(i.audio_bytes) is bytes for i in iter_source([str(parquet_path)], SourceOptions()))  # copies
    items = list(iter_source([str(parquet_path)], SourceOptions(audio_views=True)))
    assert all(isinstance(i.audio_bytes, memoryview) and i.audio_bytes.format == "B" for i in items)
    again = pickle.loads(pickle.dumps(items[3]))
    assert type(again.audio_bytes) is bytes and again == SourceItem(items[3].id, reference[3]["audio"]["bytes"],
                                                                      items[3].path, items[3].text, items[3].extra)

    table = pq.read_table(parquet_path, columns=["id", "audio"]).slice(0, 9)
    audio = table.column("audio").combine_chunks()
    blobs = audio.field("bytes").to_pylist()
    with_nulls = pa.StructArray.from_arrays([audio.field("bytes"), audio.field("path")], names=["bytes", "path"],
                                            mask=pa.array([i == 4 for i in range(9)]))  # fmt: skip
    for name, column in (("struct", with_nulls), ("binary", pa.array(blobs, pa.large_binary()))):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"id": table.column("id"), "audio": column}), path, row_group_size=4)
        got = list(iter_source([str(path)], SourceOptions(audio_views=True)))
        assert [i.id for i in got] == table.column("id").to_pylist()
        for i, item in enumerate(got):
            if name == "struct" and i == 4:
                assert item.audio_bytes is None and item.path is None  # a null cell: an error record later
            else:
                assert isinstance(item.audio_bytes, memoryview) and bytes(item.audio_bytes) == blobs[i]


def test_save_to_disk_folder(tmp_path: Path, parquet_path: Path, reference: list[dict]) -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_parquet(str(parquet_path), cache_dir=str(tmp_path / "cache"))
    ds.save_to_disk(str(tmp_path / "disk"))
    _assert_same_rows(list(iter_source([str(tmp_path / "disk")], SourceOptions())), reference)


def test_save_to_disk_dataset_dict_needs_split(tmp_path: Path, parquet_path: Path, reference: list[dict]) -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_parquet(str(parquet_path), cache_dir=str(tmp_path / "cache"))
    datasets.DatasetDict({"test": ds, "other": ds.select(range(3))}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(SourceError, match=r"splits test, other; choose one with --split"):
        list(iter_source([str(tmp_path / "dd")], SourceOptions()))
    items = list(iter_source([str(tmp_path / "dd")], SourceOptions(split="test")))
    _assert_same_rows(items, reference)


def test_hub_style_folder(tmp_path: Path, parquet_path: Path, reference: list[dict]) -> None:
    pytest.importorskip("datasets")
    (tmp_path / "hub" / "data").mkdir(parents=True)
    shutil.copy(parquet_path, tmp_path / "hub" / "data" / "train-00000-of-00001.parquet")
    (tmp_path / "hub" / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
        "    path: data/train-*\n---\n# LibriSpeech test-other subset\n"
    )
    _assert_same_rows(list(iter_source([str(tmp_path / "hub")], SourceOptions())), reference)


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
        assert item.audio_bytes is None and _payload(item) == row["audio"]["bytes"]


def test_jsonl_manifest(flac_folder: Path, reference: list[dict]) -> None:
    manifest = flac_folder / "manifest.jsonl"
    with manifest.open("w") as fh:
        for row in reference:
            rel = f"{row['speaker_id']}/{row['id']}.flac"  # relative to the manifest's folder
            fh.write(json.dumps({"id": row["id"], "path": rel, "text": row["text"]}) + "\n")
    _assert_same_rows(list(iter_source([str(manifest)], SourceOptions())), reference)


def test_csv_manifest_derived_ids(flac_folder: Path, reference: list[dict]) -> None:
    manifest = flac_folder / "list.csv"
    lines = ["file_name,text"] + [f"{r['speaker_id']}/{r['id']}.flac,{r['text']}" for r in reference[:5]]
    manifest.write_text("\n".join(lines) + "\n")
    items = list(iter_source([str(manifest)], SourceOptions()))
    assert [i.id for i in items] == [f"{r['speaker_id']}/{r['id']}" for r in reference[:5]]
    assert [_payload(i) for i in items] == [r["audio"]["bytes"] for r in reference[:5]]


def test_sharding_disjoint_and_complete(parquet_path: Path) -> None:
    whole = [i.id for i in iter_source([str(parquet_path)], SourceOptions())]
    shards = [
        [i.id for i in iter_source([str(parquet_path)], SourceOptions(num_shards=3, shard_index=k))]
        for k in range(3)
    ]
    assert sum(len(s) for s in shards) == len(whole) == 100
    assert sorted(sum(shards, [])) == sorted(whole)
    assert all(len(s) > 10 for s in shards)  # a real split, not everything in one shard
    for k, shard in enumerate(shards):
        assert shard == [i for i in whole if shard_of(i, 3) == k]  # input order kept
    limited = [i.id for i in iter_source([str(parquet_path)], SourceOptions(num_shards=3, shard_index=1, limit=5))]
    assert limited == shards[1][:5]  # limit counts items of the shard


def test_passthrough_columns(parquet_path: Path, reference: list[dict]) -> None:
    items = list(iter_source([str(parquet_path)], SourceOptions(passthrough=("speaker_id", "duration_s"), limit=7)))
    assert [i.extra for i in items] == [
        {"speaker_id": r["speaker_id"], "duration_s": r["duration_s"]} for r in reference[:7]
    ]


@pytest.mark.parametrize(
    ("opts", "flag", "name"),
    [
        (SourceOptions(audio_column="wav"), "--audio-column", "wav"),
        (SourceOptions(id_column="utt_id"), "--id-column", "utt_id"),
        (SourceOptions(text_column="sentence"), "--text-column", "sentence"),
        (SourceOptions(passthrough=("gender",)), "--passthrough", "gender"),
    ],
)
def test_missing_column_lists_available(parquet_path: Path, opts: SourceOptions, flag: str, name: str) -> None:
    with pytest.raises(SourceError) as err:
        next(iter_source([str(parquet_path)], opts))
    message = str(err.value)
    assert repr(name) in message and flag in message and str(parquet_path) in message
    assert "id, audio, text, duration_s, sampling_rate, speaker_id, chapter_id" in message


def test_wrong_audio_column_type(parquet_path: Path) -> None:
    with pytest.raises(SourceError, match=r"'duration_s' has type double, not audio.*--audio-column"):
        next(iter_source([str(parquet_path)], SourceOptions(audio_column="duration_s")))


def test_manifest_without_path_column(tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"wav_file": "a.wav", "id": "a"}) + "\n")
    with pytest.raises(SourceError, match=r"m.jsonl:1: no audio path column.*available columns: wav_file, id.*--audio-column"):
        list(iter_source([str(manifest)], SourceOptions()))
    items = list(iter_source([str(manifest)], SourceOptions(audio_column="wav_file")))
    assert items == [SourceItem("a", None, str(tmp_path / "a.wav"), None, {})]


def test_duplicate_ids_get_numbered_suffix(tmp_path: Path) -> None:
    rows = [("a", "1.wav"), ("b", "2.wav"), ("a", "3.wav"), ("a", "4.wav"), ("a#2", "5.wav")]
    manifest = tmp_path / "dups.jsonl"
    manifest.write_text("".join(json.dumps({"id": i, "path": p}) + "\n" for i, p in rows))
    whole = list(iter_source([str(manifest)], SourceOptions()))
    # k-th occurrence -> "<id>#k"; a genuine id that is already taken gets the rule too.
    assert [(i.id, Path(i.path or "").name) for i in whole] == [
        ("a", "1.wav"), ("b", "2.wav"), ("a#2", "3.wav"), ("a#3", "4.wav"), ("a#2#2", "5.wav"),
    ]
    # The rule runs before sharding, so shards agree with the whole run.
    shards = [list(iter_source([str(manifest)], SourceOptions(num_shards=2, shard_index=k))) for k in range(2)]
    assert sorted((i.id, i.path) for s in shards for i in s) == sorted((i.id, i.path) for i in whole)


def test_parquet_without_id_and_path_strings(tmp_path: Path, reference: list[dict]) -> None:
    (tmp_path / "clips").mkdir()
    for row in reference[:3]:
        (tmp_path / "clips" / f"{row['id']}.flac").write_bytes(row["audio"]["bytes"])
    table = pa.table({"audio": [f"clips/{r['id']}.flac" for r in reference[:3]],
                      "sentence": [r["text"] for r in reference[:3]]})
    pq.write_table(table, tmp_path / "part.parquet")
    items = list(iter_source([str(tmp_path / "*.parquet")], SourceOptions(text_column="sentence")))
    assert [i.id for i in items] == ["part:0", "part:1", "part:2"]
    assert [i.text for i in items] == [r["text"] for r in reference[:3]]
    assert [_payload(i) for i in items] == [r["audio"]["bytes"] for r in reference[:3]]


def test_unreadable_audio_is_an_item_not_an_error(tmp_path: Path) -> None:
    (tmp_path / "broken.wav").write_bytes(b"RIFF....garbage")
    assert [i.id for i in iter_source([str(tmp_path)], SourceOptions())] == ["broken"]


def test_input_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"'/no/such/file.parquet' does not exist"):
        iter_source(["/no/such/file.parquet"], SourceOptions())
    with pytest.raises(SourceError, match=r"matches no files"):
        iter_source([str(tmp_path / "*.parquet")], SourceOptions())
    (tmp_path / "readme.txt").write_text("hello")
    with pytest.raises(SourceError, match=r"no Parquet files, dataset or audio files found \(1 other files\)"):
        iter_source([str(tmp_path)], SourceOptions())
    pq.write_table(pa.table({"audio": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    with pytest.raises(SourceError, match=r"empty.parquet' contains no items"):
        list(iter_source([str(tmp_path / "empty.parquet")], SourceOptions()))
    with pytest.raises(SourceError, match=r"no input given"):
        iter_source([], SourceOptions())
    with pytest.raises(ConfigError, match=r"shard_index=3 is outside 0..2"):
        SourceOptions(num_shards=3, shard_index=3)


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
    assert [_payload(i) for i in items] == [r["audio"]["bytes"] for r in reference[:3]]
    single = list(iter_source([str(tmp_path / f"{reference[0]['id']}.flac")], SourceOptions()))
    assert [(i.id, _payload(i)) for i in single] == [(reference[0]["id"], reference[0]["audio"]["bytes"])]


def test_unknown_hub_id_says_what_was_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    # Offline, so the test does not wait on network retries; the hub answers "unreachable".
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    plan = iter_source(["someone/no-such-dataset"], SourceOptions())  # a hub id: nothing read yet
    with pytest.raises(SourceError, match=r"could not load 'someone/no-such-dataset' as a Hugging Face "
                                          r"dataset .*it is not a local path either.*--config and --split"):
        next(plan)
