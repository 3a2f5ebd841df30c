# Sourced by bert_distributed.sh, bert_distributed_linformer.sh and bert_distributed_bigbird.sh
# (which set ATTENTION, and VARIANT_ARG + VARIANT_KEY for the variant's own positional argument):
# the positional arguments of the original long-sequence scripts -> a DeepSpeed JSON made from a
# template in ds_configs/ with tools/ds_config.py (validated for this world size) -> the deepspeed
# launcher on pretrain_bert.py. Flags after the positional arguments go to pretrain_bert.py and win
# over the defaults below (--train-iters, --data-path, --vocab-file, --save, ...).
#
# Environment: RUN_DIR (the JSON, logs and checkpoints; default runs/<script name>), MASTER_PORT,
# HOSTFILE + NUM_NODES (several machines; bert_multinode.sh sets them), NODE_RANK + MASTER_ADDR
# (start only this machine's ranks, without ssh), DRY_RUN=1 (print the launcher command, run nothing),
# PYTHON (default .venv/bin/python; the deepspeed launcher beside it is used).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
SCRIPT="$(basename "$0")"

NAMES=(PROCS PP SP SEQ_LEN MICRO_BATCH GLOBAL_BATCH ${VARIANT_ARG:-} LAYERS HIDDEN HEADS)
if [ $# -lt ${#NAMES[@]} ]; then
    echo "usage: $SCRIPT ${NAMES[*]} [pretrain_bert.py flags ...]  (PROCS: ranks per node)" >&2
    exit 2
fi
for name in "${NAMES[@]}"; do
    case "$1" in
        '' | *[!0-9]* | 0) echo "$SCRIPT: error: $name = '$1' is not a positive integer; pass ${NAMES[*]}" >&2; exit 2 ;;
    esac
    printf -v "$name" %s "$1"
    shift
done

RUN_DIR="${RUN_DIR:-$ROOT/runs/${SCRIPT%.sh}}"
NODES="${NUM_NODES:-1}"
TEMPLATE="$ROOT/ds_configs/${ATTENTION}_sp2.json"
[ "$PP" -eq 1 ] || TEMPLATE="$ROOT/ds_configs/pipeline_zero1_ring_sp2.json"
MODEL=(--num-layers "$LAYERS" --hidden-size "$HIDDEN" --num-attention-heads "$HEADS" --seq-length "$SEQ_LEN"
       --max-position-embeddings "$SEQ_LEN" --attention-dropout 0 --pipeline-model-parallel-size "$PP")
SETTINGS=(sequence_parallel.size="$SP" sequence_parallel.attention="$ATTENTION"
          train_micro_batch_size_per_gpu="$MICRO_BATCH" train_batch_size="$GLOBAL_BATCH"
          gradient_accumulation_steps=null)  # null: derived from global / (micro x data-parallel size)
[ -z "${VARIANT_KEY:-}" ] || SETTINGS+=("$VARIANT_KEY=${!VARIANT_ARG}")
"$PYTHON" "$ROOT/tools/ds_config.py" set "$TEMPLATE" "${SETTINGS[@]}" --output "$RUN_DIR/ds_config.json" \
    --world-size $((NODES * PROCS)) "${MODEL[@]}" > /dev/null

LAUNCHER=("$(dirname "$PYTHON")/deepspeed" --num_gpus "$PROCS" --master_port "${MASTER_PORT:-29500}")
if [ -n "${HOSTFILE:-}" ]; then
    LAUNCHER+=(--hostfile "$HOSTFILE" --num_nodes "$NODES")
    if [ -n "${NODE_RANK:-}" ]; then
        LAUNCHER+=(--no_ssh --node_rank "$NODE_RANK" --master_addr "${MASTER_ADDR:?NODE_RANK needs MASTER_ADDR, the address of the node with rank 0}")
    fi
fi
COMMAND=("${LAUNCHER[@]}" "$ROOT/pretrain_bert.py" --deepspeed --deepspeed_config "$RUN_DIR/ds_config.json"
         "${MODEL[@]}" --train-iters 1000 --lr 1e-4 --lr-warmup-fraction 0.01 --log-interval 10
         --eval-interval 500 --eval-iters 10 --save "$RUN_DIR/checkpoints" --save-interval 500 --log-dir "$RUN_DIR" "$@")
if [ "${DRY_RUN:-0}" = 1 ]; then
    printf '%q ' "${COMMAND[@]}"
    echo
    exit 0
fi
exec "${COMMAND[@]}"
