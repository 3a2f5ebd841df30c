#!/usr/bin/env bash
# BERT with Linformer attention (K, V projected to LINFORMER_K) split over SP ranks (see bert_common.sh):
#   bert_distributed_linformer.sh PROCS PP SP SEQ_LEN MICRO_BATCH GLOBAL_BATCH LINFORMER_K LAYERS HIDDEN HEADS [flags]
[ -n "${BASH_VERSION:-}" ] || { echo "${0##*/}: error: this is a bash script, run by another shell; run it with bash: bash $0 ..." >&2; exit 2; }
ATTENTION=linformer VARIANT_ARG=LINFORMER_K VARIANT_KEY=sequence_parallel.linformer.k VARIANT_FLAG=--linformer-k
source "$(dirname "$0")/bert_common.sh"
