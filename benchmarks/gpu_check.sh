#!/usr/bin/env bash
# The CUDA / NCCL path checked in one command on one GPU (issue 17), in two halves:
#
#   benchmarks/gpu_check.sh --prepare   HERE, on a machine with PyPI (make gpu-prepare): downloads
#                                       the wheels the GPU machine lacks (deepspeed and its pydantic)
#                                       into .cache/gpu_wheels, which git ignores, a few MiB
#   benchmarks/gpu_check.sh [STEP...]   ON THE GPU MACHINE (make gpu-check): torch 2.11 and the rest
#                                       are there, PyPI is not; installs the wheels with
#                                       pip --no-index, builds the data helpers, runs the steps below
#                                       (all by default) and writes their sections of
#                                       benchmarks/RESULTS.md, in under 10 minutes
#   --dry-run                           prints either half's commands without running them
#
# Steps: cuda-tests (pytest -m cuda), kernels (gpu_kernels.py: every kernel and the simulated
# P = 1/2/4 ring and BigBird vs float64, fp32 and bf16), trainer (pretrain_bert.py through the
# deepspeed launcher: 1 rank, bf16, ZeRO 1, FusedAdam, apex if present), train-step (ours vs HF
# BertForPreTraining, BERT-base and -large at s = 512 and 2048, bf16, MFU vs the measured bf16
# matmul rate), longest (gpu_longest.py: the longest BERT-base step at SP = 1, checkpointed).
# A failing step does not stop the others; the summary table records each one's status and time.
# Should the whole set run past a 10-minute limit, run it in two calls, e.g. `cuda-tests kernels
# trainer`, then `train-step longest` (each subset writes its own summary section).
#
# From a session with a GPU lent (the device tool), after `make gpu-prepare` here:
#   run(command="bash benchmarks/gpu_check.sh", carry=[".cache/gpu_wheels"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/.."

WHEELS=${GPU_WHEELS:-.cache/gpu_wheels}
WORK=${GPU_CHECK_WORK:-.cache/gpu_check}
PY=${GPU_PYTHON:-python3}  # on the GPU machine: the python that holds its CUDA torch
SITE=${GPU_SITE:-/tmp/gpu_check_site}
DRY=0 PREPARE=0 STEPS=()
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY=1 ;;
        --prepare) PREPARE=1 ;;
        cuda-tests|kernels|trainer|train-step|longest) STEPS+=("$arg") ;;
        *) echo "gpu_check.sh: unknown argument '$arg'; use --prepare, --dry-run or steps: cuda-tests kernels trainer train-step longest" >&2; exit 2 ;;
    esac
done
HEADING="GPU check: summary"  # a subset of the steps writes its own summary section
if [ ${#STEPS[@]} -gt 0 ]; then HEADING="$HEADING (${STEPS[*]})"; else STEPS=(cuda-tests kernels trainer train-step longest); fi

run() {  # prints the command, runs it unless --dry-run
    echo "+ $*"
    [ "$DRY" = 1 ] || "$@"
}

if [ "$PREPARE" = 1 ]; then
    # deepspeed's needs that the GPU image lacks; numpy, ninja, psutil, py-cpuinfo, msgpack, einops,
    # tqdm, packaging, transformers, pytest and pybind11 are there (.library/device/KINDS.md)
    PIP=${PIP:-.venv/bin/pip}
    run mkdir -p "$WHEELS"
    # deepspeed is an sdist: built here into a pure-Python wheel (its CUDA ops JIT-build there)
    run "$PIP" wheel --no-deps --no-build-isolation -w "$WHEELS" deepspeed==0.19.8
    run "$PIP" download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHEELS" hjson==3.1.0 pydantic==2.14.3 pydantic_core==2.50.4 \
        annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0
    [ "$DRY" = 1 ] || du -sh "$WHEELS"
    exit 0
fi

mkdir -p "$WORK"
SUMMARY="$WORK/summary.md"
[ "$DRY" = 1 ] || printf '| step | status | seconds |\n|---|---|---|\n' > "$SUMMARY"
FAILED=0

step() {  # step NAME COMMAND...: runs it with its log in $WORK/NAME.log, records status and time
    local name=$1 start status
    shift
    echo "+ $*"
    [ "$DRY" = 1 ] && return 0
    start=$(date +%s)
    "$@" > "$WORK/$name.log" 2>&1
    status=$?
    tail -n 25 "$WORK/$name.log"
    [ $status -eq 0 ] || FAILED=1
    echo "| $name | $([ $status -eq 0 ] && echo ok || echo "FAILED (exit $status, see $WORK/$name.log)") | $(( $(date +%s) - start )) |" >> "$SUMMARY"
}

wanted() { [[ " ${STEPS[*]} " == *" $1 "* ]]; }

# --- what the machine lacks: wheels (pip --no-index), the pybind11 data helpers ----------------
run "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH" PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR="$PWD/.cache/torch_extensions"  # DeepSpeed's JIT ops (FusedAdam)
run "$PY" setup.py -q build_ext --inplace
[ "$DRY" = 1 ] || "$PY" -c "import torch, deepspeed; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(), '| deepspeed', deepspeed.__version__)"
APEX=$("$PY" -c "import apex; print('present')" 2>/dev/null || echo "absent: torch LayerNorm and DeepSpeed FusedAdam")

# --- the checks ---------------------------------------------------------------------------------
wanted cuda-tests && step cuda-tests "$PY" -m pytest -q -m cuda -p no:cacheprovider tests/test_cuda_path.py

wanted kernels && step kernels "$PY" benchmarks/gpu_kernels.py --seq 1024

if wanted trainer; then
    cat > "$WORK/ds_bf16_zero1.json" <<'EOF'
{
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": 1},
  "bf16": {"enabled": true},
  "sequence_parallel": {"size": 1, "attention": "ring"}
}
EOF
    # no "optimizer" in the JSON: the trainer's AdamW, which DeepSpeed runs as FusedAdam on CUDA
    step trainer deepspeed --num_gpus 1 --master_port 29531 pretrain_bert.py --deepspeed \
        --deepspeed_config "$WORK/ds_bf16_zero1.json" --num-layers 4 --hidden-size 256 --num-attention-heads 4 \
        --seq-length 512 --max-position-embeddings 512 --train-iters 40 --lr 5e-4 --log-interval 10 \
        --eval-interval 40 --eval-iters 2 --log-dir "$WORK/trainer_run"
fi

if wanted train-step; then
    for shape in base large; do
        step "train-step-$shape" "$PY" benchmarks/train_step.py --shape "$shape" --seq-lengths 512 2048 \
            --contestants ours hf ring --tokens-per-step 16384 --repeats 5 --warmup 2 --no-extras
    done
fi

wanted longest && step longest "$PY" benchmarks/gpu_longest.py --start 16384 --step 8192 --budget-s 150

# --- the summary section of RESULTS.md ------------------------------------------------------------
if [ "$DRY" = 0 ]; then
    optimizer=$(grep -o -m1 "FusedAdam\|DeepSpeedCPUAdam\|torch.optim.AdamW\|AdamW" "$WORK/trainer.log" 2>/dev/null || echo "see $WORK/trainer.log")
    {
        echo "Machine: $("$PY" -c 'import sys; sys.path.insert(0, "benchmarks"); from results import machine; print(machine())'). "
        echo "Command: \`bash benchmarks/gpu_check.sh ${STEPS[*]}\` (wheels from \`make gpu-prepare\`). apex: $APEX; "
        echo "trainer optimizer: $optimizer. Trainer: 4 layers h=256, s=512, bf16, ZeRO 1, 1 rank, deepspeed launcher."
        echo
        cat "$SUMMARY"
    } > "$WORK/summary_section.md"
fi
run "$PY" benchmarks/results.py "$HEADING" "$WORK/summary_section.md"
exit $FAILED
