"""The run config check: a refusal names only the keys that differ, with both values and the fix;
records without a run config are refused; a key an older version did not write is not compared;
writers of one folder each write their own run config and are compared with every other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchscribe.output.identity import check_engine_identity, check_run_config, write_run_config
from batchscribe.output.resume import ResumeConflictError, output_prefix
from tests.output.test_resume import commit, rec

BASE: dict[str, Any] = {
    "model": "tiny.en", "format": "jsonl", "inputs": ["/data/a.parquet"], "inputs_fingerprint": "f1",
    "decode_options": {"language": None, "temperatures": [0.0, 0.2], "seed": 0}, "source_options": {},
    "num_shards": 1, "engine": {"dtype": "float32", "attention": "sdpa/sdpa/float32", "weights_sha256": "aa"},
}  # fmt: skip


def test_a_refusal_names_only_the_differing_keys(tmp_path: Path) -> None:
    write_run_config(tmp_path, BASE)
    commit(tmp_path, [rec(0)])
    changed = {**BASE, "decode_options": {**BASE["decode_options"], "temperatures": [0.0]}, "inputs_fingerprint": "f2"}
    with pytest.raises(ResumeConflictError) as err:
        check_run_config(tmp_path, changed)
    lines = str(err.value).splitlines()
    assert lines[1:3] == ["  --temperature: before [0.0, 0.2], now [0.0]",
                          '  the input files (fingerprint): before "f1", now "f2" (the files changed since)']
    assert "seed" not in str(err.value) and "language" not in str(err.value)  # not a dump of both
    assert "another --output" in lines[-1] and "--overwrite" in lines[-1]
    check_run_config(tmp_path, changed | {"decode_options": BASE["decode_options"]}, ignore=("inputs_fingerprint",))
    with pytest.raises(ResumeConflictError, match=r'the model\'s weights \(sha256\): before "aa", now "bb" \(the weights changed since\)'):
        check_engine_identity(tmp_path, {**BASE["engine"], "weights_sha256": "bb"})


def test_records_without_a_run_config_are_refused(tmp_path: Path) -> None:
    commit(tmp_path, [rec(0)])
    with pytest.raises(ResumeConflictError, match="holds records but no run_config.json.*--overwrite.*another --output"):
        check_run_config(tmp_path, BASE)
    (tmp_path / "run_config.json").write_text("{not json")
    with pytest.raises(ResumeConflictError, match="run_config.json is not valid JSON"):
        check_run_config(tmp_path, BASE)


def test_a_folder_from_an_earlier_version_still_resumes(tmp_path: Path) -> None:
    old = {k: v for k, v in BASE.items() if k not in ("inputs_fingerprint", "engine")}
    write_run_config(tmp_path, {**old, "engine": {"dtype": "float32", "attention": "sdpa/sdpa/float32"}})
    commit(tmp_path, [rec(0)])
    check_run_config(tmp_path, BASE)  # no fingerprint then: not compared
    check_engine_identity(tmp_path, BASE["engine"])  # no weights hash then: not compared
    with pytest.raises(ResumeConflictError, match='--dtype: before "float32", now "float16"'):
        check_engine_identity(tmp_path, {**BASE["engine"], "dtype": "float16"})


def test_batch_invariance_is_compared_only_where_the_folder_recorded_it(tmp_path: Path) -> None:
    """Folders written before it became CUDA's default lack the key (it was recorded only when on)
    and resume either way; since then it is recorded on and off, and a change is refused by name."""
    old = tmp_path / "old"
    old.mkdir()
    write_run_config(old, BASE)
    commit(old, [rec(0)])
    for invariant in (True, False):
        check_engine_identity(old, {**BASE["engine"], "batch_invariant": invariant})
    for before, now in ((True, False), (False, True)):
        new = tmp_path / str(before)
        new.mkdir()
        write_run_config(new, {**BASE, "engine": {**BASE["engine"], "batch_invariant": before}})
        commit(new, [rec(0)])
        check_engine_identity(new, {**BASE["engine"], "batch_invariant": before})
        message = f"--batch-invariant / --no-batch-invariant: before {str(before).lower()}, now {str(now).lower()}"
        with pytest.raises(ResumeConflictError, match=message):
            check_engine_identity(new, {**BASE["engine"], "batch_invariant": now})


def test_each_writer_is_compared_with_every_other(tmp_path: Path) -> None:
    prefixes = [output_prefix(2, k) for k in range(2)]
    write_run_config(tmp_path, {**BASE, "num_shards": 2}, prefixes[0])
    assert (tmp_path / f"run_config-{prefixes[0]}.json").is_file()
    check_run_config(tmp_path, {**BASE, "num_shards": 2, "model": "base"})  # its writer has no records yet
    commit_prefix(tmp_path, prefixes[0])
    with pytest.raises(ResumeConflictError, match=f"(?s)run_config-{prefixes[0]}.json.*model: before"):
        check_run_config(tmp_path, {**BASE, "num_shards": 2, "model": "base"})
    # A run of the whole folder (e.g. --retry-errors without the part's flags) is told how to rerun the parts
    with pytest.raises(ResumeConflictError, match=r"--num-shards: before 2, now 1 \(the folder was written in 2 "
                                                  r"parts: rerun each part with --num-shards 2 --shard-index K, "
                                                  r"K = 0..1; --gpus sets it too"):
        check_run_config(tmp_path, BASE)


def commit_prefix(directory: Path, prefix: str) -> None:
    from batchscribe.output.resume import open_output
    from batchscribe.output.writers import ShardWriter

    state = open_output(directory, "jsonl", prefix)
    w = ShardWriter(directory, "jsonl", prefix, on_commit=state.on_commit)
    w.add(rec(9))
    w.flush()
    assert json.loads((directory / f"_manifest-{prefix}.ndjson").read_text())["ids"] == ["u9"]


def test_numbered_duplicate_ids_of_an_earlier_version_are_refused(tmp_path: Path) -> None:
    from batchscribe.output.identity import check_id_scheme

    write_run_config(tmp_path, {k: v for k, v in BASE.items() if k != "inputs_fingerprint"})  # no id_scheme
    commit(tmp_path, [rec(0)])
    check_id_scheme(tmp_path, {"u0"})  # no duplicate ids there: it resumes
    with pytest.raises(ResumeConflictError, match="numbered duplicate ids \\(e.g. 'x#2'\\).*--overwrite"):
        check_id_scheme(tmp_path, {"u0", "x#2"})
    write_run_config(tmp_path, {**BASE, "id_scheme": "origin"})
    check_id_scheme(tmp_path, {"u0", "x#x.flac"})


def test_a_setting_recorded_only_when_not_the_default_is_compared(tmp_path: Path) -> None:
    """E.g. an fp8 encoder appears in the identity only when chosen: its appearing is a change."""
    write_run_config(tmp_path, BASE)
    commit(tmp_path, [rec(0)])
    with pytest.raises(ResumeConflictError, match='--encoder-precision: before null, now "fp8"'):
        check_engine_identity(tmp_path, {**BASE["engine"], "encoder_precision": "fp8"})
    with pytest.raises(ResumeConflictError, match='decode_options.prompt: before null, now "hi"'):
        check_run_config(tmp_path, {**BASE, "decode_options": {**BASE["decode_options"], "prompt": "hi"}})


def test_inputs_may_grow_but_not_change(tmp_path: Path) -> None:
    """A folder input that gained files since goes on (the new files' items are new ids); a file
    changed or removed since is refused by name. Real files, fingerprinted as run() does."""
    from batchscribe.audio.sources.fingerprint import fingerprint_of, inputs_listing

    data, out = tmp_path / "in", tmp_path / "out"
    data.mkdir()
    for name in ("a.flac", "b.flac"):
        (data / name).write_bytes(b"x" * 10)

    def config() -> tuple[dict[str, Any], dict[str, str]]:
        listing = inputs_listing([str(data)])
        return {**BASE, "inputs": [str(data)], "inputs_fingerprint": fingerprint_of([str(data)], listing)}, listing

    first, listing = config()
    out.mkdir()
    write_run_config(out, first, listing=listing)
    commit(out, [rec(0)])
    assert json.loads((out / "run_inputs.json").read_text()) == listing and len(listing) == 2
    (data / "c.flac").write_bytes(b"y" * 5)
    grown, grown_listing = config()
    assert grown["inputs_fingerprint"] != first["inputs_fingerprint"]
    check_run_config(out, grown, listing=grown_listing)  # only added: goes on
    with pytest.raises(ResumeConflictError, match=r"the input files \(fingerprint\)"):
        check_run_config(out, grown)  # without a listing to explain it, a new fingerprint is refused
    (data / "a.flac").write_bytes(b"x" * 11)
    (data / "b.flac").unlink()
    changed, changed_listing = config()
    with pytest.raises(ResumeConflictError) as err:
        check_run_config(out, changed, listing=changed_listing)
    text = str(err.value)
    assert f"changed: {data / 'a.flac'}" in text and f"removed: {data / 'b.flac'}" in text
    assert "c.flac" not in text and "--overwrite" in text and "another\n--output" not in text


def test_word_timestamps_enter_the_identity_only_when_on(tmp_path: Path) -> None:
    import dataclasses

    from batchscribe.config import DecodeOptions
    from batchscribe.output.identity import decode_identity

    off, on = DecodeOptions(), DecodeOptions(word_timestamps=True)
    # Off: exactly what versions before word timestamps recorded, so their folders resume.
    assert decode_identity(off) == {k: v for k, v in dataclasses.asdict(off).items()
                                    if k not in ("word_timestamps", "prepend_punctuations", "append_punctuations",
                                                 "initial_prompt", "condition_on_previous_text", "vad")}
    write_run_config(tmp_path, {**BASE, "decode_options": decode_identity(off)})
    commit(tmp_path, [rec(0)])
    check_run_config(tmp_path, {**BASE, "decode_options": json.loads(json.dumps(decode_identity(off)))})
    with pytest.raises(ResumeConflictError, match=r"--word-timestamps: before false, now true"):
        check_run_config(tmp_path, {**BASE, "decode_options": json.loads(json.dumps(decode_identity(on)))})


def test_an_initial_prompt_enters_the_identity_only_when_set(tmp_path: Path) -> None:
    from batchscribe.config import DecodeOptions
    from batchscribe.output.identity import decode_identity

    assert "initial_prompt" not in decode_identity(DecodeOptions())
    write_run_config(tmp_path, {**BASE, "decode_options": decode_identity(DecodeOptions())})
    commit(tmp_path, [rec(0)])
    prompted = json.loads(json.dumps(decode_identity(DecodeOptions(initial_prompt="Names: Kenobi."))))
    with pytest.raises(ResumeConflictError, match=r'--initial-prompt: before null, now "Names: Kenobi."'):
        check_run_config(tmp_path, {**BASE, "decode_options": prompted})


def test_conditioning_enters_the_identity_only_when_on(tmp_path: Path) -> None:
    from batchscribe.config import DecodeOptions
    from batchscribe.output.identity import decode_identity

    assert "condition_on_previous_text" not in decode_identity(DecodeOptions())
    write_run_config(tmp_path, {**BASE, "decode_options": decode_identity(DecodeOptions())})
    commit(tmp_path, [rec(0)])
    on = json.loads(json.dumps(decode_identity(DecodeOptions(condition_on_previous_text=True))))
    with pytest.raises(ResumeConflictError, match=r"--condition-on-previous-text: before false, now true"):
        check_run_config(tmp_path, {**BASE, "decode_options": on})


def test_a_refusal_names_what_the_user_set_not_the_run_configs_keys(tmp_path: Path) -> None:
    """Turning --word-timestamps on reads as that flag going from false to true, not as three
    internal keys from null (the punctuation options are recorded only with it); an option only
    the Python API sets is named as DecodeOptions' field; both values and the three ways out."""
    from batchscribe.config import DecodeOptions
    from batchscribe.output.identity import decode_identity

    def config(**decode: Any) -> dict[str, Any]:
        return {**BASE, "decode_options": json.loads(json.dumps(decode_identity(DecodeOptions(**decode))))}

    write_run_config(tmp_path, config())
    commit(tmp_path, [rec(0)])
    with pytest.raises(ResumeConflictError) as err:
        check_run_config(tmp_path, config(word_timestamps=True, language="en"))
    lines = str(err.value).splitlines()
    assert lines[1:-1] == ['  --language: before null, now "en"', "  --word-timestamps: before false, now true"]
    assert lines[-1] == ("Resuming would mix them. To resume, rerun with the 'before' values; to keep both, choose "
                         "another --output; to start again, pass --overwrite (it deletes the old records).")
    write_run_config(tmp_path, config(word_timestamps=True))
    with pytest.raises(ResumeConflictError) as err:
        check_run_config(tmp_path, config(word_timestamps=True, append_punctuations="。"))
    assert str(err.value).splitlines()[1] == (
        '  DecodeOptions.append_punctuations (Python API): before "\\"\'.。,，!！?？:：”)]}、", now "。"')
