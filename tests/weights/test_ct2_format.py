"""Reading CTranslate2 model.bin: every byte round-trips, older binary versions parse.

Reference: an independent CT2 writer below (the format as CTranslate2's model_spec.py writes it).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch

from batchscribe.weights.ct2_format import Ct2FormatError, read_ct2
from tests.weights.helpers import ct2_pieces, installed_package_dirs, raw_bytes

_DTYPE_CODES = {torch.float32: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.float16: 4, torch.bfloat16: 5}


def write_ct2(
    path: Path,
    variables: dict[str, torch.Tensor],
    aliases: dict[str, str],
    version: int = 6,
    spec: str = "WhisperSpec",
    revision: int = 3,
) -> None:
    """Serialise like CTranslate2's ModelSpec.save (older binary versions included)."""
    out = bytearray(struct.pack("<I", version))

    def string(s: str) -> None:
        data = s.encode() + b"\0"
        out.extend(struct.pack("<H", len(data)) + data)

    if version >= 2:
        string(spec)
        out.extend(struct.pack("<I", revision))
    out.extend(struct.pack("<I", len(variables)))
    for name, t in variables.items():
        string(name)
        out.extend(struct.pack("<B", t.dim()) + struct.pack(f"<{t.dim()}I", *t.shape))
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        if version >= 4:
            out.extend(struct.pack("<BI", _DTYPE_CODES[t.dtype], len(raw)))
        else:  # item size, then an item count
            out.extend(struct.pack("<BI", t.element_size(), t.numel()))
        out.extend(raw)
    if version >= 3:
        out.extend(struct.pack("<I", len(aliases)))
        for alias, target in aliases.items():
            string(alias)
            string(target)
    path.write_bytes(bytes(out))


@pytest.mark.parametrize("name", ["tiny.en", "base"])
def test_reader_round_trips_every_byte(name: str, tmp_path: Path) -> None:
    pieces = ct2_pieces(installed_package_dirs(name))
    model = read_ct2(pieces)
    assert (model.binary_version, model.spec, model.revision) == (6, "WhisperSpec", 3)
    assert model.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    write_ct2(tmp_path / "model.bin", model.variables, model.aliases, model.binary_version, model.spec, model.revision)
    original = b"".join(p.read_bytes() for p in pieces)
    assert (tmp_path / "model.bin").read_bytes() == original


def test_old_binary_versions_parse(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    variables = {
        "encoder/conv1/weight": torch.randn(4, 3, 3, generator=g),
        "decoder/num_heads": torch.tensor(6, dtype=torch.int16),
        "decoder/pre_norm": torch.tensor(1, dtype=torch.int8),
    }
    aliases = {"decoder/projection/weight": "decoder/embeddings/weight"}
    for version in (1, 2, 3, 4, 6):
        path = tmp_path / f"v{version}.bin"
        write_ct2(path, variables, aliases, version=version)
        model = read_ct2([path])
        assert model.binary_version == version
        assert model.aliases == (aliases if version >= 3 else {})
        assert model.revision == (3 if version >= 2 else 1)
        assert model.variables.keys() == variables.keys()
        for k, v in variables.items():
            assert model.variables[k].dtype == v.dtype and torch.equal(model.variables[k], v), (version, k)
    # Before v4 a 2-byte item is read as int16 (CTranslate2's own rule): fp16 data keeps its bits.
    half = {"w": torch.randn(5, generator=g).half()}
    write_ct2(tmp_path / "v3h.bin", half, {}, version=3)
    got = read_ct2([tmp_path / "v3h.bin"]).variables["w"]
    assert got.dtype == torch.int16 and raw_bytes(got) == raw_bytes(half["w"])
    write_ct2(tmp_path / "v7.bin", variables, aliases, version=7)
    with pytest.raises(Ct2FormatError, match="binary_version 7"):
        read_ct2([tmp_path / "v7.bin"])
    data = (tmp_path / "v6.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[:-40])
    with pytest.raises(Ct2FormatError, match="truncated"):
        read_ct2([tmp_path / "cut.bin"])
