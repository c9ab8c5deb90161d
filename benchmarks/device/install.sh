#!/usr/bin/env bash
# Sourced by the device calls: the wheels the image lacks into /tmp/site, FlashInfer's prebuilt
# modules, and p1 staged in $HOME/stage for the calls after it. A later call on the same warm
# machine may carry neither .whl2 nor .stage/p1 (room for .stage/fa3 or data): what an earlier
# call installed and staged is then used as it is.
if [ -d .whl2 ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl2/*.whl 2>&1 | tail -2
elif [ ! -d /tmp/site/flashinfer ]; then
    echo "install.sh: no .whl2 carried and nothing installed on this machine: carry .whl2 .stage/p1 first" >&2
fi
source benchmarks/device/aot_modules.sh
S=$HOME/stage; mkdir -p $S
if [ -d .stage/p1 ]; then cp -r .stage/p1/* $S/; fi
if [ -d .stage/p1b ]; then cp -r .stage/p1b/* $S/; fi  # p1's base tokenizer alone (one-shot calls)
