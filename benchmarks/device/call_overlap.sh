#!/usr/bin/env bash
# Device call for issue 17's "encoder beside the decoder" (carry .stage/p6: base's tokenizer and the
# cuda-bindings wheels torch's green contexts import): overlap_probe.py on W2's engine, then W4's.
#   bash benchmarks/device/call_overlap.sh COMMIT ["<W2 probe args>" ["<W4 probe args>"]]
set -u
source benchmarks/device/env.sh
commit=$1
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit
python3 -c "import cuda.bindings" 2>/dev/null || \
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .stage/p6/*.whl 2>&1 | tail -2
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd benchmarks
timeout 240 python3 overlap_probe.py --tokenizer-from ../.stage/p6/basetok ${2:-} > $OUT/overlap_w2.txt 2>&1
echo "== W2"; grep -v Warning $OUT/overlap_w2.txt | tail -22 | cut -c1-300
if [ "${3:-}" != "-" ]; then  # "-": W2's probe only
    timeout 240 python3 overlap_probe.py --tokenizer-from ../.stage/p6/basetok --arch turbo --slots 512 ${3:-} > $OUT/overlap_w4.txt 2>&1
    echo "== W4"; grep -v Warning $OUT/overlap_w4.txt | tail -22 | cut -c1-300
fi
if [ -n "${W4_ARGS:-}" ]; then  # then W4 itself (carry .whl2 too for FlashInfer), e.g. with --tokens-from
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ../.whl2/*.whl 2>&1 | tail -2
    timeout 400 python3 w4_turbo.py --tokenizer-from ../.stage/p6/basetok $W4_ARGS > $OUT/w4.txt 2>&1
    echo "== W4 $W4_ARGS"; grep -E "^--tokens|^batchscribe|^Whisper generate|^GenerationMixin|capture|ratio|windows/s|Error" $OUT/w4.txt | cut -c1-300
    cp RESULTS.md $OUT/
fi
