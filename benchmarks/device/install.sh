#!/usr/bin/env bash
# Sourced by the device calls that carry .whl2 and .stage/p1: the wheels the image lacks into
# /tmp/site, FlashInfer's prebuilt modules, and p1 staged in $HOME/stage for the calls after it.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl2/*.whl 2>&1 | tail -2
for f in .stage/p1/aot/*.so; do
    [ -e "$f" ] || continue
    n=$(basename "$f" .so); mkdir -p /tmp/site/flashinfer/data/aot/$n && cp "$f" /tmp/site/flashinfer/data/aot/$n/$n.so
done
S=$HOME/stage; mkdir -p $S && cp -r .stage/p1/* $S/
