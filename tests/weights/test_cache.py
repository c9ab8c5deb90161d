"""The converted-model cache: CT2 folders converted once, stale entries replaced, concurrent use."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from batchscribe.weights.aliases import ALIASES
from batchscribe.weights.ct2_convert import SOURCE_FILE
from batchscribe.weights.hf_folder import load_state_dict
from batchscribe.weights.resolve import resolve_model
from tests.weights.helpers import REPO_ROOT, installed_package_dirs, load_dims


def _tiny_en_package() -> Path:
    return installed_package_dirs("tiny.en")[0]


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
        from batchscribe.weights.resolve import resolve_model
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
