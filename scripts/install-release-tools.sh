#!/usr/bin/env bash
# Installs what `scripts/release` and its checks need (docs/install.md "Release artifacts"):
# the aarch64 Rust target, the zig toolchain and cargo-zigbuild (pinned, in a Python venv outside
# the clone), and for the smoke checks qemu-user, the aarch64 glibc and binutils (readelf/objcopy).
#
#   scripts/install-release-tools.sh           install, or reuse a valid install
#   scripts/install-release-tools.sh --check   exit 0 when everything is there, 1 otherwise
#
# Environment: EVALCI_ZIG_VENV (default /var/cache/evalci/zig-venv). The venv's stamp names the
# pinned versions; it is written last, so an interrupted install is never taken for a valid one.
set -euo pipefail

# Pinned: both change their linker and libc stubs between releases.
ZIGLANG_VERSION=0.17.1
ZIGBUILD_VERSION=0.24.1
VENV=${EVALCI_ZIG_VENV:-/var/cache/evalci/zig-venv}
STAMP=$VENV/.evalci-stamp
EXPECTED_STAMP="ziglang==$ZIGLANG_VERSION cargo-zigbuild==$ZIGBUILD_VERSION"
APT_PACKAGES=(qemu-user libc6-arm64-cross binutils-aarch64-linux-gnu)

log() { printf '[install-release-tools %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

venv_valid() {
  [[ -f $STAMP && $(cat "$STAMP") == "$EXPECTED_STAMP" && -x $VENV/bin/cargo-zigbuild ]] \
    && "$VENV/bin/python3" -m ziglang version >/dev/null 2>&1
}
apt_missing() {
  local p
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
  done
}
target_missing() { ! rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; }

if [[ ${1:-} == --check ]]; then
  venv_valid && [[ -z $(apt_missing) ]] && ! target_missing
  exit
fi

start=$SECONDS
mapfile -t missing < <(apt_missing)
if [[ ${#missing[@]} -gt 0 ]]; then
  log "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install ${missing[*]} failed"
fi
if target_missing; then
  log "rustup target add aarch64-unknown-linux-gnu"
  rustup target add aarch64-unknown-linux-gnu || die "rustup target add aarch64-unknown-linux-gnu failed"
fi
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if venv_valid; then
  log "reusing $VENV ($EXPECTED_STAMP)"
else
  log "building $VENV ($EXPECTED_STAMP)"
  rm -rf "$VENV"
  python3 -m venv "$VENV" || die "python3 -m venv failed (apt-get install python3-venv)"
  "$VENV/bin/pip" install -q --disable-pip-version-check "ziglang==$ZIGLANG_VERSION" "cargo-zigbuild==$ZIGBUILD_VERSION" \
    || die "pip install ziglang cargo-zigbuild failed"
  echo "$EXPECTED_STAMP" >"$STAMP"
fi
log "release tools ready in $((SECONDS - start)) s"
