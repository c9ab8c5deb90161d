"""What pins a folder's records (`run_config.json`), and whether a run may add to them.

Each writer writes its own run config (`run_config.json`, or `run_config-<prefix>.json` for one
`--shard-index`), so writers sharing a folder never write one file. A run is compared with every
run config in the folder whose writer has committed records; records without any run config are
refused (nothing says how they were made). A refusal names only the keys that differ, with both
values, and the fix. A key this version added (the inputs' fingerprint, the weights' sha256, the
id scheme) is not compared with a folder that lacks it, so older folders still resume; everything
else must match, including a key recorded on one side only.

The inputs may grow: beside each run config the writer keeps its inputs' listing
(`run_inputs.json`), and when the fingerprint differs only by files added since, the run goes on
(the new files' items are new ids). A file changed or removed is refused by name.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from batchscribe.audio.sources.fingerprint import listing_changes
from batchscribe.config import DecodeOptions
from batchscribe.output.resume import ResumeConflictError, has_records
from batchscribe.output.writers import write_json_atomic

RUN_CONFIG_NAME = "run_config.json"
# Keys of the run config that must match for a run to continue a folder. Device, batch size,
# workers and limit may change between runs: they do not change what a record says.
IDENTITY_KEYS = ("model", "decode_options", "format", "inputs", "inputs_fingerprint", "source_options",
                 "num_shards", "id_scheme")  # fmt: skip
# How duplicate ids are named (audio/sources/ids.py). Earlier versions numbered them (`x#2`) and did
# not record this key.
ID_SCHEME = "origin"
# Recorded since issue 18 (the weights) and since batch invariance became CUDA's default (recorded
# off too): folders written before lack them and still resume.
ADDED_KEYS = frozenset({"engine.weights_sha256", "engine.batch_invariant"})
ENGINE_KEY = "engine"  # the resolved engine's identity: dtype, kernels, cross K/V, the weights' sha256
_CONFIG_FILE = re.compile(r"^run_config(-(?P<prefix>.+))?\.json$")
# What the user set for each key, named in a refusal instead of the key: the `run` flag, else a
# description. DecodeOptions fields without a flag are named as the Python API's (see `_label`).
FLAGS = {
    "model": "--model", "format": "--format", "inputs": "the inputs", "num_shards": "--num-shards",
    "decode_options.task": "--task", "decode_options.language": "--language",
    "decode_options.without_timestamps": "--without-timestamps", "decode_options.temperatures": "--temperature",
    "decode_options.word_timestamps": "--word-timestamps", "decode_options.initial_prompt": "--initial-prompt",
    "decode_options.condition_on_previous_text": "--condition-on-previous-text", "decode_options.vad": "--vad",
    "source_options.audio_column": "--audio-column", "source_options.id_column": "--id-column",
    "source_options.text_column": "--text-column", "source_options.prompt_column": "--prompt-column", "source_options.passthrough": "--passthrough",
    "source_options.config": "--config", "source_options.split": "--split", "engine.dtype": "--dtype",
    "engine.attention": "--attention / --cross-kv / --dtype", "engine.encoder_precision": "--encoder-precision",
    "engine.batch_invariant": "--batch-invariant / --no-batch-invariant",
    "engine.weights_sha256": "the model's weights (sha256)", "inputs_fingerprint": "the input files (fingerprint)",
}  # fmt: skip
# Said after a key's values where the flag alone does not explain the change.
NOTES = {"num_shards": "--gpus sets it too: its children split the ids into --num-shards x GPUs",
         "inputs_fingerprint": "the files changed since", "engine.weights_sha256": "the weights changed since"}  # fmt: skip


# Recorded only with word timestamps on: without them they change no record, and folders written
# before they existed (which lack the keys) resume as they are.
_WORD_OPTIONS = ("word_timestamps", "prepend_punctuations", "append_punctuations")


def decode_identity(options: DecodeOptions) -> dict[str, Any]:
    """The decoding options as the run config records them (what makes records comparable)."""
    found = dataclasses.asdict(options)
    if not options.word_timestamps:
        for key in _WORD_OPTIONS:
            found.pop(key)
    if options.initial_prompt is None:
        found.pop("initial_prompt")  # as before the option existed
    for flag in ("condition_on_previous_text", "vad"):  # off: as before the options existed
        if not found[flag]:
            found.pop(flag)
    return found


def run_config_name(prefix: str) -> str:
    return RUN_CONFIG_NAME if prefix == "records" else f"run_config-{prefix}.json"


def _listing_name(config_name: str) -> str:
    return config_name.replace("run_config", "run_inputs", 1)


def check_run_config(directory: Path, config: dict[str, Any], ignore: tuple[str, ...] = (),
                     listing: dict[str, str] | None = None) -> None:  # fmt: skip
    """Refuse to continue a folder whose records were made with other settings (`ignore`: keys
    this run may change, e.g. the inputs' fingerprint under --retry-errors). `listing`: this run's
    inputs listing, against which a changed fingerprint is explained (files only added: go on)."""
    for name, previous in _previous_configs(directory):
        skip = set(ignore)
        fingerprint = previous.get("inputs_fingerprint")
        same_inputs = _canon(previous.get("inputs")) == _canon(config.get("inputs"))  # else that is the difference
        if same_inputs and "inputs_fingerprint" not in skip and fingerprint not in (None, config.get("inputs_fingerprint")):
            if _inputs_only_grew(directory, name, listing):
                skip.add("inputs_fingerprint")
        pairs = [(key, previous.get(key), config.get(key)) for key in IDENTITY_KEYS
                 if key in previous and key not in skip]  # fmt: skip
        _refuse_differences(directory, name, pairs)


def _inputs_only_grew(directory: Path, name: str, listing: dict[str, str] | None) -> bool:
    """Whether the inputs differ from the recorded listing by added files only; refuses, naming
    them, when files were changed or removed. False when there is nothing to compare with."""
    path = Path(directory) / _listing_name(name)
    if listing is None or not path.is_file():
        return False
    try:
        before = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return False  # a damaged listing explains nothing: the fingerprints are compared as they are
    _, changed, removed = listing_changes(before, listing)
    if changed or removed:
        lines = [f"  {kind}: {', '.join(paths[:5])}" + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
                 for kind, paths in (("changed", changed), ("removed", removed)) if paths]  # fmt: skip
        raise ResumeConflictError(
            f"{directory} holds records of inputs that have changed since ({_listing_name(name)}):\n"
            + "\n".join(lines) + "\nTheir records no longer say what the inputs hold: choose another "
            "--output, or pass --overwrite to start again. If you repaired inputs whose items failed, "
            "rerun with --retry-errors. (Files only added since are fine: their items are transcribed.)"
        )
    return True


def check_id_scheme(directory: Path, completed: set[str]) -> None:
    """Refuse a folder from a version that numbered duplicate ids when it holds such ids: resuming
    would transcribe those items again under their new names."""
    numbered = sorted(i for i in completed if "#" in i)
    if not numbered:
        return
    for name, previous in _previous_configs(directory):
        if "id_scheme" not in previous:
            raise ResumeConflictError(
                f"{directory} was written by an earlier batchscribe ({name}) that numbered duplicate ids "
                f"(e.g. {numbered[0]!r}); this version names a duplicate by its own path or row, so a resume "
                "would transcribe those items again under new ids. Pass --overwrite to start again, or "
                "choose another --output"
            )


def check_engine_identity(directory: Path, identity: Any) -> None:
    """The same for the engine's resolved identity, checked once the model is loaded."""
    for name, previous in _previous_configs(directory):
        if ENGINE_KEY in previous:
            _refuse_differences(directory, name, [(ENGINE_KEY, previous[ENGINE_KEY], identity)])


def _previous_configs(directory: Path) -> list[tuple[str, dict[str, Any]]]:
    """(file name, run config) of every writer in `directory` that has committed records."""
    directory = Path(directory)
    if not has_records(directory):
        return []
    found: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(directory.iterdir()):
        m = _CONFIG_FILE.match(path.name)
        # run_config.json pins the whole folder: earlier versions wrote one for every writer.
        if m is None or (m.group("prefix") and not has_records(directory, m.group("prefix"))):
            continue
        try:
            found.append((path.name, json.loads(path.read_text(encoding="utf-8"))))
        except ValueError as exc:
            raise ResumeConflictError(
                f"{path} is not valid JSON ({exc}); pass --overwrite to start this directory afresh, "
                "or choose another --output"
            ) from exc
    if not found:
        raise ResumeConflictError(
            f"{directory} holds records but no run_config.json, so nothing says which model, inputs and "
            "options made them; resuming could mix records. Pass --overwrite to delete them and start "
            "again, or choose another --output"
        )
    return found


def differences(key: str, before: Any, now: Any) -> list[str]:
    """`--flag: before X, now Y` for each leaf that differs. A key in one only differs (a setting
    recorded only when it is not the default, e.g. an fp8 encoder), except a key this version
    added (`ADDED_KEYS`) that an older folder lacks."""
    if key == "decode_options" and isinstance(before, dict) and isinstance(now, dict):
        before, now = _decode_shown(before, now)
    if isinstance(before, dict) and isinstance(now, dict):
        keys = sorted(set(before) | set(now))
        return [d for k in keys if k in before or f"{key}.{k}" not in ADDED_KEYS
                for d in differences(f"{key}.{k}", before.get(k), now.get(k))]  # fmt: skip
    if _canon(before) == _canon(now):
        return []
    note = NOTES.get(key)
    if key == "num_shards" and isinstance(before, int) and before > 1:  # e.g. --retry-errors on one part's folder
        note = (f"the folder was written in {before} parts: rerun each part with --num-shards {before} "
                f"--shard-index K, K = 0..{before - 1}; {note}")  # fmt: skip
    return [f"  {_label(key)}: before {_show(before)}, now {_show(now)}" + (f" ({note})" if note else "")]


def _label(key: str) -> str:
    """What the user set: a flag, else (a DecodeOptions field without one) the Python API's name."""
    if key in FLAGS:
        return FLAGS[key]
    group, _, field = key.partition(".")
    if group == "decode_options" and field in {f.name for f in dataclasses.fields(DecodeOptions)}:
        return f"DecodeOptions.{field} (Python API)"
    return key


def _decode_shown(before: dict[str, Any], now: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both sides with the defaults that decode_identity leaves out filled in (so an option turned
    on reads "before false", not "before null"); the punctuation options, recorded only with word
    timestamps, are left out when --word-timestamps itself changed."""
    defaults = dataclasses.asdict(DecodeOptions())
    omitted = {k: defaults[k] for k in ("word_timestamps", "initial_prompt", "condition_on_previous_text", "vad")}
    before, now = {**omitted, **before}, {**omitted, **now}
    if before["word_timestamps"] != now["word_timestamps"]:
        for side in (before, now):
            for k in _WORD_OPTIONS[1:]:
                side.pop(k, None)
    return before, now


def _refuse_differences(directory: Path, name: str, pairs: list[tuple[str, Any, Any]]) -> None:
    diffs = [d for key, before, now in pairs for d in differences(key, before, now)]
    if diffs:
        raise ResumeConflictError(
            f"{directory} already holds records made with other settings ({name}):\n" + "\n".join(diffs)
            + "\nResuming would mix them. To resume, rerun with the 'before' values; to keep both, choose "
            "another --output; to start again, pass --overwrite (it deletes the old records)."
        )


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _show(value: Any) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 300 else text[:300] + "..."


def write_run_config(directory: Path, config: dict[str, Any], prefix: str = "records",
                     listing: dict[str, str] | None = None) -> None:  # fmt: skip
    """The run config, and beside it the inputs' listing (written first: a config never points at
    an older listing)."""
    if listing is not None:
        write_json_atomic(Path(directory) / _listing_name(run_config_name(prefix)), listing)
    write_json_atomic(Path(directory) / run_config_name(prefix), config)
