#!/usr/bin/env bash
# The README's main job: BERT pretraining at 1024 tokens with sequence parallelism (2 ranks)
# on the embedded default corpus and vocab, through the real deepspeed launcher.
# Creates .venv and installs the pinned requirements on first use; builds the corpus, vocab and
# preprocessed data into .cache/default_data once; extra flags are passed to pretrain_bert.py, their paths
# read from the folder the script is run in (runs/default and the rest are the repository's).
# Environment: MASTER_PORT (the rendezvous port, default 29500), STOP_TIMEOUT (launcher_group.sh).
[ -n "${BASH_VERSION:-}" ] || { echo "${0##*/}: error: this is a bash script, run by another shell; run it with bash: bash $0 ..." >&2; exit 2; }
set -euo pipefail
here="$PWD"  # the extra flags' relative paths (--save ck, --data-path d/x) are read from here, as typed
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"  # the install's relative paths (.venv, requirements.txt, megatron/)
source "$ROOT/examples_deepspeed/launcher_group.sh"  # SIGTERM / Ctrl-C stop every rank; no accelerator warning on CPU; STOP_TIMEOUT checked
# quietly COMMAND...: its output shown only if it fails (a Ctrl-C's Python traceback is not: the trap's line is)
quietly() {
    local status=0
    quiet_log="$(mktemp)"
    "$@" > "$quiet_log" 2>&1 || status=$?
    [ "$status" -eq 0 ] || cat "$quiet_log" >&2
    rm -f "$quiet_log"
    return "$status"
}
# .venv/.installed is written once the installs succeeded, holding a checksum of what they installed from (the
# pins, setup.py, the C++ helpers): a rerun with the same ones and the helpers built skips them (they took most
# of a minute on every rerun). A .venv without it and without pip is an interrupted first install (Ctrl-C while
# `python3.11 -m venv` ran ensurepip): made again, not used as it is.
# SIGINT as the script started with it: ignored in a `&` job of a batch script (then "trap -- '' SIGINT"), where
# the install's trap cannot take hold; restored after the install (`trap - INT` made it fatal there: the script then
# died at a SIGINT, leaving the launcher's group training, which run_launcher's trap could not catch)
sigint_at_start="$(trap -p INT)"
trap 'rm -f "${quiet_log:-}"; echo "pretrain_default.sh: stopped while installing .venv; run the same command again to finish the install" >&2; exit 130' INT
if [ ! -e .venv/.installed ] && [ ! -x .venv/bin/pip ]; then
    [ ! -e .venv ] || echo "pretrain_default.sh: .venv is incomplete (an interrupted install): making it again"
    quietly python3.11 -m venv --clear .venv
fi
installed_from="$({ cat requirements.txt setup.py pyproject.toml megatron/*/*.cpp 2> /dev/null || true; } | cksum)"
if [ "$(cat .venv/.installed 2> /dev/null)" != "$installed_from" ] || ! compgen -G 'megatron/data/helpers*.so' > /dev/null; then
    quietly .venv/bin/pip install -q -r requirements.txt
    quietly .venv/bin/pip install -q --no-build-isolation -e .
    echo "$installed_from" > .venv/.installed
fi
eval "${sigint_at_start:-trap - INT}"
export TORCH_EXTENSIONS_DIR="$ROOT/.cache/torch_extensions"  # DeepSpeed's JIT ops, built once
master_port  # MASTER_PORT, checked (launcher_group.sh)
# the launcher's own flags among the extra ones would go to pretrain_bert.py, which refused them after the launch
for token in "$@"; do
    case "${token%%=*}" in
        --master_port) fail "--master_port is a flag of the deepspeed launcher, which pretrain_default.sh calls for you (among the extra flags it would go to pretrain_bert.py); set MASTER_PORT in the environment: MASTER_PORT=29501 bash $0 ..." ;;
        --master_addr | --num_gpus | --num_accelerators | --num_nodes | --include | --exclude | --hostfile | --node_rank | --no_ssh | --launcher)
            fail "${token%%=*} is a flag of the deepspeed launcher, which pretrain_default.sh calls for you on this machine (among the extra flags it would go to pretrain_bert.py); for another launch use bert_distributed.sh or bert_multinode.sh (docs/launching.md)" ;;
    esac
done
cd "$here"
# the script's own paths as the messages name them: as the README writes them from the repository, else absolute
repo=""
[ "$here" -ef "$ROOT" ] || repo="$ROOT/"
save_dir "${repo}runs/default/checkpoints" "$@"  # resumed when run again; a --save among the extra flags moves it
save="$SAVE_DIR"
# Long packed samples (1024 tokens, several documents each, each attending to itself) split over the
# 2 ranks: the global layer by ring attention, the local (128-token window) layers by a halo exchange
# with the neighbour rank. The modern layers (rotary positions, local/global attention, GeGLU, no
# biases, no dropout) learn faster than the classic BERT layer in the same time on 2 cores
# (benchmarks/RESULTS.md, "Main job: classic or modern layers"; README: the measured run).
# --split 969,15,16: the default split's training documents, and 13 documents (4-5K tokens) each for
# validation and test, where the default leaves test one document, fewer tokens than one micro-batch.
TRAINER=(--deepspeed --deepspeed_config "${repo}ds_configs/ring_sp2.json" --pack-samples --seq-length 1024
    --num-layers 3 --hidden-size 128 --num-attention-heads 4 --ffn-hidden-size 192
    --position-embedding-type rope --rotary-base 10000 --local-attention-window 128 --global-attention-every 3
    --mlp-type geglu --disable-bias-linear --layernorm-epsilon 1e-5 --embedding-layernorm
    --no-first-layer-attention-norm --type-vocab-size 0 --bert-no-binary-head --hidden-dropout 0 --attention-dropout 0
    --micro-batch-size 2 --train-iters 1000 --lr 1e-3 --lr-warmup-fraction 0.02
    --log-interval 50 --eval-interval 250 --eval-iters 5 --split 969,15,16
    --save "$save" --load "$save" --log-dir "${repo}runs/default" "$@")
# before the launch, in the trainer's own line: a mistyped extra flag, and a --save or --log-dir a live run
# holds (this script started twice), which the ranks met only after 20-30 s of launch, and the second run
# first as the first one's rendezvous port; then MASTER_PORT, which another program (run) listens on (rank 0 said so
# after the launch and its imports); then the GPU count (one python: DeepSpeed's import, seconds)
gpus="$("${repo}.venv/bin/python" -c 'import sys; sys.path[:0] = [sys.argv.pop(1)]; import megatron.arguments as a
from megatron import errors; from megatron.parallel.master_address import check_launch_port; port = int(sys.argv.pop(1))
a.check_trainer_flags(sys.argv[1:])
code = errors.run_tool("pretrain_default.sh", lambda: check_launch_port("127.0.0.1", port)); code and sys.exit(code)
import torch; print(torch.cuda.device_count())' "$ROOT" "$MASTER_PORT" "${TRAINER[@]}")"
gpus="${gpus##*$'\n'}"  # the last line: the count
ranks=2 sp=()
if [ "$gpus" -eq 0 ]; then
    export CUDA_VISIBLE_DEVICES=""  # sequence parallelism over 2 ranks: 2 CPU processes over gloo
elif [ "$gpus" -eq 1 ]; then
    ranks=1 sp=(--sequence-parallel-size 1)  # NCCL needs a GPU per rank: one GPU, the whole sequence
    echo "pretrain_default.sh: one GPU found: training on it with sequence-parallel size 1 (2 GPUs give SP=2)"
fi
set +e  # a stop (Ctrl-C, SIGTERM) is told below: this script passes --load itself, a rerun resumes
run_launcher "${repo}.venv/bin/deepspeed" --num_gpus "$ranks" --master_port "$MASTER_PORT" "${repo}pretrain_bert.py" \
    "${sp[@]}" "${TRAINER[@]}"
status=$?
set -e
case "$status" in
    0) ;;
    129 | 130 | 143)
        echo "pretrain_default.sh: stopped; run bash ${repo}examples_deepspeed/pretrain_default.sh again to resume from $save (it loads it itself)" >&2
        exit "$status" ;;
    *) exit "$status" ;;
esac
# What the model learned: its top guesses for masked words of two sentences
"${repo}.venv/bin/python" "${repo}tools/fill_mask.py" --load "$save" \
    --text "the function returns a [MASK] of the values." --text "see the [MASK] for more details."
