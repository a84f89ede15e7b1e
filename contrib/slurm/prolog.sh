#!/bin/sh
# SPDX-License-Identifier: MIT
#
# prolog.sh: dt's node health check, run by slurmd as the Prolog of every
# job (slurm.conf: Prolog=/path/prolog.sh, PrologFlags=Alloc), and by
# epilog.sh after its clean-up. It checks that this node can run a dt job:
#   - the temporary directory has at least DT_HEALTH_MIN_TMP_MB MiB free;
#   - munge works (a credential from `munge -n` decodes with `unmunge`);
#   - when nvidia-smi is installed: it answers within DT_HEALTH_GPU_TIMEOUT
#     seconds and lists at least one GPU;
#   - the site's own command DT_HEALTH_CMD, if set, exits 0.
# When a check fails it drains the node
#   scontrol update nodename=$SLURMD_NODENAME state=drain reason="dt-prolog: WHAT"
# logs the reason and exits 1: slurmd then drains the node too and requeues
# the job, which runs elsewhere when slurm.conf has
# SchedulerParameters=nohold_on_prolog_fail (otherwise the job is held).
# Healthy: exit 0, silently. It is not a monitor (it runs when jobs start
# and end), and it never resumes a node: a person does, after fixing it.
#
# Settings: KEY=value shell lines in health.conf beside this script, or in
# the file named by DT_HEALTH_CONF; a missing file means the defaults.
#   DT_HEALTH_TMPDIR=/tmp          the directory whose free space counts
#   DT_HEALTH_MIN_TMP_MB=1024      the least free space there, MiB
#   DT_HEALTH_MUNGE_SOCKET=        munged's socket; empty: AuthInfo's
#                                  socket= in $SLURM_CONF, else munge's default
#   DT_HEALTH_GPU=auto             auto: check GPUs when nvidia-smi exists;
#                                  yes: nvidia-smi must exist; no: skip
#   DT_HEALTH_GPU_TIMEOUT=20       seconds nvidia-smi may take
#   DT_HEALTH_CMD=                 a site command (sh -c); non-zero fails the
#                                  node, its first line of output is the reason
#   DT_HEALTH_CMD_TIMEOUT=60       seconds DT_HEALTH_CMD may take
#   DT_HEALTH_DRAIN=yes            no: log a failure but exit 0 and drain
#                                  nothing (a dry run while rolling the
#                                  checks out: any non-zero exit makes
#                                  slurmd drain the node itself)
#   DT_HEALTH_LOG=/var/log/dt-health.log
#                                  one line per failure (and per clean-up of
#                                  epilog.sh); stderr too, which slurmd drops
#
# Slurm 22.05 gives the prolog and epilog no PATH, and these variables
# among others: SLURM_JOB_ID, SLURM_JOB_USER, SLURM_JOB_UID,
# SLURMD_NODENAME, SLURM_CLUSTER_NAME, SLURM_CONF, SLURM_SCRIPT_CONTEXT
# (prolog_slurmd or epilog_slurmd). Not SLURM_JOB_NAME.
#
# Usage: prolog.sh [--phase prolog|epilog|check]; check only reports (no
# drain), for trying a health.conf by hand.

PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
umask 022

PHASE=prolog
case ${1:-} in
--phase)
    PHASE=${2:-}
    case $PHASE in
    prolog | epilog | check) ;;
    *) echo "prolog.sh: --phase prolog|epilog|check" >&2 && exit 2 ;;
    esac
    ;;
'') ;;
*) echo "usage: prolog.sh [--phase prolog|epilog|check]" >&2 && exit 2 ;;
esac

HERE=$(cd "$(dirname "$0")" && pwd)
NODE=${SLURMD_NODENAME:-$(hostname -s 2>/dev/null || hostname)}
JOB=${SLURM_JOB_ID:-}

DT_HEALTH_TMPDIR=/tmp
DT_HEALTH_MIN_TMP_MB=1024
DT_HEALTH_MUNGE_SOCKET=
DT_HEALTH_GPU=auto
DT_HEALTH_GPU_TIMEOUT=20
DT_HEALTH_CMD=
DT_HEALTH_CMD_TIMEOUT=60
DT_HEALTH_DRAIN=yes
DT_HEALTH_LOG=/var/log/dt-health.log

CONF=${DT_HEALTH_CONF:-$HERE/health.conf}
failed=
if [ -e "$CONF" ]; then
    if [ -f "$CONF" ] && [ -r "$CONF" ]; then
        # its exit status is that of its last line, which may be a test
        # shellcheck disable=SC1090
        . "$CONF"
    else
        failed="cannot read $CONF"
    fi
fi

# log MSG: one line to stderr and to DT_HEALTH_LOG when it can be written
log() {
    _lg="$(date '+%Y-%m-%dT%H:%M:%S') node=$NODE job=${JOB:--} $*"
    echo "$_lg" >&2
    [ -n "$DT_HEALTH_LOG" ] && [ "$PHASE" != check ] && echo "$_lg" >>"$DT_HEALTH_LOG" 2>/dev/null
    return 0
}

# with_timeout S CMD...: CMD, killed after S seconds (exit 124)
with_timeout() {
    if command -v timeout >/dev/null 2>&1; then
        timeout -k 2 "$@"
    else
        shift
        "$@"
    fi
}

is_uint() {
    case $1 in
    '' | *[!0-9]*) return 1 ;;
    esac
    return 0
}

# ---- the checks: each prints the reason and returns 1 when it fails --------

check_tmp() {
    is_uint "$DT_HEALTH_MIN_TMP_MB" || {
        echo "DT_HEALTH_MIN_TMP_MB '$DT_HEALTH_MIN_TMP_MB' in $CONF is not a number"
        return 1
    }
    [ -d "$DT_HEALTH_TMPDIR" ] || {
        echo "$DT_HEALTH_TMPDIR is not a directory"
        return 1
    }
    _free=$(with_timeout 10 df -Pk "$DT_HEALTH_TMPDIR" 2>/dev/null |
        awk 'NR == 2 { print int($4 / 1024) }')
    is_uint "$_free" || {
        echo "df cannot tell the free space of $DT_HEALTH_TMPDIR"
        return 1
    }
    [ "$_free" -ge "$DT_HEALTH_MIN_TMP_MB" ] || {
        echo "$DT_HEALTH_TMPDIR has $_free MiB free, less than $DT_HEALTH_MIN_TMP_MB MiB"
        return 1
    }
}

munge_socket() {
    if [ -n "$DT_HEALTH_MUNGE_SOCKET" ]; then
        echo "$DT_HEALTH_MUNGE_SOCKET"
    elif [ -n "${SLURM_CONF:-}" ] && [ -r "$SLURM_CONF" ]; then
        sed -n 's/^[[:space:]]*AuthInfo[[:space:]]*=.*socket=\([^,[:space:]]*\).*/\1/p' \
            "$SLURM_CONF" | tail -n 1
    fi
}

check_munge() {
    if ! command -v munge >/dev/null 2>&1 || ! command -v unmunge >/dev/null 2>&1; then
        echo "munge/unmunge are not installed"
        return 1
    fi
    _sock=$(munge_socket)
    if [ -n "$_sock" ]; then
        _out=$(with_timeout 10 munge -n -S "$_sock" 2>&1 | with_timeout 10 unmunge -S "$_sock" 2>&1)
    else
        _sock="the default munge socket"
        _out=$(with_timeout 10 munge -n 2>&1 | with_timeout 10 unmunge 2>&1)
    fi
    echo "$_out" | grep -q '^STATUS: *Success' || {
        echo "munge does not work at $_sock: $(echo "$_out" | grep -v '^$' | head -n 1)"
        return 1
    }
}

check_gpu() {
    case $DT_HEALTH_GPU in
    no) return 0 ;;
    yes | auto) ;;
    *)
        echo "DT_HEALTH_GPU '$DT_HEALTH_GPU' in $CONF: auto, yes or no"
        return 1
        ;;
    esac
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        [ "$DT_HEALTH_GPU" = auto ] && return 0
        echo "nvidia-smi is not installed (DT_HEALTH_GPU=yes)"
        return 1
    fi
    _out=$(with_timeout "$DT_HEALTH_GPU_TIMEOUT" nvidia-smi -L 2>&1)
    _rc=$?
    if [ "$_rc" = 124 ] || [ "$_rc" = 137 ]; then
        echo "nvidia-smi did not answer within $DT_HEALTH_GPU_TIMEOUT s"
        return 1
    fi
    [ "$_rc" = 0 ] || {
        echo "nvidia-smi failed (exit $_rc): $(echo "$_out" | head -n 1)"
        return 1
    }
    echo "$_out" | grep -q '^GPU [0-9]' || {
        echo "nvidia-smi lists no GPU"
        return 1
    }
}

check_cmd() {
    [ -n "$DT_HEALTH_CMD" ] || return 0
    _out=$(with_timeout "$DT_HEALTH_CMD_TIMEOUT" sh -c "$DT_HEALTH_CMD" 2>&1 </dev/null)
    _rc=$?
    [ "$_rc" = 0 ] && return 0
    if [ "$_rc" = 124 ] || [ "$_rc" = 137 ]; then
        echo "DT_HEALTH_CMD took more than $DT_HEALTH_CMD_TIMEOUT s"
    else
        echo "DT_HEALTH_CMD failed (exit $_rc)${_out:+: $(echo "$_out" | head -n 1)}"
    fi
    return 1
}

# ---- run them ---------------------------------------------------------------

# drain WHY: take this node out of service with a reason sinfo -R shows.
# A node already drained keeps the reason it has: the first one is the
# one that matters (slurmd runs the Epilog after a failed Prolog too, and
# an administrator's reason is theirs).
drain() {
    if ! command -v scontrol >/dev/null 2>&1; then
        log "dt-$PHASE: cannot drain: scontrol is not installed"
        return 0
    fi
    _node=$(with_timeout 20 scontrol -o show node "$NODE" 2>/dev/null)
    case $(echo "$_node" | tr ' ' '\n' | sed -n 's/^State=//p') in
    *DRAIN*)
        log "dt-$PHASE: already drained, reason kept: $(echo "$_node" | sed -n 's/.* Reason=//p')"
        return 0
        ;;
    esac
    _out=$(with_timeout 20 scontrol update nodename="$NODE" state=drain reason="$1" 2>&1) ||
        log "dt-$PHASE: cannot drain: scontrol: $_out"
}

if [ -z "$failed" ]; then
    for c in check_tmp check_munge check_gpu check_cmd; do
        why=$($c 2>&1) && continue
        failed=${why:-$c failed}
        break
    done
fi
[ -z "$failed" ] && exit 0

# one line, no quotes: it becomes a Slurm reason
failed=$(echo "$failed" | head -n 1 | tr -d "\"'\\\\" | cut -c 1-200)
tag=dt-$PHASE
[ "$PHASE" = check ] && tag=dt-prolog
if [ "$PHASE" = check ]; then
    log "$tag: $failed"
elif [ "$DT_HEALTH_DRAIN" != yes ]; then
    log "$tag: $failed (DT_HEALTH_DRAIN=$DT_HEALTH_DRAIN: not drained)"
    exit 0
else
    log "$tag: $failed"
    drain "$tag: $failed"
fi
exit 1
