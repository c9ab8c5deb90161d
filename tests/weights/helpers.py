"""Shared by the weights tests: the installed weight packages (skip when absent), raw bytes, dims."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from batchscribe.model.dims import ModelDims
from batchscribe.weights.aliases import ALIASES, package_dirs

REPO_ROOT = Path(__file__).resolve().parents[2]


def installed_package_dirs(name: str) -> list[Path]:
    dirs = package_dirs(ALIASES[name])
    if dirs is None:
        pytest.skip(f"{ALIASES[name].pip_install} is not installed")
    return dirs


def ct2_pieces(dirs: list[Path]) -> list[Path]:
    return sorted((p for d in dirs for p in d.glob("model.bin*")), key=lambda p: p.name)


def raw_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def load_dims(folder: Path) -> ModelDims:
    return ModelDims.from_hf_config(json.loads((folder / "config.json").read_text(encoding="utf-8")))
