#!/usr/bin/env bash
# Everything a GPU must show, in one call sized for a short GPU session (docs/gpu.md): set-up, then
# `python -m realformer_tools.experiments.gpu_check`, whose sections run in priority order (the speed
# rows that decide the default at 32k tokens, exactness, fp16/bf16 training, two DDP ranks, the triton
# kernel's tests), each within its own deadline, the whole within what is left of BUDGET seconds.
# Call it again with the same checkout (the work folder kept) and it goes on with the sections the
# first call did not finish.
#
#   OUT=/path bash scripts/gpu_device_run.sh              # on the GPU machine (a device command)
#   OUT=/tmp/dry bash scripts/gpu_device_run.sh --dry-run # the same steps on the CPU, tiny shapes
#
# What to carry to a GPU machine without network: this checkout with .whl/, the wheels
# `make gpu-wheels` downloads on a machine with network (fairseq-fixed, hydra-core, omegaconf,
# antlr4-python3-runtime, bitarray; .whl/optional/: pytest, pyyaml, setuptools, wheel). .whl/ is
# ignored by git: a device tool that copies the working tree must be told to carry it (carry: [".whl"]).
#
# $OUT ends with four files: gpu_check.json (every section's record), summary.md, logs.tgz (the
# set-up, section and benchmark logs, the speed JSON, kernel_rule.json; no checkpoints) and steps.txt.
# BUDGET (default 570 s: one device command may run 600 s) covers set-up (at most 60 s) and the
# sections. PY: the interpreter (default python3 on the GPU machine, the running venv's or python3 dry).
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=""
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY="--dry-run" ;;
        -h|--help) sed -n '2,20p' "$0" | cut -c3-; exit 0 ;;
        *) echo "gpu_device_run.sh: error: unknown argument $arg (only --dry-run)" >&2; exit 2 ;;
    esac
done
export PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu_check/out}
WORK=${WORK:-$(dirname "$OUT")/work}
BUDGET=${BUDGET:-570}
SETUP=60
PY=${PY:-python3}
mkdir -p "$OUT" "$WORK"
start=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - start) )); }
stamp() { echo "[gpu_device_run] $(date -u +%H:%M:%S) +$(( $(date +%s) - start ))s $*" | tee -a "$OUT/steps.txt" >&2; }

git log -1 --format='code %H %s' > "$WORK/env.txt" 2>/dev/null || true
reserve=15  # packing the logs
if [ -n "$DRY" ]; then
    stamp "set-up: skipped (dry run: this interpreter has everything; its ${SETUP} s deadline is counted)"
    reserve=$(( reserve + SETUP ))
else
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; "$PY" -V; } >> "$WORK/env.txt" 2>&1
    stamp "set-up (deadline ${SETUP} s)"
    if ! PY="$PY" timeout "$SETUP" bash scripts/gpu_machine_setup.sh > "$WORK/setup.log" 2>&1; then
        stamp "set-up failed: $WORK/setup.log"; tail -20 "$WORK/setup.log" >&2
        tar czf "$OUT/logs.tgz" -C "$WORK" env.txt setup.log 2>/dev/null || true
        exit 3
    fi
fi
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" \
    >> "$WORK/env.txt" 2>&1 || true
budget=$(( $(left) - reserve ))
limit=$(( $(left) - 5 ))
if [ -n "$DRY" ]; then  # the CPU's wall clock is not the budget: the sections count their real deadlines
    limit=$(( 3 * BUDGET ))
fi
stamp "sections (budget $budget s)"
timeout "$limit" "$PY" -m realformer_tools.experiments.gpu_check $DRY --out "$OUT" --work "$WORK" \
    --budget "$budget" 2> "$WORK/gpu_check.log"
code=$?
stamp "sections exit $code"
# the logs (no checkpoints or binarized data) in one file beside the JSON
tar czf "$OUT/logs.tgz" --exclude='*.pt' --exclude='*.bin' --exclude='*.idx' --exclude='toy_en_de' \
    -C "$WORK" . 2>/dev/null || true
stamp "done"
tail -12 "$OUT/summary.md" 2>/dev/null | cut -c1-240
exit $code
