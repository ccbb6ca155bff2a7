#!/usr/bin/env bash
# Everything refcheck runs on a lent GPU machine, in one call (see README "GPU runs"):
#   1. the property laws over our Triton kda/kda_gate and FLA's chunk_kda, Hypothesis profile `gpu`
#   2. benchmarks/kda.py: ours vs flash-linear-attention 0.6.0, with the roofline measured in the run
# Carry [".whl", ".gpu-wheels/a"]; results land in $OUT. Prints a short table last.
set -uo pipefail
OUT=${OUT:-/tmp/refcheck-gpu}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
source .gpu-wheels/a/device-install.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"

timeout "${PROPERTIES_S:-150}" python3 -m pytest properties -q -n 8 -p no:cacheprovider --device cuda \
  --hypothesis-profile gpu --op kda --op kda_gate --impl triton --impl fla -o addopts="" -rfEs \
  > "$OUT/gpu_properties.log" 2>&1
echo "properties exit $?" >> "$OUT/gpu_properties.log"

timeout "${BENCH_S:-240}" python3 benchmarks/kda.py --out "$OUT/kda_h200.json" > "$OUT/kda_bench.log" 2>&1
echo "benchmark exit $?" >> "$OUT/kda_bench.log"

echo "== properties (gpu profile) =="; grep -E "passed|failed|error|properties exit" "$OUT/gpu_properties.log" | tail -5
echo "== kda benchmark =="; tail -22 "$OUT/kda_bench.log"
