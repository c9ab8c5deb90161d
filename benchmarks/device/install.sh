#!/usr/bin/env bash
# Sourced by the device calls that carry .whl2 and .stage/p1: the wheels the image lacks into
# /tmp/site, FlashInfer's prebuilt modules, and p1 staged in $HOME/stage for the calls after it.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl2/*.whl 2>&1 | tail -2
source benchmarks/device/aot_modules.sh
S=$HOME/stage; mkdir -p $S && cp -r .stage/p1/* $S/
