"""Model resolution: paths, aliases in the cache, the hub cache, and the not-found message."""

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

from batchscribe.weights.aliases import ALIASES
from batchscribe.weights.ct2_convert import SOURCE_FILE
from batchscribe.weights.resolve import ModelFormatError, ModelNotFoundError, resolve_model
from tests.weights.helpers import REPO_ROOT


def _run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter: huggingface_hub reads HF_HUB_* once, at import."""
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full_env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )


def test_hf_folder_path_is_used_in_place(tiny_en_dir: Path, tmp_path: Path) -> None:
    assert resolve_model(str(tiny_en_dir), cache_dir=tmp_path) == tiny_en_dir
    assert not (tmp_path / "converted").exists()


def test_alias_cache_hit_does_not_reconvert(tiny_en_dir: Path, model_cache: Path) -> None:
    before = (tiny_en_dir / "model.safetensors").stat()
    start = time.perf_counter()
    assert resolve_model("tiny.en", cache_dir=model_cache) == tiny_en_dir
    assert time.perf_counter() - start < 0.5
    after = (tiny_en_dir / "model.safetensors").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    source = json.loads((tiny_en_dir / SOURCE_FILE).read_text())
    assert {Path(f["path"]).name: f["sha256"] for f in source["files"]} == ALIASES["tiny.en"].pinned


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
        from batchscribe.weights import aliases
        from batchscribe.weights.resolve import ModelFormatError, ModelNotFoundError, resolve_model
        print(resolve_model("openai/whisper-tiny.en", cache_dir={str(tmp_path / 'bs')!r}))
        # An alias whose package is not installed falls back to its hub id.
        absent = aliases.PackagePart("absent-pkg", "0", "absent_pkg_for_test", "model", ())
        aliases.ALIASES["tiny.en"] = aliases.Alias("tiny.en", (absent,), "openai/whisper-tiny.en")
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


def test_folder_that_is_no_model_gives_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelFormatError, match="neither a Hugging Face Whisper folder"):
        resolve_model(str(tmp_path), cache_dir=tmp_path / "cache")
    with pytest.raises(ModelFormatError, match="is a file"):
        resolve_model(str(tmp_path / "notes.txt"), cache_dir=tmp_path / "cache")


@pytest.mark.parametrize("name", ["./modles/tiny", "~/no-such-model-dir", "models/tiny", "whisper/model.safetensors",
                                  "model.bin", "C:\\models\\whisper", "a/b/c", "/no/such/whisper"])
def test_mistyped_paths_fail_at_once_naming_them(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name that can only be a path is never sent to the hub (models/ exists: models/tiny is a path)."""
    import batchscribe.weights.resolve as resolve

    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(resolve, "hub_snapshot", lambda repo_id: pytest.fail(f"hub asked for {repo_id!r}"))
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model(name, cache_dir=tmp_path / "cache")
    message = str(err.value)
    assert message.startswith(f"model path {name!r} does not exist") and "pass an alias" in message
    if name == "models/tiny":
        assert f"no 'tiny' in {tmp_path / 'models'}" in message


def test_only_owner_name_forms_are_hub_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import batchscribe.weights.resolve as resolve

    asked: list[str] = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(resolve, "hub_snapshot", lambda repo_id: (asked.append(repo_id), (None, "test"))[1])
    with pytest.raises(ModelNotFoundError, match="'openai/whisper-small': test"):
        resolve_model("openai/whisper-small", cache_dir=tmp_path / "cache")
    with pytest.raises(ModelNotFoundError, match="not an alias .* owner/name"):
        resolve_model("tiny", cache_dir=tmp_path / "cache")
    assert asked == ["openai/whisper-small"]
