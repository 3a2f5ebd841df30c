#!/usr/bin/env bash
# BERT with BigBird block-sparse attention split over SP ranks (see bert_common.sh):
#   bert_distributed_bigbird.sh PROCS PP SP SEQ_LEN MICRO_BATCH GLOBAL_BATCH BLOCK_SIZE LAYERS HIDDEN HEADS [flags]
[ -n "${BASH_VERSION:-}" ] || { echo "${0##*/}: error: this is a bash script, run by another shell; run it with bash: bash $0 ..." >&2; exit 2; }
ATTENTION=bigbird VARIANT_ARG=BLOCK_SIZE VARIANT_KEY=sequence_parallel.bigbird.block_size VARIANT_FLAG=--block-size
source "$(dirname "$0")/bert_common.sh"
