#!/usr/bin/env bash
# The one device call of 2026-11-28 (one H100, 15 device-minutes for the session): set-up, the
# triton kernel's tests on CUDA, the quick check's speed benchmark (the same command the quick
# check runs, so that its 75 s reservation cannot cut it; the quick check then reads its JSON,
# as it does when resuming), then the quick check. Every step gets what is left of 570 s.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
start=$(date +%s)
left() { echo $(( 570 - ($(date +%s) - start) )); }
stamp() { echo "[run.sh] $(date -u +%H:%M:%S) +$(( $(date +%s) - start ))s $*" | tee -a "$OUT/env.txt"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -V;
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"; } >> "$OUT/env.txt" 2>&1
git log -1 --format='code %H %s' >> "$OUT/env.txt" 2>/dev/null || true
stamp "set-up"
bash scripts/gpu_machine_setup.sh > "$OUT/setup.log" 2>&1 || { stamp "set-up failed"; tail -20 "$OUT/setup.log"; exit 3; }
stamp "pytest tests/test_triton_kernel.py (limit 75 s)"
timeout 75 python3 -m pytest tests/test_triton_kernel.py -q -rfEs --maxfail=5 --durations=8 -p no:cacheprovider > "$OUT/triton_tests.log" 2>&1
stamp "pytest exit $?"
mkdir -p runs/gpu_check
stamp "speed benchmark (limit 150 s)"
timeout 150 python3 scripts/benchmark_speed.py --device cuda --dtype float16 --sizes base --lengths 128,512 \
  --alternations 11 --warmup 1 --decode-alternations 1 --variants vanilla,auto,materialized,fused,bias,triton \
  --json runs/gpu_check/quick_speed_float16.json > runs/gpu_check/quick_speed_float16.log 2>&1
stamp "speed exit $?"
stamp "quick check (limit $(( $(left) - 12 )) s)"
timeout $(( $(left) - 12 )) make gpu-check PY=python3 GPU_CHECK_ARGS=--quick > "$OUT/quick.log" 2>&1
stamp "quick exit $?"
cp results/gpu/quick.json results/gpu/summary.md "$OUT/" 2>/dev/null
cp runs/gpu_check/quick_speed_float16.json "$OUT/" 2>/dev/null
tar czf "$OUT/logs.tgz" --exclude='*.pt' --exclude='*.bin' --exclude='*.idx' runs/gpu_check 2>/dev/null
stamp "done"
tail -3 "$OUT/triton_tests.log"; tail -25 "$OUT/quick.log"
