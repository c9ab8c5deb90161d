"""Model resolution (paths, cache, packages, hub cache) and safetensors-only loading."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from batchscribe.model.ct2 import SOURCE_FILE
from batchscribe.model.loading import (
    ALIASES,
    ModelFormatError,
    ModelNotFoundError,
    load_dims,
    load_state_dict,
    package_dirs,
    resolve_model,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def _tiny_en_package() -> Path:
    dirs = package_dirs(ALIASES["tiny.en"])
    if dirs is None:
        pytest.skip(f"{ALIASES['tiny.en'].pip_install} is not installed")
    return dirs[0]


def _run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter: huggingface_hub reads HF_HUB_* once, at import."""
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full_env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )


def test_hf_folder_path_is_used_in_place(tiny_en_dir: Path, tmp_path: Path) -> None:
    assert resolve_model(str(tiny_en_dir), cache_dir=tmp_path) == tiny_en_dir
    assert not (tmp_path / "converted").exists()


def test_ct2_path_is_converted_once_into_the_cache(tiny_en_dir: Path, tmp_path: Path) -> None:
    src = _tiny_en_package()
    out = resolve_model(str(src), cache_dir=tmp_path)
    assert out.parent == tmp_path / "converted" and out.name.startswith("ct2-")
    ref, got = load_file(str(tiny_en_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
    before = (out / "model.safetensors").stat()
    start = time.perf_counter()
    assert resolve_model(str(src), cache_dir=tmp_path) == out
    assert time.perf_counter() - start < 0.5  # a cache hit: no hashing, no conversion
    after = (out / "model.safetensors").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_alias_cache_hit_does_not_reconvert(tiny_en_dir: Path, model_cache: Path) -> None:
    before = (tiny_en_dir / "model.safetensors").stat()
    start = time.perf_counter()
    assert resolve_model("tiny.en", cache_dir=model_cache) == tiny_en_dir
    assert time.perf_counter() - start < 0.5
    after = (tiny_en_dir / "model.safetensors").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    source = json.loads((tiny_en_dir / SOURCE_FILE).read_text())
    assert {Path(f["path"]).name: f["sha256"] for f in source["files"]} == ALIASES["tiny.en"].pinned


def test_stale_alias_cache_is_replaced(tiny_en_dir: Path, tmp_path: Path) -> None:
    _tiny_en_package()
    stale = tmp_path / "converted" / "tiny.en"
    shutil.copytree(tiny_en_dir, stale)
    source = json.loads((stale / SOURCE_FILE).read_text())
    source["files"][0]["sha256"] = "f" * 64  # converted from some other release
    (stale / SOURCE_FILE).write_text(json.dumps(source))
    assert resolve_model("tiny.en", cache_dir=tmp_path) == stale
    fresh = json.loads((stale / SOURCE_FILE).read_text())
    assert fresh["files"][0]["sha256"] == ALIASES["tiny.en"].pinned["model.bin"]
    assert sorted(p.name for p in (tmp_path / "converted").iterdir()) == [".tiny.en.lock", "tiny.en"]


def test_concurrent_conversions_leave_one_valid_folder(tmp_path: Path) -> None:
    src = _tiny_en_package()
    code = f"""
        from batchscribe.model.loading import resolve_model
        print(resolve_model({str(src)!r}, cache_dir={str(tmp_path)!r}))
    """
    procs = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1]
    entries = sorted(p.name for p in (tmp_path / "converted").iterdir())
    assert [e for e in entries if not e.endswith(".lock")] == [Path(outs[0]).name]  # no temp dirs left
    assert load_dims(Path(outs[0])).n_vocab == 51864
    assert len(load_state_dict(Path(outs[0]))) == 168


def _hub_cache(root: Path, repo_id: str, source: Path, files: list[str]) -> Path:
    """The huggingface_hub cache layout: models--org--name/{blobs,snapshots/<rev>,refs/main}."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for i, name in enumerate(files):
        blob = repo / "blobs" / f"blob{i}"
        os.link(source / name, blob) if source.stat().st_dev == root.stat().st_dev else shutil.copy(source / name, blob)
        (snapshot / name).symlink_to(Path("../..") / "blobs" / blob.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def test_hub_id_is_served_from_the_offline_hf_cache(tiny_en_dir: Path, tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    files = [p.name for p in tiny_en_dir.iterdir() if p.suffix in (".json", ".safetensors") and p.name != SOURCE_FILE]
    snapshot = _hub_cache(hub, "openai/whisper-tiny.en", tiny_en_dir, files)
    pickle_only = _hub_cache(hub, "someone/pickled-whisper", tiny_en_dir, ["config.json"])
    (pickle_only / "pytorch_model.bin").write_bytes(b"not a pickle")  # must never be read
    code = f"""
        from batchscribe.model import loading
        from batchscribe.model.loading import ModelFormatError, ModelNotFoundError, resolve_model
        print(resolve_model("openai/whisper-tiny.en", cache_dir={str(tmp_path / 'bs')!r}))
        # An alias whose package is not installed falls back to its hub id.
        absent = loading.PackagePart("absent-pkg", "0", "absent_pkg_for_test", "model", ())
        loading.ALIASES["tiny.en"] = loading.Alias("tiny.en", (absent,), "openai/whisper-tiny.en")
        print(resolve_model("tiny.en", cache_dir={str(tmp_path / 'bs')!r}))
        for name in ("someone/pickled-whisper", "openai/whisper-large-v3"):
            try:
                resolve_model(name, cache_dir={str(tmp_path / 'bs')!r})
            except (ModelFormatError, ModelNotFoundError) as exc:
                print(type(exc).__name__, str(exc).splitlines()[0])
    """
    result = _run_python(code, {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub)})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert Path(lines[0]) == Path(lines[1]) == snapshot
    # A cached snapshot with only a pickled checkpoint is refused, never unpickled.
    assert lines[2].startswith("ModelFormatError") and "safetensors" in lines[2]
    assert lines[3].startswith("ModelNotFoundError") and "openai/whisper-large-v3" in lines[3]
    assert not (tmp_path / "bs").exists()


def test_unknown_name_lists_aliases_and_fixes(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("no such model!", cache_dir=tmp_path)  # not even a valid hub id: no network
    message = str(err.value)
    for alias in ALIASES.values():
        assert repr(alias.name) in message and alias.pip_install in message
    assert "CTranslate2" in message and "Hugging Face" in message


def test_pickle_only_folder_is_refused(tiny_en_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(tiny_en_dir / "config.json", folder)
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04 would run code if unpickled")
    for call in (lambda: resolve_model(str(folder), cache_dir=tmp_path), lambda: load_state_dict(folder)):
        with pytest.raises(ModelFormatError, match="pytorch_model.bin.*safetensors only"):
            call()


def test_folder_that_is_no_model_gives_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelFormatError, match="neither a Hugging Face Whisper folder"):
        resolve_model(str(tmp_path), cache_dir=tmp_path / "cache")
    with pytest.raises(ModelFormatError, match="is a file"):
        resolve_model(str(tmp_path / "notes.txt"), cache_dir=tmp_path / "cache")


def test_state_dict_matches_transformers_names(tiny_en_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    state = load_state_dict(tiny_en_dir)
    config = transformers.WhisperConfig.from_pretrained(tiny_en_dir)
    reference = transformers.WhisperForConditionalGeneration(config).state_dict()
    assert state.keys() == reference.keys()
    assert all(state[k].shape == reference[k].shape for k in state)
    assert state["proj_out.weight"] is state["model.decoder.embed_tokens.weight"]
    dims = load_dims(tiny_en_dir)
    assert (dims.n_mels, dims.n_vocab, dims.n_text_layer, dims.n_audio_head) == (80, 51864, 4, 6)


def test_sharded_safetensors_load(tiny_en_dir: Path, tmp_path: Path) -> None:
    full = load_file(str(tiny_en_dir / "model.safetensors"))
    keys = sorted(full)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    weight_map = {}
    for shard, names in shards.items():
        save_file({k: full[k] for k in names}, str(tmp_path / shard))
        weight_map.update({k: shard for k in names})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shutil.copy(tiny_en_dir / "config.json", tmp_path)
    state = load_state_dict(tmp_path)
    assert state.keys() == set(full) | {"proj_out.weight"}
    assert all(torch.equal(state[k], full[k]) for k in full)
    assert resolve_model(str(tmp_path), cache_dir=tmp_path / "cache") == tmp_path
