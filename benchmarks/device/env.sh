#!/usr/bin/env bash
# Sourced by every call script: Python as a user's install leaves it. The image sets
# PYTHONDONTWRITEBYTECODE=1 and its packages carry no .pyc files, so every process compiled torch's
# ~2,000 modules (and numpy's, Triton's, FlashInfer's) from source: seconds of each cold start that
# a pip install (which writes bytecode) or uv with --compile-bytecode does not pay (docs/GPU_NOTES.md).
# The bytecode goes under $HOME/pycache (PYTHONPYCACHEPREFIX), compiled once per machine.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=$HOME/pycache
if [ ! -e "$PYTHONPYCACHEPREFIX/.compiled" ]; then
    mkdir -p "$PYTHONPYCACHEPREFIX"
    site=$(python3 -c "import site; print(site.getsitepackages()[0])")
    python3 -m compileall -q -j 16 "$site" /tmp/site > /dev/null 2>&1
    touch "$PYTHONPYCACHEPREFIX/.compiled"
fi
# The host as this call finds it: a VM that ran the GPU suite before measured W1-CLI ~50 % slower
# than a fresh one (docs/GPU_NOTES.md, seventeenth session), so every call says what else runs.
echo "host: $(nproc) cores, up $(cut -d' ' -f1 /proc/uptime) s, load $(cut -d' ' -f1-3 /proc/loadavg);" \
    "busiest: $(ps -eo pcpu,comm --sort=-pcpu --no-headers | head -3 | tr -s ' ' | paste -sd, -)"
