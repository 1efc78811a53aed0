#!/usr/bin/env bash
# Everything a GPU must show, in one call sized for a short GPU session (docs/gpu.md): set-up, then
# `python -m realformer_tools.experiments.gpu_check`, whose sections run in priority order (the
# triton tests on CUDA, the speed rows, exactness, training in fp32/fp16/bf16, two DDP ranks),
# each within its own deadline, the whole within what is left of BUDGET seconds. Everything is
# written under $OUT. Call it again with the same checkout (the work folder kept) and it goes on
# with the sections the first call did not finish.
#
#   OUT=/path bash scripts/gpu_device_run.sh              # on the GPU machine (a device command)
#   OUT=/tmp/dry bash scripts/gpu_device_run.sh --dry-run # the same steps on the CPU, tiny shapes
#
# BUDGET (default 570 s: one device command may run 600 s) covers set-up and the sections.
# PY: the interpreter (default python3 on the GPU machine, the running venv's or python3 dry).
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=""
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY="--dry-run" ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "gpu_device_run.sh: error: unknown argument $arg (only --dry-run)" >&2; exit 2 ;;
    esac
done
export PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu_check/out}
BUDGET=${BUDGET:-570}
PY=${PY:-python3}
mkdir -p "$OUT"
start=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - start) )); }
stamp() { echo "[gpu_device_run] $(date -u +%H:%M:%S) +$(( $(date +%s) - start ))s $*" | tee -a "$OUT/steps.txt" >&2; }

git log -1 --format='code %H %s' > "$OUT/env.txt" 2>/dev/null || true
if [ -n "$DRY" ]; then
    stamp "set-up: skipped (dry run: this interpreter has everything)"
else
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; "$PY" -V; } >> "$OUT/env.txt" 2>&1
    stamp "set-up (deadline 60 s)"
    if ! PY="$PY" timeout 60 bash scripts/gpu_machine_setup.sh > "$OUT/setup.log" 2>&1; then
        stamp "set-up failed: $OUT/setup.log"; tail -20 "$OUT/setup.log" >&2; exit 3
    fi
fi
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" \
    >> "$OUT/env.txt" 2>&1 || true
stamp "sections (budget $(( $(left) - 15 )) s)"
timeout $(( $(left) - 5 )) "$PY" -m realformer_tools.experiments.gpu_check $DRY --out "$OUT" \
    --work "${WORK:-$(dirname "$OUT")/work}" --budget $(( $(left) - 15 )) 2> "$OUT/gpu_check.log"
code=$?
stamp "sections exit $code"
# the logs beside the JSON (no checkpoints or binarized data)
tar czf "$OUT/logs.tgz" --exclude='*.pt' --exclude='*.bin' --exclude='*.idx' --exclude='toy_en_de' \
    -C "${WORK:-$(dirname "$OUT")/work}" . 2>/dev/null || true
stamp "done"
tail -12 "$OUT/summary.md" 2>/dev/null | cut -c1-240
exit $code
