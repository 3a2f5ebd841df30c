#!/usr/bin/env bash
# BERT with BigBird block-sparse attention split over SP ranks (see bert_common.sh):
#   bert_distributed_bigbird.sh PROCS PP SP SEQ_LEN MICRO_BATCH GLOBAL_BATCH BLOCK_SIZE LAYERS HIDDEN HEADS [flags]
ATTENTION=bigbird VARIANT_ARG=BLOCK_SIZE VARIANT_KEY=sequence_parallel.bigbird.block_size
source "$(dirname "$0")/bert_common.sh"
