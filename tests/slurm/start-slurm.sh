#!/usr/bin/env bash
# A private single-node Slurm for tests (docs/jobs.md, "Signals and Slurm"):
# slurm.conf, state, spool and logs all live in one directory; daemons are stopped by PID.
#
#   source tests/slurm/start-slurm.sh
#   slurm_start DIR     # writes DIR/slurm.conf, exports SLURM_CONF, starts munged (unless
#                       # one already answers), slurmctld, slurmd; waits for "idle"
#   slurm_stop DIR      # stops what slurm_start started, by PID, and waits until gone
#
# Or as a command: start-slurm.sh start|stop DIR. Needs root (the daemons run as root,
# munged as munge). Returns non-zero with a message on stderr when something fails.

slurm__log() { echo "start-slurm: $*" >&2; }

# Whether PID $1 runs. A daemon that exited stays a zombie until its parent (init, which in
# some containers is slow to reap) collects it; kill -0 would still succeed on it.
slurm__alive() {
    local st
    kill -0 "$1" 2>/dev/null || return 1
    st=$(sed -n 's/^[0-9]* (.*) \([A-Za-z]\).*/\1/p' "/proc/$1/stat" 2>/dev/null)
    [ "$st" != Z ]
}

# Waits up to $2 tenths of a second for PID $1 to exit.
slurm__wait_gone() {
    local pid=$1 k=0
    while slurm__alive "$pid" && [ "$k" -lt "$2" ]; do
        sleep 0.1
        k=$((k + 1))
    done
    ! slurm__alive "$pid"
}

slurm__write_conf() {
    local dir=$1 hw cpus sockets cores threads
    # The node's shape as slurmd sees it (CPUs, sockets, cores); RealMemory stays a safe
    # constant because a container limit can make slurmd -C and the kernel disagree.
    hw=$(/usr/sbin/slurmd -C 2>/dev/null | head -n 1)
    cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$hw")
    sockets=$(sed -n 's/.*SocketsPerBoard=\([0-9]*\).*/\1/p' <<<"$hw")
    cores=$(sed -n 's/.*CoresPerSocket=\([0-9]*\).*/\1/p' <<<"$hw")
    threads=$(sed -n 's/.*ThreadsPerCore=\([0-9]*\).*/\1/p' <<<"$hw")
    : "${cpus:=2}" "${sockets:=1}" "${threads:=1}"
    : "${cores:=$((cpus / sockets / threads))}"
    cat >"$dir/slurm.conf" <<CONF
ClusterName=ci
SlurmctldHost=localhost
SlurmctldPort=${SLURM_TEST_CTLD_PORT:-6817}
SlurmdPort=${SLURM_TEST_SLURMD_PORT:-6818}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
SchedulerType=sched/backfill
# A test cluster schedules every 2 s (the default 60 s main loop and 30 s backfill pass made a
# requeued job, released with StartTime=now, wait up to a minute to start).
SchedulerParameters=sched_interval=2,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
MinJobAge=300
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus Sockets=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=1024 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
}

slurm_start() {
    local dir=$1
    [ -n "$dir" ] || { slurm__log "usage: slurm_start DIR"; return 2; }
    # A fresh state each time: job IDs from 1, no jobs left over from an earlier run.
    rm -rf "$dir/state" "$dir/spool" "$dir/log"
    mkdir -p "$dir/state" "$dir/spool" "$dir/log" || return 1
    slurm__write_conf "$dir" || return 1
    export SLURM_CONF=$dir/slurm.conf

    # munged: reuse one that already answers (not ours to stop), else start our own.
    rm -f "$dir/munged.pid.ours"
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        mkdir -p /run/munge /var/log/munge /var/lib/munge
        chown munge:munge /run/munge /var/log/munge /var/lib/munge
        runuser -u munge -- /usr/sbin/munged || { slurm__log "munged failed to start"; return 1; }
        for _ in $(seq 1 50); do
            munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
            sleep 0.1
        done
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 || { slurm__log "munge does not answer"; return 1; }
        cp /run/munge/munged.pid "$dir/munged.pid.ours"
    fi

    /usr/sbin/slurmctld -f "$SLURM_CONF" || { slurm__log "slurmctld failed: $(tail -n 5 "$dir/log/slurmctld.log" 2>/dev/null)"; return 1; }
    # -N: the node is called localhost whatever the host name is.
    /usr/sbin/slurmd -f "$SLURM_CONF" -N localhost || { slurm__log "slurmd failed: $(tail -n 5 "$dir/log/slurmd.log" 2>/dev/null)"; return 1; }
    for _ in $(seq 1 100); do
        sinfo -h -o %T 2>/dev/null | grep -qx idle && return 0
        sleep 0.2
    done
    slurm__log "the node did not become idle: $(sinfo 2>&1 | tail -n 2)"
    return 1
}

slurm_stop() {
    local dir=$1 f pid
    [ -n "$dir" ] || return 0
    # Jobs first (so slurmd does not wait on them), then slurmd, slurmctld, our munged.
    if [ -f "$dir/slurm.conf" ] && [ -f "$dir/slurmctld.pid" ]; then
        SLURM_CONF=$dir/slurm.conf scancel --quiet --full --state=RUNNING -u root 2>/dev/null
        SLURM_CONF=$dir/slurm.conf scancel --quiet -u root 2>/dev/null
    fi
    for f in slurmd.pid slurmctld.pid munged.pid.ours; do
        [ -f "$dir/$f" ] || continue
        pid=$(cat "$dir/$f")
        if [ -n "$pid" ] && slurm__alive "$pid"; then
            kill "$pid"
            slurm__wait_gone "$pid" 100 || { kill -KILL "$pid" 2>/dev/null; slurm__wait_gone "$pid" 20; }
        fi
        rm -f "$dir/$f"
    done
    return 0
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    case "${1:-}" in
    start) slurm_start "${2:?DIR}" && echo "export SLURM_CONF=$2/slurm.conf" ;;
    stop) slurm_stop "${2:?DIR}" ;;
    *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
    esac
fi
