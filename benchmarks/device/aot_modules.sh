#!/usr/bin/env bash
# Sourced by install.sh, and by calls that carry .stage/fa3 after call A's install: FlashInfer's
# modules built by earlier calls go where FlashInfer loads prebuilt ones from, so nothing is
# JIT-built. .stage/dec holds the decode modules (stage.sh, from .fiaot; .stage/p1/aot in older
# stagings); .stage/fa3 the FA3 prefill modules for the encoder (~75 s per dtype to build;
# call_fa3.sh returns them as fa3.tgz).
for f in .stage/p1/aot/*.so .stage/dec/*.so .stage/fa3/*.so; do
    [ -e "$f" ] || continue
    n=$(basename "$f" .so); mkdir -p /tmp/site/flashinfer/data/aot/$n && cp "$f" /tmp/site/flashinfer/data/aot/$n/$n.so
done
