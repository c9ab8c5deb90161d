"""Safety: weights are read only from safetensors, and input data never chooses where files go.

A pickled checkpoint can run code when loaded, so a folder holding only `pytorch_model.bin` is
refused without being opened (the test's pickle would leave a marker file if it ever ran). Item
ids come from the data; shard, manifest, summary and report names come from counters and fixed
names only, so ids such as `../../x` or `/etc/x` land inside records, never in paths.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from batchscribe.cli import app

PACKAGE = Path(__file__).resolve().parents[2] / "batchscribe"
WIDE = {"COLUMNS": "400"}
runner = CliRunner()


class _Marker:
    """Unpickling this creates a file: proof that a checkpoint was (wrongly) unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))


def test_pickle_only_checkpoint_is_refused_unopened(tmp_path: Path) -> None:
    folder = tmp_path / "whisper-pt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    marker = tmp_path / "UNPICKLED"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Marker(str(marker))))
    result = runner.invoke(app, ["run", "--demo", "-o", str(tmp_path / "out"), "--model", str(folder),
                                 "--device", "cpu", "--no-progress"], env=WIDE)
    assert result.exit_code == 2, result.output
    assert f"{folder} holds only pickled weights (pytorch_model.bin)" in result.output
    assert "loads safetensors only" in result.output and "safe_serialization=True" in result.output
    assert not marker.exists()


def test_hub_downloads_never_fetch_pickles() -> None:
    from batchscribe.weights.resolve import HUB_ALLOW_PATTERNS

    for name in ("pytorch_model.bin", "model.pt", "model.ckpt", "pytorch_model-00001-of-00002.bin",
                 "flax_model.msgpack", "tf_model.h5"):
        assert not any(fnmatch.fnmatch(name, p) for p in HUB_ALLOW_PATTERNS), name
    assert any(fnmatch.fnmatch("model.safetensors", p) for p in HUB_ALLOW_PATTERNS)


def test_package_never_unpickles() -> None:
    """No torch.load / pickle.load(s) / numpy allow_pickle anywhere in the package source."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                name = f"{owner.id if isinstance(owner, ast.Name) else '?'}.{node.func.attr}"
                if name in ("torch.load", "pickle.load", "pickle.loads", "dill.load", "joblib.load"):
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}")
            if isinstance(node, ast.keyword) and node.arg == "allow_pickle":
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} allow_pickle")
    assert offenders == []


EVIL_IDS = ["../../escaped", "/tmp/absolute-escape", "a/../../../b", "..", ".", "records-00000.jsonl",
            "_manifest.ndjson", "summary.json", "C:\\windows\\x", "nul\x00byte", "~/home-escape", "eval/../.."]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_ids_from_the_data_never_become_paths(tiny_en_dir: Path, tmp_path: Path, fmt: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    data.mkdir()
    src = data / "evil.parquet"
    pq.write_table(pa.table({"id": EVIL_IDS, "audio": [{"bytes": b"junk", "path": i} for i in EVIL_IDS],
                             "text": ["hello"] * len(EVIL_IDS)}), src)
    work = tmp_path / "work" / "deep"  # relative ids would resolve against this
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    before = sorted(p for p in Path("/tmp").iterdir() if "escape" in p.name)
    result = runner.invoke(app, ["run", str(src), "-o", "out", "--model", str(tiny_en_dir), "--device", "cpu",
                                 "--workers", "0", "--format", fmt, "--shard-size", "5", "--no-progress"],
                           env=WIDE)
    assert result.exit_code == 0, result.output
    out = work / "out"
    # Everything written is under OUT, with names from the writer's own scheme.
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    outside = [w for w in written if not w.startswith("work/deep/out/") and w != "data/evil.parquet"]
    assert outside == []
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(["_manifest.ndjson", f"records-00000.{fmt}", f"records-00001.{fmt}",
                            f"records-00002.{fmt}", "run_config.json", "run_inputs.json", "summary.json", "eval",
                            ".batchscribe.lock", ".batchscribe-records.lock", ".batchscribe-claims.lock",
                            ".batchscribe-records.claim.json"])  # the writer's locks and its claim
    assert sorted(p.name for p in (out / "eval").iterdir()) == ["report.html", "report.json", "report.md"]
    assert sorted(p for p in Path("/tmp").iterdir() if "escape" in p.name) == before
    # The ids are kept verbatim inside the records (the duplicates "." etc. are all distinct).
    manifest = [json.loads(line) for line in (out / "_manifest.ndjson").read_text().splitlines()]
    assert sorted(i for e in manifest for i in e["ids"]) == sorted(EVIL_IDS)
    assert os.listdir(work) == ["out"]
