# Sourced by the launch scripts: `fail` and `decimal` (one-line errors, exit 2), STOP_TIMEOUT checked
# when sourced (before anything starts, not when a signal comes), and `run_launcher COMMAND ...`
# runs the deepspeed launcher in its own process group and stops the whole run on SIGTERM / SIGINT / SIGHUP. The launcher itself does not: its
# outer process dies on SIGTERM and leaves the ranks training as orphans. Here the signal goes to
# this machine's ranks (the children of deepspeed.launcher.launch in the group): they save a final
# checkpoint (with --save) and exit, and the launcher, seeing them exit, ends with their status. With no rank
# here yet (still starting, or ranks reached by ssh) it goes to the whole group, whose launcher
# then stops the ranks its way. The script returns once no process of the group is left
# (STOP_TIMEOUT seconds at most, default 120, then SIGKILL; DeepSpeed's launch.py, signalled itself,
# kills its ranks 30 s after). Exit status: the launcher's, or 128 + the signal.
# On a machine without a visible GPU it also names the CPU accelerator (DS_ACCELERATOR=cpu, what
# DeepSpeed then picks anyway), as megatron/quiet.py does for the ranks: the launcher processes
# (deepspeed's runner and its per-node launch) then do not log "Setting accelerator to CPU. If you
# have GPU or other accelerator, we were unable to detect it." A DS_ACCELERATOR the user set is kept,
# and checked first (megatron/quiet.py, with the python beside the launcher; its torch import is paid
# only then): one naming a device this machine lacks is one line and status 2, not the runner's traceback.

fail() {  # one line, exit 2
    echo "$(basename "$0"): error: $1" >&2
    exit 2
}

# decimal() NAME VALUE MIN FIX: VALUE as a decimal integer >= MIN into NAME (a leading zero is not
# octal: 08 is 8, 010 is 10), else one line naming NAME and FIX
decimal() {
    case "$2" in
        '' | *[!0-9]*) fail "$1 = '$2' is not a non-negative integer; $4" ;;
    esac
    [ "${#2}" -le 9 ] || fail "$1 = '$2' is too large; $4"
    printf -v "$1" %d "$((10#$2))"
    [ "${!1}" -ge "$3" ] || fail "$1 = '$2' is below $3; $4"
}

decimal STOP_TIMEOUT "${STOP_TIMEOUT:-120}" 1 "set STOP_TIMEOUT to the seconds the ranks get to stop after a signal (default 120)"

# processes of group $1 that are not zombies (a reparented zombie can outlive its group's work)
group_alive() {
    if command -v ps > /dev/null; then
        ps -e -o pgid=,stat= | awk -v group="$1" '$1 == group && $2 !~ /^Z/ { found = 1 } END { exit !found }'
    else
        kill -0 -- "-$1" 2> /dev/null
    fi
}

# stop_run SIGNAL GROUP: the signal to the group's ranks (the children of DeepSpeed's per-node
# launcher, deepspeed.launcher.launch), else to the whole group
stop_run() {
    local launchers ranks=""
    launchers="$(pgrep -g "$2" -f deepspeed.launcher.launch 2> /dev/null)" || true
    for launcher in $launchers; do
        ranks+=" $(pgrep -P "$launcher" 2> /dev/null | tr '\n' ' ')" || true
    done
    if [ -n "${ranks// /}" ]; then
        # shellcheck disable=SC2086  # one pid per word
        kill -s "$1" $ranks 2> /dev/null || true
    else  # SIGTERM for SIGHUP: DeepSpeed's runner and launch.py stop their ranks on SIGTERM, die on SIGHUP
        kill -s "${1/#HUP/TERM}" -- "-$2" 2> /dev/null || true
    fi
}

# true unless no GPU can be visible: CUDA_VISIBLE_DEVICES set empty (or -1...), or no NVIDIA
# (/dev/nvidia0...), ROCm (/dev/kfd) or WSL2 (/dev/dxg) device node; a device node with a broken
# driver counts as a GPU (DeepSpeed then says so itself). No torch import: a launch pays nothing.
gpu_visible() {
    case "${CUDA_VISIBLE_DEVICES-unset}" in
        '' | -1*) return 1 ;;
    esac
    [ -e /dev/kfd ] || [ -e /dev/dxg ] || compgen -G '/dev/nvidia[0-9]*' > /dev/null
}

run_launcher() {
    local status=0 signal_number=0 deadline
    if [ -z "${DS_ACCELERATOR+set}" ] && ! gpu_visible; then
        export DS_ACCELERATOR=cpu
    elif [ "${DS_ACCELERATOR-cpu}" != cpu ]; then
        "$(dirname "$1")/python" -m megatron.quiet "$(basename "$0")" || return
    fi
    set -m  # job control: the background job gets a process group of its own
    "$@" &
    LAUNCHER_GROUP=$!
    set +m
    # HUP: the terminal closed (an SSH session dropped), a stop like SIGTERM's; under nohup it stays
    # ignored (a shell cannot trap a signal ignored when it started)
    for name in TERM INT HUP; do
        # shellcheck disable=SC2064  # the group id and the signal are fixed now
        trap "signal_number=$(kill -l "$name"); trap '' TERM INT HUP; stop_run $name $LAUNCHER_GROUP" "$name"
    done
    while kill -0 "$LAUNCHER_GROUP" 2> /dev/null; do
        status=0
        wait "$LAUNCHER_GROUP" || status=$?
    done
    if [ "$signal_number" -ne 0 ]; then
        deadline=$((SECONDS + STOP_TIMEOUT))
        while group_alive "$LAUNCHER_GROUP" && [ "$SECONDS" -lt "$deadline" ]; do
            sleep 0.2
        done
        if group_alive "$LAUNCHER_GROUP"; then
            echo "$(basename "$0"): error: ranks still running $STOP_TIMEOUT s after the signal: killed; the last checkpoint in --save is the one to resume from" >&2
            kill -KILL -- "-$LAUNCHER_GROUP" 2> /dev/null || true
        fi
        return $((128 + signal_number))
    fi
    return "$status"
}
