#!/usr/bin/env bash
# BERT with Linformer attention (K, V projected to LINFORMER_K) split over SP ranks (see bert_common.sh):
#   bert_distributed_linformer.sh PROCS PP SP SEQ_LEN MICRO_BATCH GLOBAL_BATCH LINFORMER_K LAYERS HIDDEN HEADS [flags]
ATTENTION=linformer VARIANT_ARG=LINFORMER_K VARIANT_KEY=sequence_parallel.linformer.k
source "$(dirname "$0")/bert_common.sh"
