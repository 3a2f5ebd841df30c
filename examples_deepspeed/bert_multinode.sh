#!/usr/bin/env bash
# Several machines from a hostfile (lines `worker-1 slots=8`, see hostfile.example):
#   bert_multinode.sh HOSTFILE NUM_NODES SCRIPT ARGS ...
# SCRIPT is bert_distributed.sh, bert_distributed_linformer.sh or bert_distributed_bigbird.sh with its
# own arguments, PROCS being the ranks per node; the launch is `deepspeed --hostfile HOSTFILE
# --num_nodes NUM_NODES --num_gpus PROCS ...`, which reaches the other hosts by passwordless ssh.
# Without ssh (schedulers, containers) run the same command on every machine with NODE_RANK=0..N-1
# and MASTER_ADDR=<address of node 0>. --dry-run prints the launcher command instead of running it.
[ -n "${BASH_VERSION:-}" ] || { echo "${0##*/}: error: this is a bash script, run by another shell; run it with bash: bash $0 ..." >&2; exit 2; }
set -euo pipefail
USAGE="usage: $(basename -- "$0") [--dry-run] HOSTFILE NUM_NODES SCRIPT ARGS ..."
if [ "${1:-}" = --dry-run ]; then
    export DRY_RUN=1
    shift
fi
# options come before HOSTFILE NUM_NODES SCRIPT (dash words after them are SCRIPT's flags): -h, --help, --dry-run first
for word in "${@:1:3}"; do
    case "$word" in
        -h | --help) echo "$USAGE"; sed -n '2,8s/^# \{0,1\}//p' "$0"; exit 0 ;;
        --dry-run) echo "$(basename -- "$0"): error: --dry-run goes first; $USAGE" >&2; exit 2 ;;
        -*) echo "$(basename -- "$0"): error: unknown option $word; $USAGE" >&2; exit 2 ;;
    esac
done
if [ $# -lt 3 ]; then
    echo "$USAGE" >&2
    exit 2
fi
[ -n "$1" ] || { echo "$(basename "$0"): error: HOSTFILE is empty; pass the hostfile's path (lines 'worker-1 slots=8', see hostfile.example)" >&2; exit 2; }
case "$2" in
    '' | *[!0-9]* | 0) echo "$(basename "$0"): error: NUM_NODES = '$2' is not a positive integer; pass HOSTFILE NUM_NODES SCRIPT ARGS ..." >&2; exit 2 ;;
esac
# the script checks the hostfile (bert_common.sh); SCRIPT may be given as a path to the one beside this
HOSTFILE="$(realpath -m -s -- "$1")" NUM_NODES="$2" GIVEN="$3" SCRIPT="$(basename -- "$3")"
shift 3
case "$SCRIPT" in
    bert_distributed.sh | bert_distributed_linformer.sh | bert_distributed_bigbird.sh) ;;
    *) echo "$(basename "$0"): error: SCRIPT $SCRIPT is not a launch script; use bert_distributed.sh, bert_distributed_linformer.sh or bert_distributed_bigbird.sh" >&2; exit 2 ;;
esac
HERE="$(dirname "$(realpath "$0")")"
if [ "$GIVEN" != "$SCRIPT" ] && [ "$(realpath -m -- "$GIVEN")" != "$HERE/$SCRIPT" ]; then
    echo "$(basename "$0"): error: SCRIPT $GIVEN is not the $SCRIPT beside $(basename "$0") ($HERE/$SCRIPT), which is what runs; pass $SCRIPT and put your settings in its arguments and flags" >&2
    exit 2
fi
export HOSTFILE NUM_NODES
exec "$HERE/$SCRIPT" "$@"
