"""Hugging Face datasets (save_to_disk folders, hub-style folders, hub ids), built with `datasets`
from the reference Parquet file: the same ids, texts and audio bytes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from batchscribe.audio.sources import SourceError, SourceOptions, iter_source
from tests.audio.sources.rows import assert_same_rows


def test_save_to_disk_folder(tmp_path: Path, parquet_path: Path, reference: list[dict]) -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_parquet(str(parquet_path), cache_dir=str(tmp_path / "cache"))
    ds.save_to_disk(str(tmp_path / "disk"))
    assert_same_rows(list(iter_source([str(tmp_path / "disk")], SourceOptions())), reference)


def test_save_to_disk_dataset_dict_needs_split(tmp_path: Path, parquet_path: Path, reference: list[dict]) -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_parquet(str(parquet_path), cache_dir=str(tmp_path / "cache"))
    datasets.DatasetDict({"test": ds, "other": ds.select(range(3))}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(SourceError, match=r"splits test, other; choose one with --split"):
        list(iter_source([str(tmp_path / "dd")], SourceOptions()))
    items = list(iter_source([str(tmp_path / "dd")], SourceOptions(split="test")))
    assert_same_rows(items, reference)


def test_hub_style_folder(tmp_path: Path, parquet_path: Path, reference: list[dict]) -> None:
    pytest.importorskip("datasets")
    (tmp_path / "hub" / "data").mkdir(parents=True)
    shutil.copy(parquet_path, tmp_path / "hub" / "data" / "train-00000-of-00001.parquet")
    (tmp_path / "hub" / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
        "    path: data/train-*\n---\n# LibriSpeech test-other subset\n"
    )
    assert_same_rows(list(iter_source([str(tmp_path / "hub")], SourceOptions())), reference)


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


def test_save_to_disk_with_decoded_audio_samples(tmp_path: Path) -> None:
    """A dataset whose audio column holds decoded samples ({array, sampling_rate, path}) is read
    as audio (resampled to 16 kHz), not as a path that does not exist."""
    import datasets
    import numpy as np

    from batchscribe.audio.worker import decode_one

    samples = np.linspace(-0.5, 0.5, 16000, dtype=np.float32)
    ds = datasets.Dataset.from_dict({"id": ["x"], "audio": [{"array": samples.tolist(), "sampling_rate": 16000,
                                                              "path": "missing.flac"}]})  # fmt: skip
    ds.save_to_disk(str(tmp_path / "disk"))
    (item,) = iter_source([str(tmp_path / "disk")], SourceOptions())
    audio, error = decode_one(item, None)
    assert error is None and audio is not None
    np.testing.assert_allclose(audio, samples, atol=1e-7)  # 16 kHz in: the same samples back


def test_save_to_disk_ids_are_audio_file_names(tmp_path: Path, parquet_path: Path, reference: list[dict]) -> None:
    """Without an id column, a row's id is its audio path's name without the extension, as a folder
    input's is; a name taken by an earlier row, or no path, gives `<split>:<row>`."""
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_parquet(str(parquet_path), cache_dir=str(tmp_path / "cache")).remove_columns(["id"])
    ds = datasets.concatenate_datasets([ds.select(range(4)), ds.select([1])])  # row 4 repeats row 1's file
    ds.save_to_disk(str(tmp_path / "disk"))
    items = list(iter_source([str(tmp_path / "disk")], SourceOptions()))
    names = [Path(r["audio"]["path"]).stem for r in reference[:4]]
    assert len(set(names)) == 4 and all(":" not in n for n in names)
    assert [i.id for i in items] == [*names, "train:4"]
    assert [i.audio_bytes for i in items] == [r["audio"]["bytes"] for r in [*reference[:4], reference[1]]]


def test_dataset_rows_without_audio_paths_keep_split_index(tmp_path: Path, reference: list[dict]) -> None:
    datasets = pytest.importorskip("datasets")
    rows = {"audio": [{"bytes": r["audio"]["bytes"], "path": None} for r in reference[:2]],
            "text": [r["text"] for r in reference[:2]]}
    ds = datasets.Dataset.from_dict(rows).cast_column("audio", datasets.Audio(decode=False))
    datasets.DatasetDict({"validation": ds}).save_to_disk(str(tmp_path / "disk"))
    items = list(iter_source([str(tmp_path / "disk")], SourceOptions()))
    assert [(i.id, i.text) for i in items] == [("validation:0", reference[0]["text"]), ("validation:1", reference[1]["text"])]


@pytest.mark.parametrize("where", ["nowhere", "hub cache", "datasets cache", "reachable"])
def test_an_unreachable_hub_fails_at_once_unless_the_dataset_is_cached(
        where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """Offline without HF_HUB_OFFLINE, datasets retried ~26 s before failing; with the hub
    unreachable and the dataset in neither cache it fails at once, naming the hub, why and the fix.
    A cached dataset (datasets reads it after its retries) and a reachable hub still load."""
    import logging

    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    from batchscribe import hub_probe

    class Loaded(Exception):
        pass

    def load_dataset(*args, **kwargs):
        raise Loaded

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(hub_probe, "unreachable", lambda url: "" if where == "reachable" else "URLError: no network")
    if where == "hub cache":
        (tmp_path / "hub" / "datasets--someone--clips").mkdir(parents=True)
    if where == "datasets cache":
        (tmp_path / "datasets" / "someone___clips").mkdir(parents=True)
    plan = iter_source(["someone/clips"], SourceOptions())
    if where == "nowhere":
        with pytest.raises(SourceError, match=r"could not load 'someone/clips' as a Hugging Face dataset: it is not in "
                                              r"the local cache and the hub \(https://.*\) is unreachable \(URLError: "
                                              r"no network\).*hf download --repo-type dataset someone/clips.*"
                                              r"HF_HUB_OFFLINE=1"):  # fmt: skip
            next(plan)
        return
    with caplog.at_level(logging.INFO, logger="batchscribe"), pytest.raises(SourceError) as err:
        next(plan)
    assert isinstance(err.value.__cause__, Loaded)  # datasets was asked, as before
    assert ("HF_HUB_OFFLINE=1 reads the cache at once" in caplog.text) == (where != "reachable")
