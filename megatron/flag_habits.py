"""Megatron-LM's and Megatron-DeepSpeed's flags that this trainer and tools/preprocess_data.py do not take,
each with what this repository does instead (or why it has nothing) and the change that works here.

The parsers refuse them before argparse matches abbreviations (OneLineParser's `habits`): Megatron-LM's
--sequence-parallel (its tensor-parallel activation splitting) would otherwise be read as an abbreviation
of --sequence-parallel-size, and `--sequence-parallel 2` would switch on this trainer's sequence parallelism.
docs/deepspeed.md's "Coming from Megatron-LM" table is markdown_table() of these rows (a test holds both
equal). Each row: flag -> (whose flag it is, what this trainer does instead or why it has none, the fix).
In the fix, {value} stands for the value given with the flag (N when none was).
"""
import re

from megatron.paths import in_repository

DOCS, DOCS_SECTION = "docs/deepspeed.md", "Coming from Megatron-LM / Megatron-DeepSpeed"  # markdown_table()'s place
MEGATRON = "Megatron-LM"
MEGATRON_DS = "Megatron-DeepSpeed"
JSON = "pass --deepspeed --deepspeed_config FILE with"  # the start of a fix that names a section of the JSON

# the tokenizer flags of both Megatron programs (training and preprocessing)
TOKENIZER_HABITS = {
    "--tokenizer-model": (MEGATRON, "this repository reads a WordPiece vocab.txt or a Hugging Face tokenizer.json, "
                          "not a SentencePiece .model", "pass --tokenizer-file TOKENIZER.json (or the model folder "
                          "holding it), or --vocab-file vocab.txt for WordPiece"),
    "--merge-file": (MEGATRON, "GPT's BPE vocab and merges are read from a Hugging Face tokenizer.json",
                     "pass --tokenizer-file TOKENIZER.json of that BPE tokenizer"),
}

# Megatron's flags that add a value to its TensorBoard events -> where that value is here
EVERY_LINE = "--tensorboard-dir gets {} with every log line"
TENSORBOARD_VALUES = {
    "--log-timers-to-tensorboard": EVERY_LINE.format("tokens/s and TFLOP/s") + " (DeepSpeed's own step timers: "
                                                                               '"wall_clock_breakdown": true)',
    "--log-batch-size-to-tensorboard": "the global batch is the same at every step (the start-up config: line gives "
                                       "it)",
    "--log-validation-ppl-to-tensorboard": "--tensorboard-dir gets the validation loss (its exp is the perplexity)",
    "--log-optimizer-states-to-tensorboard": EVERY_LINE.format("the learning rate and the gradient norm"),
    "--log-memory-to-tensorboard": EVERY_LINE.format("the peak memory"),
    "--log-world-size-to-tensorboard": "the world size is the same at every step (the start-up config: line gives it)",
    "--log-learning-rate-to-tensorboard": EVERY_LINE.format("the learning rate"),
    "--log-loss-scale-to-tensorboard": EVERY_LINE.format("the fp16 loss scale"),
    "--no-log-learnig-rate-to-tensorboard": EVERY_LINE.format("the learning rate") + ", always",
    "--no-log-loss-scale-to-tensorboard": EVERY_LINE.format("the fp16 loss scale") + ", always",
    "--log-params-norm": EVERY_LINE.format("the gradient norm") + " (no parameter norm)",
    "--log-num-zeros-in-grad": EVERY_LINE.format("the gradient norm") + " (no count of zero gradients)",
}

TRAINER_HABITS = {
    **TOKENIZER_HABITS,
    # precision
    "--fp16": (MEGATRON, "this trainer takes the precision from the DeepSpeed JSON",
               f'{JSON} "fp16": {{"enabled": true}} (e.g. ds_configs/fp16_ring_sp2.json, or for bf16 '
               'ds_configs/bf16_ring_sp2.json)'),
    "--bf16": (MEGATRON, "this trainer takes the precision from the DeepSpeed JSON",
               f'{JSON} "bf16": {{"enabled": true}} (e.g. ds_configs/bf16_ring_sp2.json)'),
    "--loss-scale": (MEGATRON, "fp16 loss scaling is set in the DeepSpeed JSON",
                     f'{JSON} "fp16": {{"enabled": true, "loss_scale": {{value}}}} (0: dynamic)'),
    "--initial-loss-scale": (MEGATRON, "fp16 loss scaling is set in the DeepSpeed JSON",
                             f'{JSON} "fp16": {{"enabled": true, "initial_scale_power": P}} (the scale 2**P)'),
    "--hysteresis": (MEGATRON, "fp16 loss scaling is set in the DeepSpeed JSON",
                     f'{JSON} "fp16": {{"enabled": true, "hysteresis": {{value}}}}'),
    "--accumulate-allreduce-grads-in-fp32": (MEGATRON, "fp32 gradient accumulation with bf16 weights is DeepSpeed's "
                                             "BF16 optimizer, set in the DeepSpeed JSON at ZeRO 1",
                                             f'{JSON} "data_types": {{"grad_accum_dtype": "fp32"}}, '
                                             '"zero_optimization": {"stage": 1} (with bf16: add data_types to '
                                             'ds_configs/bf16_ring_sp2.json, which is ZeRO 1)'),
    "--loss-scale-window": (MEGATRON, "fp16 loss scaling is set in the DeepSpeed JSON",
                            f'{JSON} "fp16": {{"enabled": true, "loss_scale_window": {{value}}}}'),
    "--min-loss-scale": (MEGATRON, "fp16 loss scaling is set in the DeepSpeed JSON",
                         f'{JSON} "fp16": {{"enabled": true, "min_loss_scale": {{value}}}}'),
    "--fp32-residual-connection": (MEGATRON_DS, "the residual stream is in the weights' dtype (fp32 without a bf16 "
                                   "or fp16 section in the DeepSpeed JSON)", "drop it"),
    # parallelism
    "--tensor-model-parallel-size": (MEGATRON, "this trainer has no tensor parallelism",
                                     "drop it and split the sequence (--sequence-parallel-size N --attention "
                                     "ring), the layers (--pipeline-model-parallel-size N) or the optimizer state "
                                     f'(ZeRO: {JSON} "zero_optimization": {{"stage": 1}}, 2 or 3)'),
    "--model-parallel-size": (MEGATRON, "it is the old name of --tensor-model-parallel-size, and this trainer has "
                              "no tensor parallelism", "drop it and split the sequence (--sequence-parallel-size N "
                              "--attention ring), the layers (--pipeline-model-parallel-size N) or the optimizer "
                              f'state (ZeRO: {JSON} "zero_optimization": {{"stage": 1}}, 2 or 3)'),
    "--sequence-parallel": (MEGATRON, "it splits tensor-parallel activations, and this trainer has no tensor "
                            "parallelism (its sequence parallelism splits each sequence over ranks)",
                            "drop it, or pass --sequence-parallel-size N --attention ring (or ulysses)"),
    "--context-parallel-size": (MEGATRON, "this trainer's context parallelism is its sequence parallelism",
                                "pass --sequence-parallel-size {value} --attention ring (or ulysses)"),
    "--ds-sequence-parallel-size": (MEGATRON_DS, "DeepSpeed-Ulysses is this trainer's --attention ulysses",
                                    "pass --sequence-parallel-size {value} --attention ulysses"),
    "--virtual-pipeline-model-parallel-size": (MEGATRON, "DeepSpeed's pipeline runs one stage per rank (no "
                                               "interleaved schedule)", "drop it (--pipeline-model-parallel-size N "
                                               "sets the stages)"),
    "--no-pipeline-parallel": (MEGATRON_DS, "without --pipeline-model-parallel-size (default 1) the model is no "
                               "pipeline", "drop it"),
    "--zero-stage": (MEGATRON_DS, "ZeRO is set in the DeepSpeed JSON",
                     f'{JSON} "zero_optimization": {{"stage": {{value}}}}'),
    "--use-distributed-optimizer": (MEGATRON, "the optimizer state is sharded by ZeRO, set in the DeepSpeed JSON",
                                    f'{JSON} "zero_optimization": {{"stage": 1}}'),
    "--cpu-optimizer": (MEGATRON_DS, "ZeRO offload runs the optimizer on the CPU, set in the DeepSpeed JSON",
                        f'{JSON} "zero_optimization": {{"stage": 2, "offload_optimizer": {{"device": "cpu"}}}}'),
    **{flag: (MEGATRON_DS, "torch's Adam in place of DeepSpeed's is an optimizer param of the DeepSpeed JSON (the "
              "default without CUDA)", f'{JSON} "optimizer": {{"type": "AdamW", "params": {{"torch_adam": true}}}}')
       for flag in ("--cpu_torch_adam", "--cpu-torch-adam")},
    "--ds-pipeline-enabled": (MEGATRON_DS, "DeepSpeed's pipeline engine runs whenever --pipeline-model-parallel-size "
                              "is above 1", "drop it"),
    "--zero-reduce-bucket-size": (MEGATRON_DS, "ZeRO's buckets are set in the DeepSpeed JSON",
                                  f'{JSON} "zero_optimization": {{"stage": 2, "reduce_bucket_size": {{value}}}}'),
    "--zero-allgather-bucket-size": (MEGATRON_DS, "ZeRO's buckets are set in the DeepSpeed JSON",
                                     f'{JSON} "zero_optimization": {{"stage": 2, "allgather_bucket_size": {{value}}}}'),
    "--zero-contigious-gradients": (MEGATRON_DS, "ZeRO's settings are in the DeepSpeed JSON",
                                    f'{JSON} "zero_optimization": {{"stage": 2, "contiguous_gradients": true}}'),
    "--zero-reduce-scatter": (MEGATRON_DS, "ZeRO's settings are in the DeepSpeed JSON",
                              f'{JSON} "zero_optimization": {{"stage": 2, "reduce_scatter": true}}'),
    "--DDP-impl": (MEGATRON_DS, "DeepSpeed's engine reduces the gradients (no torch or local DDP choice)", "drop it"),
    "--distributed-backend": (MEGATRON, "the backend is chosen by the device (nccl with CUDA, gloo without)",
                              "drop it"),
    # activation recomputation
    "--recompute-activations": (MEGATRON, "this trainer recomputes whole layers with --checkpoint-activations",
                                "pass --checkpoint-activations"),
    "--recompute-granularity": (MEGATRON, "this trainer recomputes whole layers (full granularity, no selective "
                                "recompute) with --checkpoint-activations", "pass --checkpoint-activations"),
    "--recompute-method": (MEGATRON, "this trainer recomputes uniform chunks of layers with --checkpoint-activations",
                           "pass --checkpoint-activations [--checkpoint-num-layers N]"),
    "--recompute-num-layers": (MEGATRON, "this trainer's layers per recomputed chunk are --checkpoint-num-layers",
                               "pass --checkpoint-activations --checkpoint-num-layers {value}"),
    "--partition-activations": (MEGATRON_DS, "DeepSpeed's activation partitioning is set in its JSON, and only at "
                                "sequence-parallel size 1 (a sequence-split activation is no tensor-parallel one)",
                                f'{JSON} "activation_checkpointing": {{"partition_activations": true}} and pass '
                                "--checkpoint-activations"),
    "--deepspeed-activation-checkpointing": (MEGATRON_DS, "this trainer's --checkpoint-activations is DeepSpeed's "
                                             "activation checkpointing", "pass --checkpoint-activations"),
    **{flag: (whose, "DeepSpeed's activation partitioning is set in its JSON, and only at sequence-parallel size 1",
              f'{JSON} "activation_checkpointing": {{"partition_activations": true}} and pass --checkpoint-activations')
       for flag, whose in (("--distribute-checkpointed-activations", MEGATRON_DS),
                           ("--distribute-saved-activations", MEGATRON_DS))},
    "--checkpoint-in-cpu": (MEGATRON_DS, "DeepSpeed's CPU checkpointing is set in its JSON, with partitioned "
                            "activations (sequence-parallel size 1)", f'{JSON} "activation_checkpointing": '
                            '{"partition_activations": true, "cpu_checkpointing": true} and pass '
                            "--checkpoint-activations"),
    "--synchronize-each-layer": (MEGATRON_DS, "DeepSpeed's activation checkpointing settings are in its JSON",
                                 f'{JSON} "activation_checkpointing": {{"synchronize_checkpoint_boundary": true}} '
                                 "and pass --checkpoint-activations"),
    "--profile-backward": (MEGATRON_DS, "DeepSpeed's activation checkpointing settings are in its JSON",
                           f'{JSON} "activation_checkpointing": {{"profile": true}} and pass --checkpoint-activations'),
    # the run
    "--exit-interval": (MEGATRON, "the run ends at --train-iters, the length its LR schedule spans",
                        "pass --train-iters {value}, or --exit-duration-in-mins M with --save to stop a longer run "
                        "on time and resume it"),
    "--skip-train": (MEGATRON, "a run evaluates validation and test at its end, and a rerun of a finished "
                     "checkpoint trains nothing",
                     "pass --load DIR with --train-iters set to the checkpoint's iteration"),
    "--ckpt-step": (MEGATRON, "a resume reads the checkpoint that `latest` in --load names",
                    "write its tag (iter_ and the step in 7 digits, e.g. iter_0000100) into DIR/latest"),
    "--no-save-rng": (MEGATRON, "a checkpoint holds every rank's RNG state, which an exact resume needs",
                      "drop it (--no-load-rng resumes without it)"),
    "--exit-signal-handler": (MEGATRON, "SIGTERM and SIGINT stop the run with a checkpoint by default (with --save, "
                              "docs/resuming.md)", "drop it"),
    **{flag: (whose, "a resume keeps the checkpoint's peak learning rate by default and goes on with the warm-up "
              "and decay the flags give (the checkpoint's, when they are as its run had them)",
              "drop it, and give the schedule flags of the checkpoint's run")
       for flag, whose in (("--use-checkpoint-lr-scheduler", MEGATRON),
                           ("--use-checkpoint-opt_param-scheduler", MEGATRON_DS))},
    "--universal-checkpoint": (MEGATRON_DS, "a resume reads this trainer's checkpoints in any layout "
                               "(docs/resuming.md)", "drop it"),
    "--no-save-optim": (MEGATRON, "a checkpoint holds the optimizer state, which a resume needs",
                        "drop it (tools/convert_checkpoint.py to-torch, or to-hf, exports the weights alone)"),
    "--override-opt_param-scheduler": (MEGATRON, "a resume takes this run's warm-up and decay flags but keeps the "
                                       "checkpoint's peak learning rate, and a new peak starts a new run from its "
                                       "weights", "pass --finetune --load DIR with the new --lr and schedule flags "
                                       "(and another --save)"),
    "--no-load-optim": (MEGATRON, "a resume restores the optimizer, and a fresh optimizer starts a new run from the "
                        "checkpoint's weights", "pass --finetune --load DIR (and another --save)"),
    **{flag: (MEGATRON, "one --data-path is split into train, validation and test documents by --split",
              "pass --data-path PREFIX --split 949,50,1")
       for flag in ("--train-data-path", "--valid-data-path", "--test-data-path")},
    "--batch-size": (MEGATRON, "it is the old name of the micro batch", "pass --micro-batch-size {value}"),
    "--rampup-batch-size": (MEGATRON_DS, "the global batch is the same at every step", "drop it"),
    "--train-tokens": (MEGATRON_DS, "the run length counts steps or samples",
                       "pass --train-samples (tokens / --seq-length) or --train-iters"),
    "--mock-data": (MEGATRON, "without --data-path the run trains on the embedded sample corpus", "drop it"),
    "--dataloader-type": (MEGATRON, "batches are read in order of the consumed samples (Megatron's single: a "
                          "resume goes on where it stopped)", "drop it"),
    # speed: kernels chosen by themselves
    **{flag: (whose, "dense attention runs torch's scaled_dot_product_attention, which picks the flash kernel where "
              "it can", "drop it")
       for flag, whose in (("--use-flash-attn", MEGATRON), ("--use-flash-attn-v1", MEGATRON_DS),
                           ("--use-flash-attn-v2", MEGATRON_DS), ("--use-flash-attn-triton", MEGATRON_DS))},
    "--no-masked-softmax-fusion": (MEGATRON, "dense attention runs torch's scaled_dot_product_attention (no "
                                   "Megatron fused softmax)", "drop it"),
    "--no-bias-gelu-fusion": (MEGATRON, "the MLP is unfused unless --compile-mlp", "drop it"),
    "--no-bias-dropout-fusion": (MEGATRON, "the MLP is unfused unless --compile-mlp", "drop it"),
    # logging
    "--log-throughput": (MEGATRON, "tokens/s and TFLOP/s are in every log line", "drop it"),
    "--timing-log-level": (MEGATRON, "DeepSpeed times the forward, backward and step",
                           f'{JSON} "wall_clock_breakdown": true'),
    "--wandb-project": (MEGATRON, "Weights & Biases is DeepSpeed's wandb monitor, set in the JSON",
                        f'{JSON} "wandb": {{"enabled": true, "project": "{{value}}"}} (docs/deepspeed.md)'),
    "--tensorboard-log-interval": (MEGATRON, "--tensorboard-dir gets every --log-interval step's line",
                                   "pass --log-interval {value} instead"),
    "--tensorboard-queue-size": (MEGATRON, "--tensorboard-dir's writer flushes each record as it is logged",
                                 "drop it"),
    **{flag: (MEGATRON, here, "drop it") for flag, here in TENSORBOARD_VALUES.items()},
    # optimizer and schedule
    "--optimizer": (MEGATRON, "the optimizer is AdamW unless the DeepSpeed JSON names another",
                    f'drop it for AdamW (the default), or {JSON} "optimizer": {{"type": ...}}'),
    "--lr-decay-samples": (MEGATRON, "the LR schedule counts steps", "pass --lr-decay-iters (samples / global batch)"),
    "--lr-warmup-samples": (MEGATRON, "the LR schedule counts steps",
                            "pass --lr-warmup-iters (samples / global batch)"),
    "--lr-decay-tokens": (MEGATRON_DS, "the LR schedule counts steps",
                          "pass --lr-decay-iters (tokens / (global batch x --seq-length))"),
    "--lr-warmup-tokens": (MEGATRON_DS, "the LR schedule counts steps",
                           "pass --lr-warmup-iters (tokens / (global batch x --seq-length))"),
    "--warmup": (MEGATRON, "it is the old name of --lr-warmup-fraction", "pass --lr-warmup-fraction {value}"),
    "--weight-decay-incr-style": (MEGATRON, "the weight decay is constant", "drop it and pass --weight-decay"),
    # the model
    "--use-rotary-position-embeddings": (MEGATRON, "rope is a --position-embedding-type",
                                         "pass --position-embedding-type rope"),
    "--apply-residual-connection-post-layernorm": (MEGATRON_DS, "original BERT's post-LayerNorm is a "
                                                   "--layernorm-layout", "pass --layernorm-layout post"),
    "--bert-binary-head": (MEGATRON, "the sentence-order head is on by default", "drop it (--bert-no-binary-head "
                           "turns it off)"),
    "--untie-embeddings-and-output-weights": (MEGATRON, "BERT's LM head here shares the word embeddings, as its "
                                              "Hugging Face export does", "drop it"),
    "--kv-channels": (MEGATRON, "the head size is --hidden-size / --num-attention-heads",
                      "drop it (set --hidden-size and --num-attention-heads)"),
    "--encoder-seq-length": (MEGATRON, "an encoder's length is --seq-length", "pass --seq-length {value}"),
    "--norm-epsilon": (MEGATRON, "the norm's epsilon (LayerNorm or RMSNorm) is --layernorm-epsilon",
                       "pass --layernorm-epsilon {value}"),
    "--use-cpu-initialization": (MEGATRON, "every parameter is drawn on the host from its own keyed generator, so "
                                 "any layout starts from the same weights", "drop it"),
    "--no-position-embedding": (MEGATRON, "a model without learned positions takes rotary ones",
                                "pass --position-embedding-type rope"),
    **{flag: (MEGATRON, "a document's positions restart and its tokens attend within it in packed samples",
              "pass --pack-samples")
       for flag in ("--reset-position-ids", "--reset-attention-mask")},
    "--group-query-attention": (MEGATRON, "every head has its own keys and values (multi-head attention, as BERT "
                                "and ModernBERT)", "drop it"),
    "--attention-softmax-in-fp32": (MEGATRON, "torch's attention kernels compute the softmax in fp32 at every "
                                    "precision", "drop it"),
    "--overlap-grad-reduce": (MEGATRON, "DeepSpeed's engine reduces the gradients",
                              f'{JSON} "zero_optimization": {{"overlap_comm": true}}'),
    # checkpoints
    "--pretrained-checkpoint": (MEGATRON, "a new run from a checkpoint's weights is --finetune",
                                "pass --finetune --load {value} (and another --save for the new run)"),
    "--exit-on-missing-checkpoint": (MEGATRON, "a --load that holds no checkpoint stops the run (unless it is also "
                                     "the --save of a first run)", "drop it"),
    "--ckpt-format": (MEGATRON, "checkpoints are DeepSpeed's, read in any layout (docs/resuming.md)", "drop it"),
}

PREPROCESS_HABITS = {
    **TOKENIZER_HABITS,
    "--partitions": (MEGATRON, "the input is read once, in order, and --workers N tokenizes it in parallel",
                     "drop it and pass --workers N"),
    "--keep-sequential-samples": (MEGATRON, "documents are always written in input order", "drop it"),
    "--find-optimal-num-workers": (MEGATRON, "the progress lines show the rate of the --workers given",
                                   "drop it and pass --workers N"),
}


def habit_problem(argv: list, options, habits: dict) -> tuple | None:
    """(problem, fix) for the flags of `argv` (before a `--`) that are rows of `habits` and not among the parser's
    `options`, as written or as --flag=value: the first one's equivalent in full, the others named after its fix
    with the docs' table, so that a pasted Megatron script is one run, not one per flag; None when there is none.
    Exact names only, so that an abbreviation argparse reads (--micro-batch) stays the trainer's."""
    found = habit_flags(argv, options, habits)
    if not found:
        return None
    (flag, value), others = found[0], list(dict.fromkeys(other for other, _ in found[1:] if other != found[0][0]))
    whose, here, fix = habits[flag]
    fix = fix.replace("{value}", value)
    if others:
        fix += (f" (and {', '.join(others)}: each one's equivalent is in {in_repository(DOCS)}, "
                f'"{DOCS_SECTION}")')
    return f"{flag} is {whose}'s flag: {here}", fix


def habit_flags(argv: list, options, habits: dict) -> list[tuple[str, str]]:
    """(flag, value) of each `habits` row in `argv` before a `--` that is not among `options`; the value is the
    one given with it (as --flag=value or the next word), N when none was."""
    found = []
    for index, token in enumerate(argv):
        if token == "--":
            break
        flag, equals, value = token.partition("=")
        if flag in habits and flag not in options:
            after = argv[index + 1] if index + 1 < len(argv) else ""
            found.append((flag, value if equals else (after if after and not after.startswith("-") else "N")))
    return found


def wrapped_fix(fix: str, own_flags: dict) -> str:
    """A row's fix for a tool that hands the trainer's flags on after `--` and takes some of them itself
    (tools/extend_context.py, azureml/submit.py): each trainer flag in `own_flags` (the JSON's --deepspeed_config
    among them) named by the tool's own option, which goes before the `--`."""
    fix = fix.replace(JSON, "pass --deepspeed_config FILE with")
    named = []
    for flag, option in own_flags.items():
        pattern = rf"{re.escape(flag)}(?![\w-])"  # the whole flag: --save, not --save-interval
        if option and re.search(pattern, fix):
            named.append(option)
            fix = re.sub(pattern, option, fix)
    named = list(dict.fromkeys(named))  # two trainer flags may be one option of the tool's
    return fix + (f" ({', '.join(named)}: this tool's own, before --)" if named else "")


def markdown_table() -> str:
    """docs/deepspeed.md's table of these rows: the trainer's (the tokenizer's are preprocess_data.py's too),
    then preprocess_data.py's own."""
    rows = [("" if flag not in TOKENIZER_HABITS else " (and preprocess_data.py)", flag, row)
            for flag, row in TRAINER_HABITS.items()]
    rows += [(" (preprocess_data.py)", flag, row) for flag, row in PREPROCESS_HABITS.items()
             if flag not in TOKENIZER_HABITS]
    lines = ["| flag | of | here | instead |", "|---|---|---|---|"]
    for where, flag, (whose, here, fix) in rows:
        cells = (f"`{flag}`{where}", whose, here, fix.replace("{value}", "N"))
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)
