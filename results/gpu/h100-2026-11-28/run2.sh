#!/usr/bin/env bash
# The second device call of 2026-11-28 (what was left of the 15 minutes): the triton tests on
# CUDA now that the float64 ones run in float32 there (the first call stopped at five float64
# compile failures), the whole exactness section without the quick check's 45 s reservation
# (the plain and GELU models it cut), and one fp32 triton training alone (the compile time).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_out2}; mkdir -p "$OUT"
start=$(date +%s)
left() { echo $(( 320 - ($(date +%s) - start) )); }
stamp() { echo "[run2.sh] $(date -u +%H:%M:%S) +$(( $(date +%s) - start ))s $*" | tee -a "$OUT/env.txt"; }
git log -1 --format='code %H %s' >> "$OUT/env.txt" 2>/dev/null || true
stamp "set-up"
bash scripts/gpu_machine_setup.sh > "$OUT/setup.log" 2>&1 || { stamp "set-up failed"; tail -20 "$OUT/setup.log"; exit 3; }
stamp "pytest tests/test_triton_kernel.py (limit 90 s)"
timeout 90 python3 -m pytest tests/test_triton_kernel.py -q -rfEs -s --durations=10 -p no:cacheprovider > "$OUT/triton_tests.log" 2>&1
stamp "pytest exit $?"
stamp "exactness, every part (limit 150 s)"
timeout 150 python3 - > "$OUT/exactness.log" 2>&1 <<'PY'
import json, os, time
from realformer_tools.experiments import exactness as e
from realformer_tools.experiments.gpu_check.settings import QUICK_REAL
t = time.time()
checks = e.run("cuda", QUICK_REAL.exact, log=print)
json.dump(checks, open(os.path.join(os.environ["OUT"], "exactness.json"), "w"), default=str, indent=1)
print(f"exactness: {len(checks)} checks in {time.time() - t:.0f}s")
PY
stamp "exactness exit $?"
stamp "fp32 triton training alone (limit $(( $(left) - 8 )) s)"
timeout $(( $(left) - 8 )) fairseq-train data-bin/demo_en_de --user-dir realformer_nmt --arch realformer_transformer \
  --residual-attention-kernel triton --encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256 --decoder-embed-dim 256 \
  --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 --encoder-attention-heads 4 --decoder-attention-heads 4 \
  --share-all-embeddings --optimizer adam --adam-betas '(0.9,0.98)' --lr 1e-3 --lr-scheduler inverse_sqrt \
  --warmup-updates 100 --dropout 0.1 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 2048 \
  --max-update 300 --seed 1 --log-format simple --log-interval 10 --no-epoch-checkpoints --no-save \
  --save-dir /tmp/fp32-triton > "$OUT/train_fp32_triton.log" 2>&1
stamp "train exit $?"
stamp "done"
tail -4 "$OUT/triton_tests.log"; grep -E "float32 vs float64|checks in" "$OUT/exactness.log" | cut -c1-220; grep -E "num_updates|done training" "$OUT/train_fp32_triton.log" | cut -c1-160 | tail -4
