#!/usr/bin/env bash
# BERT with ring sequence-parallel attention through the deepspeed launcher (see bert_common.sh):
#   bert_distributed.sh PROCS PP SP SEQ_LEN MICRO_BATCH GLOBAL_BATCH LAYERS HIDDEN HEADS [pretrain_bert.py flags]
#   e.g. bert_distributed.sh 8 1 8 16384 1 4 24 1024 16 --data-path DATA --vocab-file vocab.txt
[ -n "${BASH_VERSION:-}" ] || { echo "${0##*/}: error: this is a bash script, run by another shell; run it with bash: bash $0 ..." >&2; exit 2; }
ATTENTION=ring
source "$(dirname "$0")/bert_common.sh"
