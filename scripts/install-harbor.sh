#!/usr/bin/env bash
# Installs the real Harbor (PyPI `harbor`, the version below) for the tests that use it as the oracle
# (docs/verification.md, "The real Harbor").
#
#   scripts/install-harbor.sh            build or reuse the root, write the wrapper
#   scripts/install-harbor.sh --check    exit 0 when an installed root is valid, 1 otherwise
#
# EVALCI_HARBOR_VERSION (default 0.25.0, the verified release) picks the release. The default release
# goes to $CACHE_DIR/harbor-root with the wrapper $CACHE_DIR/bin/harbor; any other release to a root of
# its own beside it, $CACHE_DIR/harbor-<version>-root with the wrapper $CACHE_DIR/bin/harbor-<version>
# (scripts/services.sh install builds 0.25.0 and 0.26.0; tests/src/harness.rs `real_harbors` finds them).
# EVALCI_HARBOR_ROOT and EVALCI_HARBOR_BIN override the paths.
#
# Harbor needs Python >= 3.12 and the CI machine kind is Debian 12 (Python 3.11), so Harbor lives in a
# Debian 13 root built with debootstrap from the Debian mirror this machine already uses, with
# Python 3.13, tmux (terminus-2 drives it) and a venv holding harbor from PyPI. The root sits outside
# the clone and is reused while its stamp names this version and this script's layout; a fresh machine
# builds it anew. Must run as root (debootstrap, chroot, mount).
#
# The wrapper ($EVALCI_HARBOR_BIN, default /var/cache/evalci/bin/harbor) runs `harbor` inside the root in
# a private mount namespace: /proc, /dev, /dev/pts, /sys, /tmp, the current directory and every
# directory in $EVALCI_HARBOR_BINDS (colon-separated) are bind-mounted at the same paths, so paths the
# caller passes mean the same inside. It execs all the way down, so the harbor process keeps the
# wrapper's pid and process group and receives the caller's signals directly.
set -euo pipefail

DEFAULT_HARBOR_VERSION=0.25.0
HARBOR_VERSION=${EVALCI_HARBOR_VERSION:-$DEFAULT_HARBOR_VERSION}
DEBIAN_SUITE=trixie
# Bump when the root's layout or contents change, so existing roots are rebuilt.
LAYOUT=1
CACHE_DIR=${EVALCI_CACHE_DIR:-/var/cache/evalci}
if [[ $HARBOR_VERSION == "$DEFAULT_HARBOR_VERSION" ]]; then
  ROOT=${EVALCI_HARBOR_ROOT:-$CACHE_DIR/harbor-root}
  BIN=${EVALCI_HARBOR_BIN:-$CACHE_DIR/bin/harbor}
else
  ROOT=${EVALCI_HARBOR_ROOT:-$CACHE_DIR/harbor-$HARBOR_VERSION-root}
  BIN=${EVALCI_HARBOR_BIN:-$CACHE_DIR/bin/harbor-$HARBOR_VERSION}
fi
STAMP_NAME=.evalci-harbor-stamp
STAMP_TEXT="harbor==$HARBOR_VERSION debian=$DEBIAN_SUITE layout=$LAYOUT"
VENV=/opt/harbor
# Debian packages in the root: python for the venv, tmux for terminus-2, bash/procps for the
# trials' commands, ca-certificates for pip.
ROOT_PACKAGES=python3,python3-venv,tmux,asciinema,procps,ca-certificates,bash

log() { printf '[install-harbor %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The mirror apt already uses for Debian's main archive (deb822 or one-line sources).
debian_mirror() {
  local uri
  uri=$(sed -n 's/^URIs:[[:space:]]*\(http[^[:space:]]*\/debian\)\/\?[[:space:]]*$/\1/p' \
    /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
  if [[ -z $uri ]]; then
    uri=$(sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\(http[^[:space:]]*\/debian\)\/\?[[:space:]].*/\2/p' \
      /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

root_valid() {
  [[ -f $ROOT/$STAMP_NAME && $(cat "$ROOT/$STAMP_NAME") == "$STAMP_TEXT" && -x $ROOT$VENV/bin/harbor \
    && -x $BIN ]]
}

# Runs a command inside a root under construction with the pseudo filesystems pip and dpkg need,
# in a private mount namespace so nothing stays mounted afterwards.
in_root() {
  local root=$1
  shift
  unshare --mount --propagation private -- /bin/sh -c '
    root=$1; shift
    mount --rbind /proc "$root/proc" && mount --rbind /dev "$root/dev" && mount --rbind /sys "$root/sys" || exit 1
    exec chroot "$root" "$@"
  ' sh "$root" "$@"
}

write_wrapper() {
  install -d -m 0755 "$(dirname "$BIN")"
  local tmp
  tmp=$(mktemp "$BIN.XXXXXX")
  cat >"$tmp" <<WRAPPER
#!/bin/sh
# Written by scripts/install-harbor.sh: runs harbor $HARBOR_VERSION inside $ROOT.
# Paths outside /tmp, the current directory and \$EVALCI_HARBOR_BINDS are not visible inside.
ROOT='$ROOT'
VENV='$VENV'
WRAPPER
  cat >>"$tmp" <<'WRAPPER'
[ -x "$ROOT$VENV/bin/harbor" ] || { echo "harbor: $ROOT is not installed (run scripts/install-harbor.sh)" >&2; exit 127; }
# Harbor would otherwise phone home and fetch LiteLLM's cost map; the CI machine has no internet.
HARBOR_TELEMETRY=0
LITELLM_LOCAL_MODEL_COST_MAP=True
export HARBOR_TELEMETRY LITELLM_LOCAL_MODEL_COST_MAP
exec unshare --mount --propagation private -- /bin/sh -c '
  root=$1; venv=$2; cwd=$3; shift 3
  bind() { mkdir -p "$root$1" 2>/dev/null; mount --rbind "$1" "$root$1" || exit 126; }
  # The root onto itself first, so that "/" inside is a mount point (mount namespaces made
  # inside, e.g. by tests/harbor_env/host_env.py, can then set its propagation).
  mount --bind "$root" "$root" || exit 126
  for d in /proc /dev /sys /tmp; do bind "$d"; done
  mountpoint -q "$root/dev/pts" || mount --bind /dev/pts "$root/dev/pts" || exit 126
  IFS=:
  for d in $EVALCI_HARBOR_BINDS; do [ -n "$d" ] && [ -d "$d" ] && bind "$d"; done
  unset IFS
  case $cwd in /) ;; /tmp|/tmp/*) ;; *) bind "$cwd" ;; esac
  exec chroot "$root" /usr/bin/env PATH="$venv/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin" \
    /bin/sh -c '"'"'cd "$1" || exit 126; shift; exec "$@"'"'"' sh "$cwd" "$venv/bin/harbor" "$@"
' sh "$ROOT" "$VENV" "$(pwd -P)" "$@"
WRAPPER
  chmod 0755 "$tmp"
  mv -f "$tmp" "$BIN"
}

build_root() {
  local mirror tmp
  mirror=$(debian_mirror)
  command -v debootstrap >/dev/null || {
    log "apt-get install debootstrap"
    apt-get update -qq || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >/dev/null \
      || die "apt-get install debootstrap failed"
  }
  install -d -m 0755 "$(dirname "$ROOT")"
  tmp="$ROOT.building"
  rm -rf --one-file-system "$tmp"
  log "debootstrap $DEBIAN_SUITE from $mirror into $tmp"
  debootstrap --variant=minbase --include="$ROOT_PACKAGES" "$DEBIAN_SUITE" "$tmp" "$mirror" >"$tmp.log" 2>&1 \
    || { tail -n 30 "$tmp.log" >&2; die "debootstrap failed (full log: $tmp.log)"; }
  # Name resolution and the local CAs the host trusts (a proxy's CA may be among them) for pip,
  # which reads the system trust store.
  cp -L /etc/resolv.conf "$tmp/etc/resolv.conf"
  if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    cp -L /usr/local/share/ca-certificates/*.crt "$tmp/usr/local/share/ca-certificates/"
    in_root "$tmp" /usr/sbin/update-ca-certificates >/dev/null || die "update-ca-certificates failed in the root"
  fi
  log "python venv and harbor==$HARBOR_VERSION from PyPI"
  in_root "$tmp" /usr/bin/python3 -m venv "$VENV" || die "python3 -m venv failed"
  # The host's pip settings name host paths (find-links, cert); the root's pip uses its own.
  in_root "$tmp" /usr/bin/env -u PIP_FIND_LINKS -u PIP_CERT PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=180 \
    "$VENV/bin/pip" install -q "harbor==$HARBOR_VERSION" \
    || die "pip install harbor==$HARBOR_VERSION inside the root failed"
  in_root "$tmp" "$VENV/bin/harbor" --version >/dev/null || die "harbor --version fails inside the root"
  echo "$STAMP_TEXT" >"$tmp/$STAMP_NAME"
  rm -rf --one-file-system "$ROOT" "$tmp.log"
  mv "$tmp" "$ROOT"
}

main() {
  if [[ ${1:-} == --check ]]; then
    root_valid
    return
  fi
  [[ $(id -u) -eq 0 ]] || die "must run as root (debootstrap, chroot, mount)"
  local start=$SECONDS
  if [[ -f $ROOT/$STAMP_NAME && $(cat "$ROOT/$STAMP_NAME") == "$STAMP_TEXT" && -x $ROOT$VENV/bin/harbor ]]; then
    log "reusing $ROOT ($STAMP_TEXT)"
  else
    log "building $ROOT ($STAMP_TEXT)"
    build_root
  fi
  write_wrapper
  local version
  version=$("$BIN" --version 2>&1) || die "$BIN --version failed: $version"
  log "harbor $version ready: $BIN (took $((SECONDS - start))s)"
}

main "$@"
