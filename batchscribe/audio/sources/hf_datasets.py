"""Hugging Face datasets: `save_to_disk` folders, hub-style folders and hub ids, rows undecoded."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from batchscribe.audio.sources.columns import Columns, make_item, note_columns, resolve_columns
from batchscribe.audio.sources.items import SourceError, SourceItem, SourceOptions

log = logging.getLogger(__name__)


def read_dataset_disk(path: Path, opts: SourceOptions) -> Iterator[SourceItem]:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except (OSError, ValueError, FileNotFoundError) as exc:
        raise SourceError(f"{path}: not a readable save_to_disk folder ({exc})") from exc
    split, dataset = _pick_split(loaded, opts, str(path))
    yield from _read_dataset_rows(dataset, opts, str(path), split, path)


def read_dataset_hub(name: str, opts: SourceOptions, base_dir: Path | None = None) -> Iterator[SourceItem]:
    import datasets

    local = "" if base_dir is not None else "; it is not a local path either"
    if base_dir is None:  # a hub id, not a hub-style folder
        _check_reachable(name, local)
    try:
        loaded = datasets.load_dataset(name, opts.config, split=opts.split, streaming=opts.streaming)
    except Exception as exc:  # datasets raises many types (hub, network, config, builder errors)
        raise SourceError(
            f"could not load {name!r} as a Hugging Face dataset ({type(exc).__name__}: {exc}){local}; "
            f"check the name, --config and --split"
        ) from exc
    split, dataset = _pick_split(loaded, opts, name)
    yield from _read_dataset_rows(dataset, opts, name, split, base_dir)


def _check_reachable(name: str, local: str) -> None:
    """Fail at once, saying why, where datasets would retry an unreachable hub for ~30 s only to
    fail: the hub does not answer and the dataset is in no local cache. A cached dataset goes on
    (datasets uses the cached copy after its retries; a note says how to skip them); with
    HF_HUB_OFFLINE set datasets asks no network, so nothing is probed."""
    import datasets
    from huggingface_hub import constants

    from batchscribe.hub_probe import unreachable

    if constants.HF_HUB_OFFLINE:
        return
    why = unreachable(f"{constants.ENDPOINT.rstrip('/')}/api/datasets/{name}")
    if not why:
        return
    cached = [Path(constants.HF_HUB_CACHE) / f"datasets--{name.replace('/', '--')}",
              Path(datasets.config.HF_DATASETS_CACHE) / name.replace("/", "___")]  # fmt: skip
    if any(path.exists() for path in cached):
        log.info("the Hugging Face hub is unreachable (%s): datasets retries it for ~30 s before it reads %r from "
                 "its cache; HF_HUB_OFFLINE=1 reads the cache at once", why, name)
        return
    raise SourceError(f"could not load {name!r} as a Hugging Face dataset: it is not in the local cache and the hub "
                      f"({constants.ENDPOINT}) is unreachable ({why}){local}. Download it where the hub is reachable "
                      f"(hf download --repo-type dataset {name}, or save it as Parquet), or pass a local path; "
                      "HF_HUB_OFFLINE=1 makes datasets read only the cache, without network retries")


def _pick_split(loaded: Any, opts: SourceOptions, where: str) -> tuple[str, Any]:
    """A DatasetDict -> the requested (or only) split; a single dataset is returned as is."""
    if not hasattr(loaded, "keys"):
        return str(opts.split or getattr(loaded, "split", None) or "train"), loaded
    splits = list(loaded.keys())
    if opts.split is not None:
        if opts.split not in splits:
            raise SourceError(
                f"{where}: no split {opts.split!r}; available splits: {', '.join(splits)}; use --split NAME"
            )
        return opts.split, loaded[opts.split]
    if len(splits) != 1:
        raise SourceError(f"{where}: has splits {', '.join(splits)}; choose one with --split NAME")
    return splits[0], loaded[splits[0]]


def _read_dataset_rows(
    dataset: Any, opts: SourceOptions, where: str, split: str, base_dir: Path | None
) -> Iterator[SourceItem]:
    from datasets import Audio

    features = dataset.features
    cols: Columns | None = None
    if features is not None:
        cols = resolve_columns(list(features), opts, where)
        note_columns(cols, opts)
        dataset = dataset.select_columns(cols.needed)
        if isinstance(features[cols.audio], Audio):
            # Undecoded: {bytes, path}. We decode ourselves, in worker processes.
            dataset = dataset.cast_column(cols.audio, Audio(decode=False))
    names = _RowNames(split)
    for row_index, row in enumerate(dataset):
        if cols is None:  # a streamed dataset whose features are unknown: check the first row
            cols = resolve_columns(list(row), opts, where)
            note_columns(cols, opts)
        yield make_item(row, cols, names.derive(row[cols.audio], row_index), base_dir, f"{split}:{row_index}")


class _RowNames:
    """Derived ids for rows without an id column: the audio path's file name without its extension,
    as a folder input's ids are (`1272-128104-0000.flac` -> `1272-128104-0000`), else `<split>:<row>`.

    A name already taken by an earlier row of this dataset gives that later row `<split>:<row>`,
    so ids stay unique and each row's id depends only on the rows before it (stable across runs).
    """

    def __init__(self, split: str) -> None:
        self.split = split
        self.taken: set[str] = set()  # one name per row read: the same growth as the duplicate-id rule

    def derive(self, audio: Any, row_index: int) -> str:
        where = audio.get("path") if isinstance(audio, dict) else audio if isinstance(audio, str) else None
        name = re.split(r"[\\/]", where)[-1] if where else ""
        stem = name.rpartition(".")[0] if "." in name.lstrip(".") else name
        if not stem or stem in self.taken:
            return f"{self.split}:{row_index}"
        self.taken.add(stem)
        return stem
