"""Random weights with a real checkpoint's tensor names, shapes and dtypes, for device calls that
measure start-up but cannot carry the weights beside everything else (a call carries 64 MiB).

    python random_weights.py --shapes-of model.safetensors --write shapes.json   (here)
    python random_weights.py --from shapes.json --out model.safetensors          (on the device)
"""

from __future__ import annotations

import argparse
import json

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes-of")
    ap.add_argument("--write")
    ap.add_argument("--from", dest="source")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.shapes_of:
        with safe_open(args.shapes_of, "pt") as f:
            shapes = {k: [list(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()] for k in f.keys()}
        with open(args.write, "w") as out:
            json.dump(shapes, out)
        return
    dtypes = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}
    gen = torch.Generator().manual_seed(0)
    with open(args.source) as f:
        shapes = json.load(f)
    tensors = {k: (torch.randn(shape, generator=gen) * 0.02).to(dtypes[dtype]) for k, (shape, dtype) in shapes.items()}
    save_file(tensors, args.out)


if __name__ == "__main__":
    main()
