"""Input sources: turn what users point `batchscribe run` at into a stream of undecoded items.

Supported inputs (detected per input string, in this order):

- a glob (`*`, `?`, `[` and no such path): every match, sorted, is read as its own input;
- a `.parquet` file, read with pyarrow batch by batch (only the needed columns);
- a `.jsonl` / `.csv` / `.tsv` manifest (an audio path per row, optional id and text);
- an audio file (one item);
- a folder holding `dataset_info.json` or `state.json` (one split) or `dataset_dict.json`:
  a `datasets` `save_to_disk` folder, read with `load_from_disk`;
- a folder with a `README.md` and Parquet files or a `data/` folder: a hub-style dataset, read with
  `datasets.load_dataset(folder)`;
- any other folder with Parquet files: every `*.parquet` below it, sorted by relative path;
- a folder with `metadata.jsonl` / `metadata.csv` (the `audiofolder` convention): that manifest;
- a folder of audio files, recursive (depth first, names sorted in each folder); other files
  are skipped;
- anything else that looks like `name` or `owner/name`: a Hugging Face hub dataset id.

Audio is never decoded here: an item carries the encoded bytes or a path, so a broken file becomes
an error record later (`pool.decode_stream`) instead of stopping the run. Problems with the input
as a whole (missing path, missing column, nothing to read) raise `SourceError`.

Memory stays flat: every reader is a generator that holds at most one small Parquet batch or one
dataset row; the only state that grows is the set of ids seen (for the duplicate rule, `ids`).

Modules: `detect` (what an input is; `iter_source`), `parquet`, `hf_datasets`, `files` (audio
files, folders, manifests), `columns` (rows -> items), `ids` (duplicates, shards, limit), `items`
(the shared types).
"""

from __future__ import annotations

from batchscribe.audio.sources.detect import count_folder_items, iter_source
from batchscribe.audio.sources.files import AUDIO_EXTENSIONS, MANIFEST_EXTENSIONS, MANIFEST_PATH_COLUMNS
from batchscribe.audio.sources.ids import shard_of
from batchscribe.audio.sources.items import SourceError, SourceItem, SourceOptions

__all__ = [
    "AUDIO_EXTENSIONS", "MANIFEST_EXTENSIONS", "MANIFEST_PATH_COLUMNS", "SourceError", "SourceItem",
    "SourceOptions", "count_folder_items", "iter_source", "shard_of",
]
