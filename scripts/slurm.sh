#!/usr/bin/env bash
# A private one-node Slurm on this machine (its own controller and node daemon, on their own
# ports, state in a fresh directory), so programs can be launched the way a cluster's users
# launch them: `srun --mpi=pmix`. See docs/cluster.md ("Under Slurm") for what it shows and
# what it cannot.
#
#   slurm.sh check            exit 0 if a private Slurm can run here, else 77 (says why)
#   slurm.sh up DIR           start one with its state in DIR (kept until `down`); prints the
#                             SLURM_CONF to export
#   slurm.sh down DIR         stop it (its running jobs first)
#   slurm.sh srun ARGS...     srun ARGS on a fresh one, stopped on exit
#
# Ports: DURALUMIN_SLURM_PORT (the controller's; the node's is the next one), else a free pair
# found between 20000 and 29999, so private Slurms can run side by side and beside a real one.
# Needs root and Debian's slurmctld, slurmd and slurm-client (scripts/setup.sh installs them);
# no munge daemon (auth/none: one machine, one user). Killed with SIGKILL (a test's limit),
# `srun` leaves the daemons' tasks running until their own deadlines end them.
set -euo pipefail

die() {
    echo "slurm: $*" >&2
    exit 1
}

check() {
    [ "$(id -u)" = 0 ] || { echo "slurm: needs root (its node daemon launches the tasks)" >&2; return 77; }
    local p
    for p in slurmctld slurmd srun sinfo scancel; do
        command -v "$p" >/dev/null 2>&1 || { echo "slurm: $p is not installed (apt-get install slurmctld slurmd slurm-client)" >&2; return 77; }
    done
}

# Whether something listens on 127.0.0.1:$1.
listening() { (exec 3<> "/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A controller port whose next port is free too.
free_port() {
    local p i
    for i in $(seq 50); do
        p=$((20000 + (RANDOM * 32768 + RANDOM) % 10000))
        if ! listening "$p" && ! listening $((p + 1)); then
            echo "$p"
            return 0
        fi
    done
    die "no free pair of ports found"
}

up() {
    local dir=$1 port=${DURALUMIN_SLURM_PORT:-} host
    [ -n "$port" ] || port=$(free_port)
    host=$(hostname -s)
    mkdir -p "$dir/state" "$dir/spool"
    dir=$(cd "$dir" && pwd)
    cat > "$dir/slurm.conf" <<EOF
ClusterName=duralumin
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=pmix
ReturnToService=2
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=60 State=UP OverSubscribe=FORCE
EOF
    export SLURM_CONF=$dir/slurm.conf
    slurmctld -D -f "$SLURM_CONF" > "$dir/slurmctld.out" 2>&1 &
    local ctld=$!
    slurmd -D -f "$SLURM_CONF" > "$dir/slurmd.out" 2>&1 &
    local node=$!
    # Ready once the node is idle (the controller heard from the node daemon), both daemons
    # being this script's (not another controller that holds the port).
    local i
    for i in $(seq 100); do
        kill -0 "$ctld" 2>/dev/null && kill -0 "$node" 2>/dev/null || break
        if [ "$(sinfo -h -o %T 2>/dev/null)" = idle ]; then
            echo "$SLURM_CONF"
            return 0
        fi
        sleep 0.2
    done
    tail -n 5 "$dir"/*.out "$dir"/*.log >&2 || true
    down "$dir"
    die "the private Slurm in $dir did not come up (its daemons' logs are above)"
}

down() {
    local dir=$1 d pid
    export SLURM_CONF=$dir/slurm.conf
    [ -f "$SLURM_CONF" ] && scancel --full -u root >/dev/null 2>&1 || true
    for d in slurmd slurmctld; do
        pid=$(cat "$dir/$d.pid" 2>/dev/null) || continue
        kill "$pid" 2>/dev/null || continue
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
    done
}

case ${1:-} in
check) check ;;
up) [ $# = 2 ] || die "usage: slurm.sh up DIR"; check; up "$2" ;;
down) [ $# = 2 ] || die "usage: slurm.sh down DIR"; down "$2" ;;
srun)
    shift
    check
    dir=$(mktemp -d "${TMPDIR:-/tmp}/duralumin-slurm.XXXXXX")
    trap 'down "$dir"; rm -rf "$dir"' EXIT
    up "$dir" >/dev/null
    # srun in the background, so a signal reaches this script at once (bash runs a trap only
    # once the foreground command ends): it is passed on to srun, which ends its step, and the
    # EXIT trap stops the daemons.
    srun "$@" &
    job=$!
    trap 'kill -TERM "$job" 2>/dev/null' TERM INT
    rc=0
    wait "$job" || rc=$?
    # Interrupted: wait for srun to end the step.
    while kill -0 "$job" 2>/dev/null; do
        wait "$job" || rc=$?
    done
    exit "$rc"
    ;;
*) die "usage: slurm.sh check | up DIR | down DIR | srun ARGS..." ;;
esac
