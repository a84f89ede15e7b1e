#!/bin/sh
# SPDX-License-Identifier: MIT
#
# epilog.sh: dt's clean-up after a job, run by slurmd as the Epilog on
# every node of a job when it ends (slurm.conf: Epilog=/path/epilog.sh,
# with prolog.sh beside it). Slurm has by then killed the processes it
# tracks; this removes what escaped it:
#   - dtengine and dtagentd processes that still carry the job's
#     SLURM_JOB_ID (and SLURM_CLUSTER_NAME) in their environment, e.g.
#     daemonised or re-parented ones: SIGTERM, then SIGKILL after
#     DT_HEALTH_KILL_GRACE seconds;
#   - the agents' state directories of the job (/tmp/dtagentd-UID/DTJOB-NODE,
#     found from the agents' command lines, or from the job name dt-DTJOB.TAG-...
#     that dtcoordd gives its Slurm jobs); an explicit --state-dir is left
#     alone;
#   - Open MPI shared-memory segments (vader_segment.* in DT_HEALTH_SHM_DIR)
#     of the job's user that no process maps any more and that are older
#     than 5 s: what ranks killed by a signal leave behind.
# Then it runs prolog.sh's health checks (prolog.sh --phase epilog): a
# failure drains the node with reason "dt-epilog: WHAT" and exits 1.
# Healthy and clean: exit 0. It never touches processes or files of other
# jobs, and it is not a general process reaper (other leftovers are the
# site's business, e.g. proctrack/cgroup).
#
# Settings: health.conf beside it (or DT_HEALTH_CONF), as for prolog.sh,
# plus
#   DT_HEALTH_KILL_NAMES="dtengine dtagentd"  process names (comm) to reap
#   DT_HEALTH_KILL_GRACE=5         seconds between SIGTERM and SIGKILL
#   DT_HEALTH_SHM_DIR=/dev/shm     where Open MPI puts its segments
#   DT_HEALTH_AGENT_ROOT=/tmp      where dtagentd-UID/ directories live
# Every process killed and every path removed is logged to DT_HEALTH_LOG.

PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH

HERE=$(cd "$(dirname "$0")" && pwd)
NODE=${SLURMD_NODENAME:-$(hostname -s 2>/dev/null || hostname)}
JOB=${SLURM_JOB_ID:-}
CLUSTER=${SLURM_CLUSTER_NAME:-}
JOB_UID=${SLURM_JOB_UID:-}

DT_HEALTH_LOG=/var/log/dt-health.log
DT_HEALTH_KILL_NAMES="dtengine dtagentd"
DT_HEALTH_KILL_GRACE=5
DT_HEALTH_SHM_DIR=/dev/shm
DT_HEALTH_AGENT_ROOT=/tmp
CONF=${DT_HEALTH_CONF:-$HERE/health.conf}
if [ -f "$CONF" ] && [ -r "$CONF" ]; then
    # shellcheck disable=SC1090
    . "$CONF"
fi

log() {
    _lg="$(date '+%Y-%m-%dT%H:%M:%S') node=$NODE job=${JOB:--} dt-epilog: $*"
    echo "$_lg" >&2
    [ -n "$DT_HEALTH_LOG" ] && echo "$_lg" >>"$DT_HEALTH_LOG" 2>/dev/null
    return 0
}

if [ -z "$JOB" ]; then
    echo "epilog.sh: SLURM_JOB_ID is not set (slurmd runs this as the Epilog)" >&2
    exit 2
fi
case $DT_HEALTH_KILL_GRACE in
'' | *[!0-9]*) DT_HEALTH_KILL_GRACE=5 ;;
esac

# env_of PID NAME: the value of NAME in PID's environment (empty if unset)
env_of() {
    { tr '\0' '\n' <"/proc/$1/environ"; } 2>/dev/null | sed -n "s/^$2=//p" | head -n 1
}

# of_this_job PID: PID's environment names this job (and this cluster when
# both know theirs: two test clusters on one host reuse job ids)
of_this_job() {
    [ "$(env_of "$1" SLURM_JOB_ID)" = "$JOB" ] || return 1
    [ -z "$CLUSTER" ] && return 0
    _oj_c=$(env_of "$1" SLURM_CLUSTER_NAME)
    [ -z "$_oj_c" ] || [ "$_oj_c" = "$CLUSTER" ]
}

uid_of() {
    awk '$1 == "Uid:" { print $2 }' "/proc/$1/status" 2>/dev/null
}

# agent_dir PID: the state directory of dtagentd PID when it is the default
# one (/tmp/dtagentd-UID/JOB-NODE, NODE from --node, else the agent's
# SLURMD_NODENAME, else the host name); nothing for an explicit --state-dir
agent_dir() {
    _ad_node=$(env_of "$1" SLURMD_NODENAME)
    { tr '\0' '\n' <"/proc/$1/cmdline"; } 2>/dev/null | awk -v uid="$(uid_of "$1")" \
        -v root="$DT_HEALTH_AGENT_ROOT" -v host="${_ad_node:-$(hostname)}" '
        want != "" { v[want] = $0; want = ""; next }
        /^--(job|node|state-dir)$/ { want = substr($0, 3); next }
        /^--(job|node|state-dir)=/ {
            i = index($0, "=")
            v[substr($0, 3, i - 3)] = substr($0, i + 1)
        }
        END {
            if (("state-dir" in v) || !("job" in v) || v["job"] !~ /^[0-9]+$/) exit
            print root "/dtagentd-" uid "/" v["job"] "-" (("node" in v) ? v["node"] : host)
        }'
}

# dirs used by a dtagentd that is still running (any job)
live_agent_dirs() {
    for _la_p in $(pgrep -x dtagentd 2>/dev/null); do
        agent_dir "$_la_p"
    done
}

# ---- 1. processes -----------------------------------------------------------

victims=
dirs=
for name in $DT_HEALTH_KILL_NAMES; do
    for p in $(pgrep -x "$name" 2>/dev/null); do
        of_this_job "$p" || continue
        victims="$victims $p"
        [ "$name" = dtagentd ] && dirs="$dirs $(agent_dir "$p")"
        log "killing leftover $name pid=$p"
    done
done
if [ -n "$victims" ]; then
    # shellcheck disable=SC2086
    kill -s TERM $victims 2>/dev/null
    n=$((DT_HEALTH_KILL_GRACE * 10))
    while [ "$n" -gt 0 ]; do
        left=
        for p in $victims; do
            kill -0 "$p" 2>/dev/null && left="$left $p"
        done
        [ -z "$left" ] && break
        sleep 0.1
        n=$((n - 1))
    done
    if [ -n "$left" ]; then
        log "SIGKILL to$left (still there ${DT_HEALTH_KILL_GRACE} s after SIGTERM)"
        # shellcheck disable=SC2086
        kill -s KILL $left 2>/dev/null
    fi
fi

# ---- 2. the agents' state directories ---------------------------------------

# No agent left to ask: the job name says which dt job this was
# (dtcoordd names its Slurm jobs dt-DTJOB.TAG-NAME; before, dt-DTJOB-NAME).
if [ -z "$dirs" ] && [ -n "$JOB_UID" ] && [ -d "$DT_HEALTH_AGENT_ROOT/dtagentd-$JOB_UID" ] &&
    command -v scontrol >/dev/null 2>&1; then
    jname=$(timeout 10 scontrol -o show job "$JOB" 2>/dev/null |
        sed -n 's/.* JobName=\([^ ]*\).*/\1/p')
    dtjob=$(echo "$jname" | sed -n 's/^dt-\([0-9][0-9]*\)[.-].*/\1/p')
    if [ -n "$dtjob" ]; then
        for n in "$NODE" "$(hostname)" "$(hostname -s 2>/dev/null)"; do
            [ -n "$n" ] && dirs="$dirs $DT_HEALTH_AGENT_ROOT/dtagentd-$JOB_UID/$dtjob-$n"
        done
    fi
fi
if [ -n "$dirs" ]; then
    live=$(live_agent_dirs)
    for d in $dirs; do
        [ -d "$d" ] || continue
        case " $(echo "$live" | tr '\n' ' ') " in *" $d "*) continue ;; esac
        rm -rf "$d" && log "removed $d"
    done
fi

# ---- 3. Open MPI segments nobody maps ---------------------------------------

if [ -n "$JOB_UID" ] && [ -d "$DT_HEALTH_SHM_DIR" ]; then
    now=$(date +%s)
    mapped=
    for f in "$DT_HEALTH_SHM_DIR"/vader_segment.*; do
        [ -f "$f" ] || continue
        [ "$(stat -c %u "$f" 2>/dev/null)" = "$JOB_UID" ] || continue
        [ $((now - $(stat -c %Y "$f" 2>/dev/null || echo "$now"))) -ge 5 ] || continue
        if [ -z "$mapped" ]; then
            mapped=$(cat /proc/[0-9]*/maps 2>/dev/null | awk '$6 ~ /vader_segment/ { print $6 }' |
                sort -u)
            mapped="$mapped
-"
        fi
        echo "$mapped" | grep -qxF "$f" && continue
        rm -f "$f" && log "removed $f (no process maps it)"
    done
fi

# ---- 4. is the node still healthy? ------------------------------------------

exec /bin/sh "$HERE/prolog.sh" --phase epilog
