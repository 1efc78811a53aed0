#!/usr/bin/env bash
# Set up a GPU machine without network for `make gpu-check PY=python3` (docs/gpu.md).
#
# Expects a Python (PY, default python3) that already has a CUDA torch, sacrebleu,
# sentencepiece, numpy, pyyaml and pytest, and the wheels `make gpu-wheels` downloaded
# into .whl/ (carried along with the checkout). Installs, offline, into that Python:
# fairseq-fixed, hydra-core, omegaconf, antlr4-python3-runtime and bitarray (each only where
# that version is not installed yet); from .whl/optional/ only what is missing (pytest,
# pyyaml, pytest's needs, and setuptools / wheel, which pip needs to install a project
# from its source: Python 3.12 environments come without setuptools, and offline pip cannot
# fetch it); then this project, editable, without dependencies. Safe to run again: a second
# run installs nothing and takes seconds.
#
#   bash scripts/gpu_machine_setup.sh && make gpu-check PY=python3
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
WHEELS=${WHEELS:-.whl}
say() { echo "[gpu-setup] $*" >&2; }
start=$(date +%s)

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
# offline, no dependency resolution, no byte-compiling of every installed file (most of pip's time)
PIP=("$PY" -m pip install -q --no-index --no-deps --no-cache-dir --no-compile --disable-pip-version-check)

# the wheels whose distribution is not installed at that version (names and versions from the file names)
missing() {
    "$PY" - "$@" <<'EOF'
import importlib.metadata as md, os, sys
for path in sys.argv[1:]:
    name, version = os.path.basename(path).split("-")[:2]
    try:
        same = md.version(name) == version
    except md.PackageNotFoundError:
        same = False
    if not same:
        print(path)
EOF
}

mapfile -t todo < <(missing "${wheels[@]}")
if [ ${#todo[@]} -gt 0 ]; then
    say "installing ${#todo[@]} of ${#wheels[@]} wheels from $WHEELS/ into $("$PY" -c 'import sys; print(sys.prefix)')"
    "${PIP[@]}" --upgrade "${todo[@]}"
else
    say "the ${#wheels[@]} wheels of $WHEELS/ are installed already"
fi

for wheel in "$WHEELS"/optional/*.whl; do
    name=$(basename "$wheel" | cut -d- -f1)
    if ! "$PY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$name" 2>/dev/null; then
        say "installing $name (missing here)"
        "${PIP[@]}" "$wheel"
    fi
done

say "installing realformer-nmt (editable, no dependencies, no build isolation: offline)"
if ! "${PIP[@]}" --no-build-isolation -e . ; then
    # pip could not build it (no setuptools here, and none in $WHEELS/optional/): what an
    # editable install does for imports, by hand
    site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$PWD" > "$site/realformer_nmt_checkout.pth"
    say "pip install -e . failed (its error is above); put $PWD on the path instead ($site/realformer_nmt_checkout.pth):"
    say "the plugin and python -m tools work, the realformer-* console commands are not installed"
fi

# checked from another folder: an import that works only from the checkout would not count
here=$PWD
(cd / && "$PY" - "$here" <<'EOF'
import os, sys
import torch, fairseq, sacrebleu, sentencepiece, yaml, pytest  # noqa: F401,E401
import realformer_nmt
if os.path.dirname(os.path.dirname(os.path.abspath(realformer_nmt.__file__))) != os.path.abspath(sys.argv[1]):
    sys.exit(f"[gpu-setup] error: realformer_nmt imports from {realformer_nmt.__file__}, not from {sys.argv[1]}")
tool = os.path.join(os.path.dirname(sys.executable), "fairseq-train")
if not os.path.exists(tool):
    sys.exit(f"[gpu-setup] error: {tool} missing: fairseq's console scripts must sit next to {sys.executable}")
cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "NO CUDA DEVICE"
print(f"[gpu-setup] ready: python {sys.version.split()[0]}, torch {torch.__version__}, fairseq "
      f"{fairseq.__version__}, realformer_nmt from {os.path.dirname(realformer_nmt.__file__)}, {cuda}",
      file=sys.stderr)
EOF
)
say "set-up took $(( $(date +%s) - start ))s"
