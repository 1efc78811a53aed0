#!/usr/bin/env bash
# Set up a GPU machine without network for `make gpu-check PY=python3` (docs/gpu.md).
#
# Expects a Python (PY, default python3) that already has a CUDA torch, sacrebleu,
# sentencepiece, numpy, pyyaml and pytest, and the wheels `make gpu-wheels` downloaded
# into .whl/ (carried along with the checkout). Installs, offline, into that Python:
# fairseq-fixed, hydra-core, omegaconf, antlr4-python3-runtime and bitarray; from
# .whl/optional/ only what is missing (pytest, pyyaml and pytest's needs); then this
# project (editable, no dependencies). Safe to run again.
#
#   bash scripts/gpu_machine_setup.sh && make gpu-check PY=python3
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
WHEELS=${WHEELS:-.whl}
say() { echo "[gpu-setup] $*" >&2; }

shopt -s nullglob
wheels=("$WHEELS"/*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
    say "error: no wheels in $WHEELS/: run 'make gpu-wheels' on a machine that reaches PyPI and carry $WHEELS/ along"
    exit 1
fi
if ! "$PY" -c "import torch" 2>/dev/null; then
    say "error: $PY has no torch: install a CUDA build of torch first (docs/gpu.md)"
    exit 1
fi
PIP=("$PY" -m pip install -q --no-index --no-deps --no-cache-dir --disable-pip-version-check)

say "installing ${#wheels[@]} wheels from $WHEELS/ into $("$PY" -c 'import sys; print(sys.prefix)')"
"${PIP[@]}" --upgrade "${wheels[@]}"

for wheel in "$WHEELS"/optional/*.whl; do
    name=$(basename "$wheel" | cut -d- -f1)
    if ! "$PY" -m pip show -q "$name" >/dev/null 2>&1; then
        say "installing $name (missing here)"
        "${PIP[@]}" "$wheel"
    fi
done

say "installing realformer-nmt (editable, no dependencies)"
if ! "${PIP[@]}" --no-build-isolation -e . 2>/dev/null; then
    say "editable install failed; fine when run from this folder (python -m puts it on the path)"
fi

"$PY" - <<'EOF'
import os, sys
import torch, fairseq, sacrebleu, sentencepiece, yaml, pytest  # noqa: F401,E401
import realformer_nmt  # noqa: F401
tool = os.path.join(os.path.dirname(sys.executable), "fairseq-train")
if not os.path.exists(tool):
    sys.exit(f"[gpu-setup] error: {tool} missing: fairseq's console scripts must sit next to {sys.executable}")
cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "NO CUDA DEVICE"
print(f"[gpu-setup] ready: python {sys.version.split()[0]}, torch {torch.__version__}, fairseq "
      f"{fairseq.__version__}, {cuda}", file=sys.stderr)
EOF
