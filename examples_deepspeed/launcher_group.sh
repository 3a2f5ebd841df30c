# Sourced by the launch scripts: `fail` and `decimal` (one-line errors, exit 2), STOP_TIMEOUT checked
# when sourced (before anything starts, not when a signal comes), and `run_launcher COMMAND ...`
# runs the deepspeed launcher (`.../deepspeed ARGS`, run as megatron/parallel/deepspeed_command.py, whose
# status for a launch.py or a rank killed by signal N, or a launch.py stopped by SIGTERM, is 128 + N:
# DeepSpeed's runner would end with 0 when launch.py is killed) in its own process group and stops the whole run on SIGTERM / SIGINT / SIGHUP. The launcher itself does not: its
# outer process dies on SIGTERM and leaves the ranks training as orphans. Here the signal goes to
# this machine's ranks (the children of deepspeed.launcher.launch in the group): they save a final
# checkpoint (with --save) and exit, and the launcher, seeing them exit, ends with their status. With no rank
# here yet (still starting, or ranks reached by ssh) it goes to the whole group, whose launcher
# then stops the ranks its way. The script returns once no process of the group is left
# (STOP_TIMEOUT seconds at most, default 120, then SIGKILL; DeepSpeed's launch.py, signalled itself,
# kills its ranks 30 s after). Exit status: the launcher's, or 128 + the signal. The script also returns
# only once the group is empty when the launcher ended on its own: ranks whose launch.py was killed save
# and stop by themselves (megatron/parallel/launcher_watch.py). After a death by signal it names the
# newest checkpoint of SAVE_DIR (set by save_dir), which ranks killed by SIGKILL could not say.
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

# master_port: MASTER_PORT (default 29500, DeepSpeed's) checked as a TCP port, in decimal
master_port() {
    decimal MASTER_PORT "${MASTER_PORT:-29500}" 1 "set MASTER_PORT to a free TCP port (1-65535)"
    [ "$MASTER_PORT" -le 65535 ] || fail "MASTER_PORT = $MASTER_PORT is above 65535; set MASTER_PORT to a free TCP port (1-65535)"
}

# the ranks' and deepspeed_command.py's: this script launched them (megatron/parallel/launch_env.py), so a stop's line
# is the ranks', and a rendezvous error names MASTER_ADDR / MASTER_PORT in its environment, not the launcher's flags
MEGATRON_LAUNCH_SCRIPT="$(basename "$0")"
export MEGATRON_LAUNCH_SCRIPT

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

# save_dir DEFAULT FLAGS...: SAVE_DIR = the last --save among the trainer's FLAGS, else DEFAULT
save_dir() {
    SAVE_DIR="$1"
    shift
    while [ $# -gt 0 ]; do
        case "$1" in
            --save) SAVE_DIR="${2:-$SAVE_DIR}" ;;
            --save=*) SAVE_DIR="${1#--save=}" ;;
        esac
        shift
    done
}

# wait_group_end GROUP WHAT: until no process of the group is left, STOP_TIMEOUT seconds after WHAT at most; then SIGKILL
wait_group_end() {
    local deadline=$((SECONDS + STOP_TIMEOUT))
    while group_alive "$1" && [ "$SECONDS" -lt "$deadline" ]; do
        sleep 0.2
    done
    if group_alive "$1"; then
        echo "$(basename "$0"): error: ranks still running $STOP_TIMEOUT s after $2: killed; the last checkpoint in --save is the one to resume from" >&2
        kill -KILL -- "-$1" 2> /dev/null || true
    fi
}

# report_signal_death STATUS: for a launcher status 128 + N (a rank or launch.py killed by signal N,
# deepspeed_command.py), one line naming the newest checkpoint of SAVE_DIR (its 'latest')
report_signal_death() {
    local name latest="" last
    [ "$1" -gt 128 ] && [ "$1" -lt 192 ] && [ -n "${SAVE_DIR:-}" ] || return 0
    name="$(kill -l "$(($1 - 128))" 2> /dev/null)" || name="signal $(($1 - 128))"
    [ ! -f "$SAVE_DIR/latest" ] || latest="$(tr -d '[:space:]' < "$SAVE_DIR/latest")"
    if [ -n "$latest" ]; then
        last="last checkpoint $SAVE_DIR/$latest: rerun the same command to resume it (--load $SAVE_DIR)"
    else
        last="no checkpoint in $SAVE_DIR yet: a rerun starts from scratch"
    fi
    echo "$(basename "$0"): error: a rank or its launcher ended by SIG${name#SIG} (status $1) short of --train-iters; $last" >&2
}

# the signals that stop a run, NAME:NUMBER (POSIX fixes the numbers): a trap needs no $(kill -l), whose
# foreground child would let bash drop a SIGINT sent to this shell alone (kill -INT PID) as it waits for the
# child: a child that then exits normally is taken to have handled it
STOP_SIGNALS="TERM:15 INT:2 HUP:1"

run_launcher() {
    local status=0 signal_number=0
    if [ -z "${DS_ACCELERATOR+set}" ] && ! gpu_visible; then
        export DS_ACCELERATOR=cpu
    elif [ "${DS_ACCELERATOR-cpu}" != cpu ]; then
        "$(dirname "$1")/python" -m megatron.quiet "$(basename "$0")" || return
    fi
    if [ "$(basename "$1")" = deepspeed ]; then  # the runner and launch.py under deepspeed_command.py
        set -- "$(dirname "$1")/python" -P -m megatron.parallel.deepspeed_command "${@:2}"
        # this checkout's megatron, as its pretrain_bert.py runs
        PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}"
        export PYTHONPATH
    fi
    # a stop signal that comes before the traps below name the group (a Ctrl-C as the launcher starts): noted,
    # then sent again to this shell once they do
    local pending=""
    for name in TERM INT HUP; do
        # shellcheck disable=SC2064  # the signal is fixed now
        trap "pending=\${pending:-$name}" "$name"
    done
    set -m  # job control: the background job gets a process group of its own
    "$@" &
    LAUNCHER_GROUP=$!
    set +m
    # HUP: the terminal closed (an SSH session dropped), a stop like SIGTERM's; under nohup it stays
    # ignored (a shell cannot trap a signal ignored when it started)
    # no command substitution, nor any other foreground child, from the launch to the wait (STOP_SIGNALS)
    for name in $STOP_SIGNALS; do
        # shellcheck disable=SC2064  # the group id and the signal are fixed now
        trap "signal_number=${name#*:}; trap '' TERM INT HUP; stop_run ${name%:*} $LAUNCHER_GROUP" "${name%:*}"
    done
    [ -z "$pending" ] || kill -s "$pending" $$
    while :; do  # a trapped signal ends the wait early: wait again (once at least: a launcher ended already has a status)
        status=0
        wait "$LAUNCHER_GROUP" || status=$?
        # after a stop signal, STOP_TIMEOUT counts from it (wait_group_end): a rank waiting in a collective for
        # another node does not stop, and its launcher would be waited for until the distributed timeout
        [ "$signal_number" -eq 0 ] || break
        kill -0 "$LAUNCHER_GROUP" 2> /dev/null || break
    done
    if [ "$signal_number" -ne 0 ]; then
        wait_group_end "$LAUNCHER_GROUP" "the signal"
        return $((128 + signal_number))
    fi
    wait_group_end "$LAUNCHER_GROUP" "their launcher ended"
    report_signal_death "$status"
    return "$status"
}
