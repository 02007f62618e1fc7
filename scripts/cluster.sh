#!/usr/bin/env bash
# A simulated cluster on this one machine: each "host" is a network namespace with its own
# hostname, joined to the others by a veth pair on a private bridge, so Open MPI sees separate
# nodes (TCP between them, shared memory within one) without any real network. See
# docs/cluster.md for what it shows and what it cannot.
#
#   cluster.sh check                      exit 0 if clusters can be made here, else 77
#   cluster.sh up NAME LAYOUT [--rate R]  make cluster NAME (kept until `down`)
#   cluster.sh down NAME                  tear it down
#   cluster.sh mpirun ARGS...             mpirun on a fresh cluster, torn down on exit
#   cluster.sh run LAYOUT -- CMD...       CMD as host 0 of a fresh cluster
#
# LAYOUT is HxS (H hosts of S slots each) or S0,S1,... (one entry per host). `mpirun` and
# `run` take the layout from DURALUMIN_CLUSTER (default 2x2) and the link rate from
# DURALUMIN_CLUSTER_RATE (default below; `none` leaves links unshaped), a one-way delay from
# DURALUMIN_CLUSTER_DELAY where the kernel has netem. Needs root, iproute2, util-linux and
# Open MPI 4's mpirun.
set -euo pipefail

# /run is cleared with the namespaces at boot, so state here never outlives what it describes.
readonly state_root=${DURALUMIN_CLUSTER_STATE:-/run/duralumin-cluster}
# Every cluster has its own bridge and namespaces, so all can use the same private subnet: no
# address is on the bridge or in the root namespace, and there is no route out.
readonly subnet=10.77.0
readonly default_rate=4gbit
self=$(readlink -f "${BASH_SOURCE[0]}")
readonly self

die() {
    echo "cluster: $*" >&2
    exit 1
}

# Namespace and interface names carry the cluster name; interface names must fit in 15 bytes.
ns_of() { echo "dl${1}h${2}"; }
bridge_of() { echo "dl${1}br"; }
veth_of() { echo "dl${1}v${2}"; }

# LAYOUT -> slots per host, one a line.
parse_layout() {
    local spec=$1 hosts slots
    if [[ $spec =~ ^([0-9]+)x([0-9]+)$ ]]; then
        hosts=${BASH_REMATCH[1]} slots=${BASH_REMATCH[2]}
        ((hosts >= 1 && hosts <= 64 && slots >= 1)) || die "bad layout $spec"
        for ((i = 0; i < hosts; i++)); do echo "$slots"; done
    elif [[ $spec =~ ^[0-9]+(,[0-9]+)*$ ]]; then
        local -a list
        IFS=, read -ra list <<<"$spec"
        ((${#list[@]} <= 64)) || die "bad layout $spec"
        for slots in "${list[@]}"; do
            ((slots >= 1)) || die "bad layout $spec"
            echo "$slots"
        done
    else
        die "bad layout '$spec' (want HxS, e.g. 2x2, or slots per host, e.g. 2,1)"
    fi
}

# A process's start time, so that a recycled PID is not taken for a live owner.
start_time() {
    local stat
    stat=$(<"/proc/$1/stat") 2>/dev/null || return 1
    # The command name (field 2) may hold spaces; the fields after it are plain.
    local -a fields
    read -ra fields <<<"${stat##*) }"
    echo "${fields[19]}"
}

owner_alive() {
    local owner=$1 pid when
    [[ $owner == manual ]] && return 0
    read -r pid when <<<"$owner"
    [[ $(start_time "$pid" 2>/dev/null) == "$when" ]]
}

# Serializes the making, collecting and tearing down of clusters (several test launches, or a
# launch and a collector, may run at once).
lock() {
    mkdir -p "$state_root"
    exec 9>"$state_root/lock"
    flock 9
}

unlock() {
    flock -u 9
    exec 9>&-
}

# Best effort, so that it can clean up after a half-made cluster or a killed owner.
teardown() {
    local name=$1 ns veth
    # Deleting one end of a pair deletes both at once; a namespace's own deletion (and its
    # links') completes asynchronously in the kernel.
    for veth in $(ip -o link show type veth 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
        grep -E "^dl${name}v[0-9]+$" || true); do
        ip link del "$veth" 2>/dev/null || true
    done
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^dl${name}h[0-9]+$" || true); do
        # Whatever a killed launch left running in there (orted, ranks) would keep the
        # namespace, and its end of the link, alive after `ip netns del`.
        local pids
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        if [[ -n $pids ]]; then
            # shellcheck disable=SC2086 # one PID a word
            kill -KILL $pids 2>/dev/null || true
        fi
        ip netns del "$ns" 2>/dev/null || true
        rm -rf "/etc/netns/$ns"
    done
    ip link del "$(bridge_of "$name")" 2>/dev/null || true
    rm -rf "${state_root:?}/$name"
}

# Clusters whose owning launch died without tearing down (SIGKILL of its process group, which
# no trap sees).
collect_stale() {
    local dir name
    for dir in "$state_root"/*/; do
        [[ -d $dir ]] || continue
        name=$(basename "$dir")
        if [[ ! -f $dir/owner ]] || ! owner_alive "$(<"$dir/owner")"; then
            teardown "$name"
        fi
    done
}

# Set once netem turned out missing, so that the warning comes once.
no_netem=0

# Egress shaping on both ends of a host's link: what the host sends and what it receives are
# each held to the rate, like a full-duplex NIC. tbf splits veth's 64 KiB GSO packets that
# exceed its burst, so the burst is kept above that.
shape() {
    local dev=$1 rate=$2 delay=$3 netns=${4:-}
    local -a in_ns=()
    [[ -n $netns ]] && in_ns=(ip netns exec "$netns")
    if [[ -n $delay ]]; then
        if "${in_ns[@]}" tc qdisc add dev "$dev" root handle 1: netem delay "$delay" 2>/dev/null; then
            [[ $rate == none ]] && return 0
            "${in_ns[@]}" tc qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$rate" burst 512kb latency 20ms
            return 0
        fi
        echo "cluster: warning: latency shaping unavailable (no netem in this kernel); links get no delay" >&2
        no_netem=1
    fi
    [[ $rate == none ]] && return 0
    "${in_ns[@]}" tc qdisc add dev "$dev" root tbf rate "$rate" burst 512kb latency 20ms
}

cmd_check() {
    local reason=
    if ((EUID != 0)); then
        reason="needs root (network namespaces)"
    else
        local tool
        for tool in ip unshare flock tc mpirun; do
            command -v "$tool" >/dev/null || { reason="$tool not found"; break; }
        done
    fi
    if [[ -z $reason ]]; then
        # Make one host of a throwaway cluster, as `up` would.
        local name="chk$$" ns br veth
        ns=$(ns_of "$name" 0) br=$(bridge_of "$name") veth=$(veth_of "$name" 0)
        if ! ip netns add "$ns" 2>/dev/null; then
            reason="cannot make a network namespace (ip netns add)"
        elif ! ip link add "$br" type bridge 2>/dev/null; then
            reason="cannot make a bridge (ip link add type bridge)"
        elif ! ip link add "$veth" type veth peer name eth0 netns "$ns" 2>/dev/null; then
            reason="cannot make a veth pair into a namespace"
        elif ! ip link set "$veth" master "$br" 2>/dev/null; then
            reason="cannot join a veth to a bridge"
        elif ! ip netns exec "$ns" unshare --uts -- sh -c 'hostname h0' 2>/dev/null; then
            reason="cannot give a namespace its own hostname (unshare --uts)"
        fi
        ip link del "$veth" 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
        ip link del "$br" 2>/dev/null || true
    fi
    if [[ -n $reason ]]; then
        echo "cluster: unavailable: $reason" >&2
        exit 77
    fi
}

# up NAME LAYOUT [--rate R] [--delay D] [--owner PID]
cmd_up() {
    (($# >= 2)) || die "usage: cluster.sh up NAME LAYOUT [--rate R] [--delay D]"
    local name=$1 layout=$2 rate=none delay='' owner=manual
    shift 2
    while (($#)); do
        case $1 in
            --rate) rate=${2:?--rate needs a value}; shift 2 ;;
            --delay) delay=${2:?--delay needs a value}; shift 2 ;;
            --owner) owner="$2 $(start_time "$2")" || die "no process $2"; shift 2 ;;
            *) die "up: unknown option $1" ;;
        esac
    done
    [[ $name =~ ^[a-z0-9]{1,8}$ ]] || die "cluster name must be 1-8 of [a-z0-9]: $name"
    [[ $rate == 0 ]] && rate=none
    local -a slots
    mapfile -t slots < <(parse_layout "$layout")
    ((${#slots[@]} > 0)) || die "bad layout $layout"

    lock
    collect_stale
    local dir=$state_root/$name
    [[ -e $dir ]] && die "cluster $name exists (cluster.sh down $name)"
    mkdir -p "$dir"
    echo "$owner" >"$dir/owner"
    # Undo a half-made cluster if any step fails.
    trap 'teardown "$name"' EXIT

    local br i ns veth hosts_file
    br=$(bridge_of "$name")
    ip link add "$br" type bridge
    ip link set "$br" up
    hosts_file=$(printf '127.0.0.1 localhost\n::1 localhost\n')
    for i in "${!slots[@]}"; do
        hosts_file+=$'\n'"$subnet.$((i + 1)) h$i"
    done
    : >"$dir/hostfile"
    for i in "${!slots[@]}"; do
        ns=$(ns_of "$name" "$i") veth=$(veth_of "$name" "$i")
        ip netns add "$ns"
        ip link add "$veth" type veth peer name eth0 netns "$ns"
        ip link set "$veth" master "$br"
        ip link set "$veth" up
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        shape "$veth" "$rate" "$delay"
        ((no_netem)) && delay=''
        shape eth0 "$rate" "$delay" "$ns"
        # `ip netns exec` bind-mounts this over /etc/hosts: the hostfile's names resolve
        # inside every host.
        mkdir -p "/etc/netns/$ns"
        echo "$hosts_file" >"/etc/netns/$ns/hosts"
        echo "h$i slots=${slots[i]}" >>"$dir/hostfile"
    done
    # mpirun takes its remote-shell agent as one program.
    printf '#!/bin/sh\nexec %q agent %q "$@"\n' "$self" "$name" >"$dir/agent"
    chmod +x "$dir/agent"
    trap - EXIT
    unlock
}

cmd_down() {
    (($# == 1)) || die "usage: cluster.sh down NAME"
    lock
    teardown "$1"
    unlock
}

# What mpirun's rsh launcher runs in place of ssh: agent NAME HOST COMMAND-WORDS...
cmd_agent() {
    local name=$1 host=$2
    shift 2
    [[ $host =~ ^h([0-9]+)$ ]] || die "agent: unknown host $host"
    # Like ssh, the command words are joined and run by a shell (Open MPI quotes them for one).
    # shellcheck disable=SC2016 # expanded by that shell
    exec ip netns exec "$(ns_of "$name" "${BASH_REMATCH[1]}")" unshare --uts -- \
        sh -c 'hostname "$1"; shift; eval "$*"' sh "$host" "$@"
}

# The cluster `mpirun` and `run` made, and the command running on it (for the traps).
cluster=
child=

# Brings up a fresh cluster owned by this process, torn down however this process ends (short
# of SIGKILL, which the next `up` collects), then runs "$@" as host 0 and exits with its status.
on_fresh_cluster() {
    local layout=${DURALUMIN_CLUSTER:-2x2} rate=${DURALUMIN_CLUSTER_RATE:-$default_rate}
    local -a up_args=(--rate "$rate" --owner $$)
    [[ -n ${DURALUMIN_CLUSTER_DELAY:-} ]] && up_args+=(--delay "$DURALUMIN_CLUSTER_DELAY")
    cluster="m$$"
    # The command runs in the background so that a signal reaches these traps at once (bash
    # runs traps only between commands); it is passed on, and the cluster torn down after.
    trap 'stop TERM' TERM
    trap 'stop INT' INT
    trap 'stop HUP' HUP
    cmd_up "$cluster" "$layout" "${up_args[@]}"
    trap 'cmd_down "$cluster"' EXIT
    export DURALUMIN_CLUSTER_HOSTFILE=$state_root/$cluster/hostfile
    export DURALUMIN_CLUSTER_AGENT=$state_root/$cluster/agent
    # Explicit stdin: a background command's would otherwise be /dev/null.
    ip netns exec "$(ns_of "$cluster" 0)" unshare --uts -- sh -c 'hostname h0; exec "$@"' sh "$@" <&0 &
    child=$!
    local rc=0
    wait "$child" || rc=$?
    exit "$rc"
}

stop() {
    local sig=$1
    trap - "$sig" EXIT
    if [[ -n $child ]]; then
        kill -"$sig" "$child" 2>/dev/null || true
        wait "$child" 2>/dev/null || true
    fi
    [[ -n $cluster ]] && cmd_down "$cluster"
    kill -"$sig" $$
}

cmd_mpirun() {
    # The names on_fresh_cluster gives the cluster's files.
    # shellcheck disable=SC2054 # `self,vader,tcp` is one argument
    local -a mca=(
        --hostfile "$state_root/m$$/hostfile"
        --mca plm_rsh_agent "$state_root/m$$/agent"
        # Every daemon straight from mpirun: the agent then only ever runs in host 0.
        --mca plm_rsh_no_tree_spawn 1
        --mca oob_tcp_if_include "$subnet.0/24"
        --mca btl_tcp_if_include "$subnet.0/24"
        --mca btl self,vader,tcp
    )
    local arg by_slot=1
    for arg in "$@"; do
        [[ $arg == --map-by || $arg == -map-by || $arg == --bynode || $arg == --byslot ]] && by_slot=0
    done
    # Ranks 0..S-1 on h0, then h1's, as on a real cluster's hostfile.
    ((by_slot)) && mca+=(--map-by slot)
    on_fresh_cluster "${DURALUMIN_CLUSTER_MPIRUN:-mpirun}" "${mca[@]}" "$@"
}

cmd_run() {
    [[ ${1:-} && ${2:-} == -- ]] || die "usage: cluster.sh run LAYOUT -- CMD..."
    DURALUMIN_CLUSTER=$1
    shift 2
    on_fresh_cluster "$@"
}

main() {
    local sub=${1:-}
    (($#)) && shift
    case $sub in
        check) cmd_check ;;
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
        mpirun) cmd_mpirun "$@" ;;
        run) cmd_run "$@" ;;
        agent) cmd_agent "$@" ;;
        *) die "usage: cluster.sh check | up NAME LAYOUT [--rate R] [--delay D] | down NAME | mpirun ARGS... | run LAYOUT -- CMD..." ;;
    esac
}

main "$@"
