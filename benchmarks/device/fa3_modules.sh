#!/usr/bin/env bash
# Sourced after install.sh: FlashInfer's FA3 prefill modules that an earlier call built (call_fa3.sh
# returns them as fa3.tgz; stage them flat in .stage/fa3 and carry it) go where FlashInfer loads
# prebuilt modules from, so the encoder's attention needs no JIT build (~75 s per dtype).
for f in .stage/fa3/*.so; do
    [ -e "$f" ] || continue
    n=$(basename "$f" .so); mkdir -p /tmp/site/flashinfer/data/aot/$n && cp "$f" /tmp/site/flashinfer/data/aot/$n/$n.so
done
