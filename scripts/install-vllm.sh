#!/usr/bin/env bash
# Installs the real vLLM (pinned) into a Python venv outside the clone, for the vLLM conformance
# and stand-in contract tests (docs/real-programs.md). Only vLLM's argument parser and argument
# checks are used; they run without a GPU (VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1).
#
#   scripts/install-vllm.sh            install, or reuse a valid install
#   scripts/install-vllm.sh --check    exit 0 when a valid install is present, 1 otherwise
#
# The venv is reused while its stamp file names the same vLLM and Python versions and vLLM still
# imports; otherwise it is removed and rebuilt (a fresh machine has none). The stamp is written
# last, so an interrupted install is never taken for a valid one.
#
# Environment: EVALCI_VLLM_VENV (default /var/cache/evalci/vllm-venv), EVALCI_VLLM_VERSION
# (default 0.33.0, the verified version), EVALCI_VLLM_PYTHON (default python3.11). Another declared
# version goes beside it: EVALCI_VLLM_VERSION=0.16.0 EVALCI_VLLM_VENV=/var/cache/evalci/vllm-0.16.0-venv
# (the venv the conformance test looks for, tests/src/vllm_oracle.rs; scripts/services.sh install
# installs both).
set -euo pipefail

VLLM_VERSION=${EVALCI_VLLM_VERSION:-0.33.0}
VENV=${EVALCI_VLLM_VENV:-/var/cache/evalci/vllm-venv}
PYTHON=${EVALCI_VLLM_PYTHON:-python3.11}
STAMP=$VENV/.evalci-stamp

log() { printf '[install-vllm %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v "$PYTHON" >/dev/null || die "$PYTHON not found on PATH (set EVALCI_VLLM_PYTHON)"
python_version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
expected_stamp="vllm==$VLLM_VERSION python==$python_version"

# The parser's import path touches no GPU and no hub with these set.
parser_env=(env VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1)

install_valid() {
  [[ -f $STAMP && $(cat "$STAMP") == "$expected_stamp" ]] || return 1
  "${parser_env[@]}" "$VENV/bin/python" - "$VLLM_VERSION" <<'PY' >/dev/null 2>&1
import importlib.metadata, sys
sys.exit(importlib.metadata.version("vllm") != sys.argv[1])
PY
}

if [[ ${1:-} == --check ]]; then
  install_valid
  exit
fi

mkdir -p "$(dirname "$VENV")"
# Two installs at once (parallel CI runs, a developer and CI) would build into the same venv.
exec 9>"$VENV.lock"
flock 9

start=$SECONDS
if install_valid; then
  log "vllm $VLLM_VERSION: reusing $VENV ($expected_stamp)"
  exit 0
fi

log "vllm $VLLM_VERSION: building $VENV with $PYTHON $python_version (about 9 GB, about 10 minutes)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
# uv downloads in parallel and hard-links from its cache: several times faster than pip for
# vLLM's ~9 GB of wheels (torch, CUDA libraries). It comes from PyPI like everything else.
"$VENV/bin/python" -m pip install --quiet --no-input uv
# Pins of a release that PyPI cannot satisfy, dropped for the parser's venv (uv's override with a
# marker that never holds removes the requirement). vLLM 0.34.0 pins flashinfer-python==0.7.3, which
# PyPI does not have (0.7.2.post1 and 0.7.4 are there), so uv finds no solution; flashinfer holds GPU
# kernels, never imported by the parser (docs/real-programs.md, "vLLM 0.34.0").
overrides=$(mktemp)
trap 'rm -f "$overrides"' EXIT
case $VLLM_VERSION in
  0.34.0) echo "flashinfer-python ; sys_platform == 'never'" >"$overrides" ;;
esac
# Native TLS: use the machine's CA store, as pip does here.
UV_NATIVE_TLS=1 "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" --override "$overrides" \
  "vllm==$VLLM_VERSION" || die "uv pip install vllm==$VLLM_VERSION failed"

log "vllm $VLLM_VERSION: checking that its serve parser loads"
# The tests' own checker (every vLLM version they support): it answers with the serve options.
answer=$(printf '{"options": true}\n' | "${parser_env[@]}" "$VENV/bin/python" \
  "$(dirname "${BASH_SOURCE[0]}")/../tests/vllm_argcheck/argcheck.py") || true
[[ $answer == *'"options"'* ]] || die "vllm installed but its serve parser does not load"
printf '%s\n' "$expected_stamp" >"$STAMP"
log "vllm $VLLM_VERSION: installed in $VENV in $((SECONDS - start))s"
