# Sourced by bert_distributed.sh, bert_distributed_linformer.sh and bert_distributed_bigbird.sh
# (which set ATTENTION, and VARIANT_ARG + VARIANT_KEY + VARIANT_FLAG for the variant's own positional
# argument):
# the positional arguments of the original long-sequence scripts -> a DeepSpeed JSON made from a
# template in ds_configs/ with tools/ds_config.py (validated for this world size) -> the deepspeed
# launcher on pretrain_bert.py. Flags after the positional arguments go to pretrain_bert.py and win
# over the defaults below (--train-iters, --data-path, --vocab-file, --save, ...); those that the
# positional arguments or the script's JSON fix (--micro-batch-size, --attention, --deepspeed_config,
# ...) are refused.
#
# Environment: RUN_DIR (the JSON, logs and checkpoints; default runs/<script name>), MASTER_PORT,
# HOSTFILE + NUM_NODES (several machines; bert_multinode.sh sets them; HOSTFILE alone: every host it lists),
# NODE_RANK + MASTER_ADDR (start only this machine's ranks, without ssh; else the first host must answer
# passwordless ssh),
# DRY_RUN=1 (print the JSON and the launcher command, write and run nothing), STOP_TIMEOUT (launcher_group.sh),
# PYTHON (default .venv/bin/python; the deepspeed launcher beside it is used).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
SCRIPT="$(basename "$0")"
source "$ROOT/examples_deepspeed/launcher_group.sh"  # also fail, decimal and the STOP_TIMEOUT check
[ "${BASH_VERSINFO[0]}" -ge 4 ] || fail "bash $BASH_VERSION is older than 4, whose associative arrays this script uses; run it with bash 4 or newer"

NAMES=(PROCS PP SP SEQ_LEN MICRO_BATCH GLOBAL_BATCH ${VARIANT_ARG:-} LAYERS HIDDEN HEADS)
if [ $# -lt ${#NAMES[@]} ]; then
    echo "usage: $SCRIPT ${NAMES[*]} [pretrain_bert.py flags ...]  (PROCS: ranks per node)" >&2
    exit 2
fi
for name in "${NAMES[@]}"; do
    case "$1" in
        '' | *[!0-9]*) fail "$name = '$1' is not a positive integer; pass ${NAMES[*]}" ;;
    esac
    decimal "$name" "$1" 0 "pass ${NAMES[*]}"
    [ "${!name}" -ge 1 ] || fail "$name = '$1' is not a positive integer; pass ${NAMES[*]}"
    shift
done
# Flags that the positional arguments or the script fix: after them pretrain_bert.py would take them
# over what the script validated and wrote to RUN_DIR/ds_config.json (argparse's last flag wins),
# also as --flag=value or an abbreviation (--micro-batch; argparse's allow_abbrev).
# The deepspeed launcher's own flags: the script calls it, so after the positional arguments they would go
# to pretrain_bert.py, which refused them only once the launcher had started the ranks on every node. RUNNER
# names the ones whose setting the script takes elsewhere; the others (--force_multi, --ssh_port,
# --launcher_args, --bind_cores_to_rank, --module, elastic flags, ...) fail the trainer's parser before the launch.
HOSTS_FIX="list only the hosts to use in HOSTFILE (bert_multinode.sh HOSTFILE NUM_NODES ...); CUDA_VISIBLE_DEVICES picks a node's GPUs"
declare -A RUNNER=([--include]=$HOSTS_FIX [--exclude]=$HOSTS_FIX [--hostfile]=$HOSTS_FIX
                   [--num_nodes]="set NUM_NODES (bert_multinode.sh HOSTFILE NUM_NODES ...)"
                   [--num_gpus]="change the PROCS argument (ranks per node)" [--num_accelerators]="change the PROCS argument (ranks per node)"
                   [--master_addr]="set MASTER_ADDR in the environment" [--master_port]="set MASTER_PORT in the environment"
                   [--node_rank]="set NODE_RANK and MASTER_ADDR in the environment" [--no_ssh]="set NODE_RANK and MASTER_ADDR in the environment"
                   [--launcher]="launch pretrain_bert.py with deepspeed yourself for another launcher")
declare -A FIXED=([--num-layers]=LAYERS [--hidden-size]=HIDDEN [--num-attention-heads]=HEADS [--seq-length]=SEQ_LEN
                  [--pipeline-model-parallel-size]=PP [--sequence-parallel-size]=SP
                  [--micro-batch-size]=MICRO_BATCH [--global-batch-size]=GLOBAL_BATCH [--attention]=ATTENTION
                  [--bigbird]=ATTENTION [--deepspeed_config]=JSON [--deepscale_config]=JSON [--deepspeed-config]=JSON)
[ -z "${VARIANT_FLAG:-}" ] || FIXED[$VARIANT_FLAG]=$VARIANT_ARG
for token in "$@"; do
    name="${token%%=*}"
    case "$name" in
        --deepspeed | --deepscale) continue ;;  # the trainer's own flags, prefixes of --deepspeed_config
        --dry-run) fail "--dry-run after the positional arguments would go to pretrain_bert.py and launch; set DRY_RUN=1 (or bert_multinode.sh --dry-run HOSTFILE ...)" ;;
        --?*) ;;
        *) continue ;;
    esac
    [ -z "${RUNNER[$name]:-}" ] || fail "$name is a flag of the deepspeed launcher, which $SCRIPT calls for you (after the positional arguments it would go to pretrain_bert.py); ${RUNNER[$name]}"
    for flag in $(printf '%s\n' "${!FIXED[@]}" | sort); do  # in one order: --seq names --seq-length
        [[ "$flag" == "$name"* ]] || continue
        [ "$name" = "$flag" ] && given="$name" || given="$name (for $flag)"
        case "${FIXED[$flag]}" in
            ATTENTION) fail "$given after the positional arguments would override the script's $ATTENTION attention; use bert_distributed.sh (ring), bert_distributed_linformer.sh or bert_distributed_bigbird.sh, or launch pretrain_bert.py with deepspeed and a JSON of ds_configs/" ;;
            JSON) fail "$given after the positional arguments would replace the JSON the script writes to RUN_DIR/ds_config.json; drop it, or launch pretrain_bert.py with deepspeed and your JSON" ;;
            *) fail "$given after the positional arguments would override ${FIXED[$flag]} = ${!FIXED[$flag]} in the JSON and command the script made; change the ${FIXED[$flag]} argument instead" ;;
        esac
    done
done
# decimal() normalizes the environment's values under their own names (the messages name them)
[ -z "${NUM_NODES:-}" ] || decimal NUM_NODES "$NUM_NODES" 1 "set NUM_NODES to the number of machines"
master_port
found="$(command -v -- "$PYTHON")" || fail "PYTHON $PYTHON is not an executable; set PYTHON to the python of the environment the trainer is installed in (the README's commands create .venv)"
PYTHON="$found"
[ -x "$(dirname "$PYTHON")/deepspeed" ] || fail "no deepspeed launcher beside $PYTHON; install the requirements into that environment (pip install -r requirements.txt) or set PYTHON to another"
DRY_RUN="${DRY_RUN:-0}"
case "$DRY_RUN" in
    0 | 1) ;;
    *) fail "DRY_RUN = '$DRY_RUN' is not 0 or 1; set DRY_RUN=1 to print the launch without running it" ;;
esac
if [ -n "${HOSTFILE:-}" ]; then  # DeepSpeed's launcher would stop on a bad line with a traceback: name the line here
    # and, when it would reach the hosts by ssh (no NODE_RANK), check that ssh as it does, but before the JSON is written
    # (and the .deepspeed_env files it would export to them, which a launch per node with NODE_RANK does not read)
    # Without NUM_NODES the launch uses every host it lists, as `deepspeed --hostfile` alone does. The same ssh call
    # checks MASTER_PORT on that first host, where rank 0 hosts the rendezvous (below, MASTER is '' for such a launch)
    ssh=() nodes=()
    [ -n "${NODE_RANK:-}" ] || [ "$DRY_RUN" = 1 ] || ssh=(--ssh --master-port "$MASTER_PORT")
    [ -z "${NODE_RANK:-}" ] || ssh=(--no-ssh)
    [ -z "${NUM_NODES:-}" ] || nodes=(--num-nodes "$NUM_NODES")
    NUM_NODES="$("$PYTHON" "$ROOT/tools/check_hostfile.py" "$HOSTFILE" "${nodes[@]}" --ranks-per-node "$PROCS" \
        --script-names "$SCRIPT" --print-num-nodes "${ssh[@]}")"
fi
NUM_NODES="${NUM_NODES:-1}"
WORLD=$((NUM_NODES * PROCS))
# without a hostfile the launcher starts PROCS ranks here alone: a world of NUM_NODES machines never forms
[ -n "${HOSTFILE:-}" ] || [ "$NUM_NODES" -eq 1 ] || fail "NUM_NODES $NUM_NODES is set without HOSTFILE; launch several machines with bert_multinode.sh HOSTFILE NUM_NODES $SCRIPT ..."
# (NODE_RANK=0 alone is a scheduler's single node, e.g. AzureML's)
[ -n "${HOSTFILE:-}" ] || [[ "${NODE_RANK:-0}" =~ ^0+$ ]] || fail "NODE_RANK $NODE_RANK is set without HOSTFILE; launch several machines with bert_multinode.sh HOSTFILE NUM_NODES $SCRIPT ..."
if [ -n "${HOSTFILE:-}" ] && [ -n "${NODE_RANK:-}" ]; then
    decimal NODE_RANK "$NODE_RANK" 0 "set NODE_RANK to this machine's index, 0 to NUM_NODES - 1"
    [ "$NODE_RANK" -lt "$NUM_NODES" ] || fail "NODE_RANK $NODE_RANK is beyond the $NUM_NODES nodes (NUM_NODES); set NODE_RANK to this machine's index, 0 to $((NUM_NODES - 1))"
    [ -n "${MASTER_ADDR:-}" ] || fail "NODE_RANK is set without MASTER_ADDR; set MASTER_ADDR to the address of the node with rank 0"
fi

RUN_DIR="${RUN_DIR:-$ROOT/runs/${SCRIPT%.sh}}"
# RUN_DIR, or the nearest folder above it that exists, must take a new folder (else ds_config.py's
# error would name its own --output); a dry run checks it too (the probe folder is removed at once: it
# leaves nothing), else it passed a RUN_DIR the launch then refused
RUN_FIX="set RUN_DIR to a directory this user can write, for the config, logs and checkpoints"
existing="$RUN_DIR"
while [ ! -e "$existing" ] && [ ! -L "$existing" ]; do
    existing="$(dirname -- "$existing")"
done
if [ ! -d "$existing" ]; then
    [ "$existing" = "$RUN_DIR" ] || fail "RUN_DIR $RUN_DIR lies under $existing, which is a file; $RUN_FIX"
    fail "RUN_DIR $RUN_DIR is a file, not a directory; $RUN_FIX"
fi
# the folders of RUN_DIR that this script made, removed again (empty) when nothing ran in them
remove_made_run_dir() {
    local made="$RUN_DIR"
    while [ "$made" != "$existing" ] && rmdir -- "$made" 2> /dev/null; do
        made="$(dirname -- "$made")"
    done
}
probe="$(mktemp -d -- "$existing/.run_dir_probe.XXXXXX" 2> /dev/null)" && rmdir -- "$probe" ||
    fail "RUN_DIR $RUN_DIR cannot be created or written: $existing takes no new folder; $RUN_FIX"
TEMPLATE="$ROOT/ds_configs/${ATTENTION}_sp2.json"
[ "$PP" -eq 1 ] || TEMPLATE="$ROOT/ds_configs/pipeline_zero1_ring_sp2.json"
MODEL=(--num-layers "$LAYERS" --hidden-size "$HIDDEN" --num-attention-heads "$HEADS" --seq-length "$SEQ_LEN"
       --max-position-embeddings "$SEQ_LEN" --attention-dropout 0 --pipeline-model-parallel-size "$PP")
SETTINGS=(sequence_parallel.size="$SP" sequence_parallel.attention="$ATTENTION"
          train_micro_batch_size_per_gpu="$MICRO_BATCH" train_batch_size="$GLOBAL_BATCH"
          gradient_accumulation_steps=null)  # null: derived from global / (micro x data-parallel size)
[ -z "${VARIANT_KEY:-}" ] || SETTINGS+=("$VARIANT_KEY=${!VARIANT_ARG}")
# packed samples (several documents per sequence, each attending to itself; --no-pack-samples turns
# it off): linformer's projection mixes positions across segments, so it trains unpacked
[ "$ATTENTION" = linformer ] || SETTINGS+=(sequence_parallel.pack_samples=true)
LAUNCHER=("$(dirname "$PYTHON")/deepspeed" --num_gpus "$PROCS" --master_port "$MASTER_PORT")
if [ -n "${HOSTFILE:-}" ]; then
    LAUNCHER+=(--hostfile "$HOSTFILE" --num_nodes "$NUM_NODES")
    if [ -n "${NODE_RANK:-}" ]; then
        LAUNCHER+=(--no_ssh --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR")
    fi
fi
# --load of the --save folder: the same command starts the run (nothing saved yet: from scratch) and resumes
# it when requeued; a --save or --load among the flags moves either
save_dir "$RUN_DIR/checkpoints" "$@"
# a launch per node (NODE_RANK > 0) writes its own JSON, ds_config.node<N>.json: in a RUN_DIR the nodes share, one
# ds_config.json would be each node's in turn, the last written read by every rank (another node's micro batch or
# ZeRO stage taken silently); with a file per node, the trainer compares them and names what differs
JSON=ds_config.json
[ -z "${HOSTFILE:-}" ] || [ -z "${NODE_RANK:-}" ] || [ "$((10#$NODE_RANK))" -eq 0 ] ||
    JSON="ds_config.node$((10#$NODE_RANK)).json"
COMMAND=("${LAUNCHER[@]}" "$ROOT/pretrain_bert.py" --deepspeed --deepspeed_config "$RUN_DIR/$JSON"
         "${MODEL[@]}" --train-iters 1000 --lr 1e-4 --lr-warmup-fraction 0.01 --log-interval 10
         --eval-interval 500 --eval-iters 10 --save "$SAVE_DIR" --load "$SAVE_DIR" --save-interval 500 --log-dir "$RUN_DIR" "$@")
# --script-names: its errors name this script (SCRIPT: error: ...) and its arguments (GLOBAL_BATCH, LAYERS, ...), not
# the tool and the flags and keys they set
CONFIG=("$PYTHON" "$ROOT/tools/ds_config.py" set "$TEMPLATE" "${SETTINGS[@]}" --world-size "$WORLD" "${MODEL[@]}"
        --script-names "$SCRIPT")
# the trainer's parser on the flags the command passes it, in a dry run and before a launch alike: an
# unknown or mistyped flag fails here, once, not on every node after the launch (a few seconds: DeepSpeed's import);
# then the layout, whose fix names this script's arguments (ds_config.py's would name deepspeed's and the trainer's);
# then, before a launch on the node that hosts rank 0 (this one, unless the launcher reaches the hosts by ssh), a
# MASTER_PORT another run listens on: rank 0 said so only after the launch and its imports (half a minute)
TRAINER_FLAGS=("${COMMAND[@]:${#LAUNCHER[@]}+1}")
MASTER=""
if [ "$DRY_RUN" = 0 ] && { [ -z "${HOSTFILE:-}" ] || [ "${NODE_RANK:-}" = 0 ]; }; then
    MASTER="127.0.0.1:$MASTER_PORT"  # deepspeed's address without a hostfile
    [ -z "${HOSTFILE:-}" ] || MASTER="$MASTER_ADDR:$MASTER_PORT"
fi
"$PYTHON" -c 'import sys; sys.path[:0] = [sys.argv.pop(1)]
from megatron import arguments, errors
from megatron.parallel.launch_check import check_script_launch
script, master, sizes = sys.argv[1], sys.argv[2], [int(size) for size in sys.argv[3:7]]
arguments.check_trainer_flags(sys.argv[7:])
sys.exit(errors.run_tool(script, lambda: check_script_launch(*sizes, master)))' \
    "$ROOT" "$SCRIPT" "$MASTER" "$NUM_NODES" "$PROCS" "$PP" "$SP" "${TRAINER_FLAGS[@]}"
if [ "$DRY_RUN" = 1 ]; then
    # a dry run writes nothing: the JSON it would write is printed, and where the command reads it
    json="$("${CONFIG[@]}" --output -)"  # a refused JSON is its error line alone, not after the header below
    echo "# RUN_DIR/$JSON ($RUN_DIR/$JSON) would hold this JSON; the command below reads it there:"
    printf '%s\n' "$json"
    printf '%q ' "${COMMAND[@]}"
    echo
    exit 0
fi
# a launch that ended before any rank wrote into the RUN_DIR this script made (it holds the nodes' JSONs alone) leaves
# no RUN_DIR: refused at start-up (the trainer's one line, 2), stopped before the ranks started (Ctrl-C 130, SIGTERM
# 143), failed. A RUN_DIR that existed before, or that holds anything else (logs, checkpoints), is kept; a node's
# own ds_config.node<N>.json is removed from one another node made.
remove_unused_run_dir() {
    local name
    for name in $(ls -A -- "$RUN_DIR" 2> /dev/null); do
        [[ "$name" =~ ^ds_config(\.node[0-9]+)?\.json$ ]] || return 0
    done
    if [ "$RUN_DIR" != "$existing" ]; then
        rm -f -- "$RUN_DIR/$JSON"
        remove_made_run_dir
    elif [ "$JSON" != ds_config.json ]; then
        rm -f -- "$RUN_DIR/$JSON"
    fi
}
# a stop while the JSON is written (run_launcher's traps take over at the launch)
for name in $STOP_SIGNALS; do
    # shellcheck disable=SC2064  # the status is fixed now
    trap "trap '' TERM INT HUP; remove_unused_run_dir; exit $((128 + ${name#*:}))" "${name%:*}"
done
mkdir -p -- "$RUN_DIR"  # ds_config.py writes into an existing folder only: RUN_DIR is made here, and removed if refused
status=0
"${CONFIG[@]}" --output "$RUN_DIR/$JSON" > /dev/null || status=$?
[ "$status" -ne 0 ] || run_launcher "${COMMAND[@]}" || status=$?
[ "$status" -eq 0 ] || remove_unused_run_dir
exit "$status"
