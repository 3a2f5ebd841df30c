"""The pretraining run: config, data, engine, the train/eval loop, checkpoints and logs.

pretrain_bert.py calls `main`; every rank runs this, started by the `deepspeed` launcher (or
any env:// launcher). Errors a user can cause end the run with one line and exit code 2.
"""
import math
import os
import sys
import time
import warnings

import deepspeed
import torch
import torch.distributed as dist

from megatron import checkpoint, determinism, hf_convert
from megatron.arguments import build_parser, config_flags
from megatron.config import read_ds_config, resolve
from megatron.data.bert_dataset import SPLIT_NAMES, build_train_valid_test_datasets, token_stats
from megatron.data.default_dataset import prepare_default_dataset
from megatron.data.samplers import PretrainingSampler, collate_bert
from megatron.data.tokenizer import build_tokenizer
from megatron.engine import build_engine, eval_step, skip_nonfinite_updates, train_step
from megatron.errors import ConfigError
from megatron.parallel import state
from megatron.run_log import RunLog


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        pretrain(args)
    except ConfigError as error:
        if args.debug:
            raise
        print(f"pretrain_bert.py: error: {error}", file=sys.stderr, flush=True)
        return 2
    return 0


def lr_schedule(args, train_iters: int):
    """Megatron's schedule as an optimizer -> LambdaLR factory: linear warm-up from 0 over
    lr_warmup_fraction of the steps, then linear or cosine decay to min_lr at the last step."""
    warmup = int(args.lr_warmup_fraction * train_iters)
    floor = args.min_lr / args.lr if args.lr else 0.0

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if args.lr_decay_style == "constant" or train_iters <= warmup:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, train_iters - warmup))
        decay = 1.0 - progress if args.lr_decay_style == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return floor + (1.0 - floor) * decay

    return lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def deepspeed_settings(args) -> dict:
    """The JSON (if any) with the optimizer and clipping the flags describe filled in: flags
    given on the command line win, the JSON fills the rest, then the defaults."""
    ds = read_ds_config(args.deepspeed_config) if args.deepspeed_config else {}
    ds.setdefault("optimizer", {"type": "AdamW", "params": {}})
    params = ds["optimizer"].setdefault("params", {})
    params.update(lr=args.lr, weight_decay=args.weight_decay, betas=[args.adam_beta1, args.adam_beta2],
                  eps=args.adam_eps)
    if not torch.cuda.is_available():
        params.setdefault("torch_adam", True)  # DeepSpeed's fused Adam needs a GPU
    if args.clip_grad is not None:
        ds["gradient_clipping"] = args.clip_grad
    ds.setdefault("steps_per_print", 10**9)  # the run log prints progress
    return ds


def data_paths(args) -> tuple:
    """(data_path list, vocab_file): the flags, or the embedded default dataset built once per node."""
    if args.data_path:
        if not args.vocab_file:
            raise ConfigError("--data-path is given without --vocab-file", "pass the vocab.txt the data was made with")
        return args.data_path, args.vocab_file
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if local_rank == 0:
        default = prepare_default_dataset(args.default_data_dir)
    dist.barrier()
    if local_rank != 0:
        default = prepare_default_dataset(args.default_data_dir)  # finds it built: reuses it
    return [default.data_prefix], args.vocab_file or str(default.vocab_file)


def pretrain(args) -> None:
    determinism.configure(args.deterministic)
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    torch.manual_seed(args.seed)
    ds = deepspeed_settings(args)
    data_path, vocab_file = data_paths(args)
    tokenizer = build_tokenizer(args.tokenizer_type, vocab_file)
    flags = config_flags(args)
    weights_only = bool(args.load and checkpoint.run_state(args.load, checkpoint.latest_tag(args.load)).get("weights_only"))
    for field, value in initial_model_fields(args, weights_only).items():
        flags[field] = value if flags.get(field) is None else flags[field]
    flags["vocab_size"] = flags["vocab_size"] or tokenizer.vocab_size
    flags["bigbird_seed"] = args.seed  # BigBird's random blocks follow the run's seed
    config = resolve(flags, ds, dist.get_world_size())
    if tokenizer.vocab_size > config.model.vocab_size:
        raise ConfigError(f"the vocab file has {tokenizer.vocab_size} tokens, the model's vocab_size is "
                          f"{config.model.vocab_size}", "pass the --vocab-file the model was trained with")
    if not (args.train_iters or args.train_samples):
        raise ConfigError("the run length is not set", "pass --train-iters N or --train-samples N")
    global_batch = config.global_batch_size
    train_iters = args.train_iters or math.ceil(args.train_samples / global_batch)
    eval_runs = train_iters // args.eval_interval + 1
    samples = (train_iters * global_batch, eval_runs * args.eval_iters * global_batch, args.eval_iters * global_batch)
    train_set, valid_set, test_set = build_train_valid_test_datasets(
        data_path, args.data_impl, args.split, samples, config.model.seq_length, tokenizer,
        **sample_options(args, config))
    if dist.get_rank() == 0:
        for name, dataset in zip(SPLIT_NAMES, (train_set, valid_set, test_set)):
            if dataset is not None:
                print(token_stats(dataset).describe(name), flush=True)

    engine = build_engine(config, bert_state=initial_weights(args, config, weights_only),
                          lr_scheduler=lr_schedule(args, train_iters))
    if args.skip_nan_batches:
        skip_nonfinite_updates(engine)
    iteration = consumed = 0
    last_checkpoint = None
    if args.load and not weights_only:
        client = checkpoint.load(engine, args.load, config)
        iteration, consumed = client["iteration"], client["consumed_samples"]
        last_checkpoint = os.path.join(args.load, checkpoint.tag_for(iteration))
    if args.save:
        checkpoint.check_save_dir(args.save, iteration)
    log = RunLog(args, config, train_iters)

    def batches(dataset, start: int, count: int):
        """`count` steps of this data rank's micro-batches (lists of gas BertBatch)."""
        sampler = PretrainingSampler(len(dataset), start, config.micro_batch_size,
                                     state.get_data_parallel_rank(), state.get_data_parallel_world_size())
        indices = iter(sampler)
        for _ in range(count):
            yield [collate_bert([dataset[i] for i in next(indices)]) for _ in range(config.gradient_accumulation_steps)]

    train_batches = batches(train_set, consumed, train_iters - iteration)
    while iteration < train_iters:
        start = time.perf_counter()
        set_attention_iteration(engine, iteration)
        result = train_step(engine, next(train_batches))
        iteration += 1
        consumed += global_batch
        log.step(iteration, consumed, result, engine, time.perf_counter() - start)
        check_step(args, engine, iteration, result.loss, last_checkpoint, log)
        if valid_set is not None and iteration % args.eval_interval == 0:
            run = iteration // args.eval_interval - 1
            log.evaluation("validation", iteration, evaluate(batches, engine, valid_set, run, args.eval_iters))
        if args.save and (iteration == train_iters or (args.save_interval and iteration % args.save_interval == 0)):
            last_checkpoint = os.path.join(args.save, checkpoint.save(engine, config, args.save, iteration, consumed))
            log.message(f"saved checkpoint {last_checkpoint}")
    if test_set is not None:
        log.evaluation("test", iteration, evaluate(batches, engine, test_set, 0, args.eval_iters))
    log.finish(args.save)


def sample_options(args, config) -> dict:
    """Dataset keyword arguments from the flags, the same for the train, valid and test sets."""
    return dict(masked_lm_prob=args.mask_prob, seed=args.seed, binary_head=config.model.add_binary_head,
                whole_word_masking=args.whole_word_masking, pack_samples=config.pack_samples,
                max_segment_length=config.model.max_segment_length)


def initial_model_fields(args, weights_only: bool) -> dict:
    """Model settings of the weights a run starts from (--init-from-hf, or a weights-only --load):
    the sizes and layout, which the flags may restate but not change."""
    if args.init_from_hf:
        fields = hf_convert.bert_fields_from_hf(hf_convert.read_hf_config(args.init_from_hf))
    elif weights_only:
        fields = checkpoint.stored_config(args.load, checkpoint.latest_tag(args.load))["model"]
    else:
        return {}
    shaping = (*hf_convert.HF_CONFIG_KEYS, "max_position_embeddings", "layernorm_layout", "embedding_layernorm")
    return {field: fields[field] for field in shaping if field in fields}


def initial_weights(args, config, weights_only: bool) -> dict | None:
    """BertModel state to start from (None: fresh init, or a full checkpoint that --load restores)."""
    if args.init_from_hf:
        if args.load:
            raise ConfigError("--init-from-hf and --load are both given", "resume with --load alone")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state = hf_convert.load_hf_as_bert_state(args.init_from_hf, config.model,
                                                     extend_positions=not args.no_position_extension)
        if dist.get_rank() == 0:
            for warning in caught:
                print(f"warning: {warning.message}", file=sys.stderr, flush=True)
        return state
    if weights_only:
        tag = checkpoint.latest_tag(args.load)
        stored = checkpoint.stored_config(args.load, tag)["model"]
        checkpoint.check_model_shapes(stored, config.model, os.path.join(args.load, tag))
        return checkpoint.bert_state_from_checkpoint(args.load, tag)
    return None


def check_step(args, engine, iteration: int, loss: float, last_checkpoint, log) -> None:
    """A NaN/inf loss stops the run (fp32, bf16) unless --skip-nan-batches. Steps whose gradients
    were not finite are skipped by DeepSpeed's optimizers (fp16 loss scaling, bf16, ZeRO) or by
    skip_nonfinite_updates. The loss is already a host float: no extra device sync."""
    if math.isfinite(loss) or engine.fp16_enabled() or args.skip_nan_batches:
        if not engine.was_step_applied():
            log.message(f"iteration {iteration}: loss {loss:.4f}, gradients not finite: update skipped")
        elif not math.isfinite(loss):
            log.message(f"iteration {iteration}: loss {loss}, gradients finite: update applied")
        return
    where = (f"the last good checkpoint is {last_checkpoint}: resume with --load {os.path.dirname(last_checkpoint)}"
             if last_checkpoint else "no checkpoint was saved before it: rerun with --save and --save-interval")
    raise ConfigError(f"loss is {loss} at iteration {iteration}",
                      f"{where} (e.g. with a lower --lr), or pass --skip-nan-batches to skip such steps")


def evaluate(batches, engine, dataset, run: int, eval_iters: int) -> float:
    """Mean loss over `eval_iters` steps; validation run k reads the k-th slice of the set."""
    per_run = eval_iters * engine.train_batch_size()
    start = min(run * per_run, max(0, len(dataset) - per_run))
    losses = [eval_step(engine, step) for step in batches(dataset, start, eval_iters)]
    return sum(losses) / len(losses)


def set_attention_iteration(engine, iteration: int) -> None:
    """BigBird draws its random blocks per (seed, iteration, layer); other variants ignore it."""
    from megatron.model.attention.bigbird import set_iteration

    first_layer = max(0, getattr(engine.module, "_local_start", 2) - 2)  # pipeline: this stage's first layer
    set_iteration(engine.module, iteration, first_layer=first_layer)
