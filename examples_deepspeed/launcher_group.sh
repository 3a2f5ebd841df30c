# Sourced by the launch scripts: `run_launcher COMMAND ...` runs the deepspeed launcher in its own
# process group and stops the whole run on SIGTERM / SIGINT. The launcher itself does not: its
# outer process dies on SIGTERM and leaves the ranks training as orphans. Here the signal goes to
# every process of the group (launcher and ranks); the ranks save a final checkpoint (with --save)
# and exit, and the script returns once none of them is left (STOP_TIMEOUT seconds at most, default
# 120, then SIGKILL). Exit status: the launcher's, or 128 + the signal.

# processes of group $1 that are not zombies (a reparented zombie can outlive its group's work)
group_alive() {
    if command -v ps > /dev/null; then
        ps -e -o pgid=,stat= | awk -v group="$1" '$1 == group && $2 !~ /^Z/ { found = 1 } END { exit !found }'
    else
        kill -0 -- "-$1" 2> /dev/null
    fi
}

run_launcher() {
    local status=0 signal_number=0 deadline
    set -m  # job control: the background job gets a process group of its own
    "$@" &
    LAUNCHER_GROUP=$!
    set +m
    # shellcheck disable=SC2064  # the group id is fixed now
    trap "signal_number=15; trap '' TERM INT; kill -TERM -- -$LAUNCHER_GROUP 2> /dev/null || true" TERM
    trap "signal_number=2; trap '' TERM INT; kill -INT -- -$LAUNCHER_GROUP 2> /dev/null || true" INT
    while kill -0 "$LAUNCHER_GROUP" 2> /dev/null; do
        status=0
        wait "$LAUNCHER_GROUP" || status=$?
    done
    if [ "$signal_number" -ne 0 ]; then
        deadline=$((SECONDS + ${STOP_TIMEOUT:-120}))
        while group_alive "$LAUNCHER_GROUP" && [ "$SECONDS" -lt "$deadline" ]; do
            sleep 0.2
        done
        if group_alive "$LAUNCHER_GROUP"; then
            echo "$(basename "$0"): error: ranks still running ${STOP_TIMEOUT:-120} s after the signal: killed; the last checkpoint in --save is the one to resume from" >&2
            kill -KILL -- "-$LAUNCHER_GROUP" 2> /dev/null || true
        fi
        return $((128 + signal_number))
    fi
    return "$status"
}
