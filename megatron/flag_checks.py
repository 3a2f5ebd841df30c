"""The flags checked alone, before DeepSpeed starts or any file is read: values that cannot mean what
was asked, and flags that would be ignored without another. Apart from the run so that
azureml/submit.py and tools/extend_context.py check a command as pretrain_bert.py does."""
import math

from megatron import paths
from megatron.data.bert_dataset import parse_data_path, split_weights
from megatron.data.workers import check_num_workers
from megatron.errors import ConfigError


def check_no_empty_values(args, flags: dict | None = None) -> None:
    """A flag given '' (`--save "$CKPT"` with CKPT unset), named as such: the run read an empty --save as none
    and blamed the --save-interval a launch script adds, an empty --log-dir or --data-path as the current folder
    or a file named ''. No flag of the trainer (paths, names) means anything by ''. A tool passes `flags`
    (dest -> its spelling) to check only those, under its own names, as flags that need a value."""
    def spelled(dest: str) -> str:
        return f"--{dest}" if dest.startswith(("deepspeed", "deepscale")) else f"--{dest.replace('_', '-')}"
    for dest, flag in sorted((flags or {dest: spelled(dest) for dest in vars(args)}).items()):
        value = getattr(args, dest)
        if value == "" or (isinstance(value, list) and "" in value):
            raise ConfigError(f"{flag} is given an empty value ('')", f"pass {flag} a value"
                              f"{'' if flags else ' or leave it out'} (an unset shell variable gives '': "
                              f"{flag} \"$DIR\")")


def check_flags(args) -> None:
    """Flag values that cannot mean what was asked, and flags the run would not read, refused before
    DeepSpeed starts (cheap, on every rank alike). Model sizes and parallel degrees are checked by
    megatron.config; the data's weights and split here, before any index map is built."""
    check_no_empty_values(args)
    def at_least(flag: str, value, low, fix: str = ""):
        if value is not None and value < low:
            raise ConfigError(f"{flag} {value} must be >= {low}", fix or f"pass {flag} {low} or more")

    for dest, value in sorted(vars(args).items()):  # argparse's float() reads "nan" and "inf"
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"--{dest.replace('_', '-')} {value} is not a finite number",
                              f"pass a finite --{dest.replace('_', '-')}")
    for flag, value in (("--train-iters", args.train_iters), ("--train-samples", args.train_samples)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value} is {'negative' if value < 0 else 'zero'}: no step to train",
                              f"pass {flag} N with N >= 1 (the run length)")
    if args.data_cache_path and (problem := paths.folder_problem("--data-cache-path", args.data_cache_path)):
        raise ConfigError(*problem)  # a file in the way or a read-only mount, named with the flag: before any map
    if args.train_iters is not None and args.train_samples is not None:
        raise ConfigError(f"--train-iters {args.train_iters} and --train-samples {args.train_samples} both set the "
                          "run length", "pass one of them")
    at_least("--eval-iters", args.eval_iters, 0, "pass --eval-iters 1 or more, or 0 for no evaluation")
    for flag, value in (("--log-interval", args.log_interval), ("--eval-interval", args.eval_interval),
                        ("--save-interval", args.save_interval),
                        ("--micro-batch-size", args.micro_batch_size),
                        ("--global-batch-size", args.global_batch_size),
                        ("--checkpoint-num-layers", args.checkpoint_num_layers), ("--keep-last", args.keep_last),
                        ("--rendezvous-timeout", args.rendezvous_timeout)):
        at_least(flag, value, 1)
    check_num_workers(args.num_workers)  # bounded by the CPUs (megatron/data/workers.py)
    if not 0 < args.mask_prob <= 1:
        raise ConfigError(f"--mask-prob {args.mask_prob} is outside (0, 1]",
                          "pass the fraction of tokens to mask, e.g. --mask-prob 0.15")
    if not 0 <= args.short_seq_prob <= 1:
        raise ConfigError(f"--short-seq-prob {args.short_seq_prob} is outside [0, 1]",
                          "pass the share of samples to make shorter, e.g. --short-seq-prob 0.1 (0: none)")
    check_schedule_flags(args)
    check_optimizer_flags(args)
    if args.exit_duration_in_mins is not None and not args.exit_duration_in_mins > 0:
        raise ConfigError(f"--exit-duration-in-mins {args.exit_duration_in_mins} must be > 0",
                          "pass the minutes the job may train, e.g. --exit-duration-in-mins 230 for a 4-hour limit")
    if args.distributed_timeout_minutes is not None and not args.distributed_timeout_minutes > 0:
        # (--init-method-std and --layernorm-epsilon: config.check_model_numbers, with the model's numbers)
        raise ConfigError(f"--distributed-timeout-minutes {args.distributed_timeout_minutes} must be > 0",
                          "pass a positive --distributed-timeout-minutes, e.g. 10")
    if not 0 <= args.seed < 2**32:
        raise ConfigError(f"--seed {args.seed} is outside [0, 2**32)", "pass a seed between 0 and 4294967295")
    check_split(args.split)
    if args.data_path:
        check_data_path(args.data_path)
        if not (args.vocab_file or args.tokenizer_file or args.load or args.init_from_hf):  # they carry one
            raise ConfigError("--data-path is given without --vocab-file", "pass the vocab.txt (or --tokenizer-file) "
                              "the data was made with")


def check_optimizer_flags(args) -> None:
    """--lr, --min-lr, --weight-decay, --adam-* and --clip-grad in their ranges (the JSON's own
    optimizer.params are checked by megatron.config against the optimizer type)."""
    lr = getattr(args, "lr", None)
    if lr is not None and not lr >= 0:
        raise ConfigError(f"--lr {lr} is negative", "pass a positive peak learning rate, e.g. --lr 1e-4")
    if args.min_lr is not None and not args.min_lr >= 0:
        raise ConfigError(f"--min-lr {args.min_lr} is negative", "pass --min-lr 0 or a small positive rate")
    if lr is not None and args.min_lr is not None and args.min_lr > lr:
        raise ConfigError(f"--min-lr {args.min_lr} is above --lr {lr}: the schedule would rise as it decays",
                          "pass a --min-lr at most --lr")
    if args.weight_decay is not None and not args.weight_decay >= 0:
        raise ConfigError(f"--weight-decay {args.weight_decay} is negative",
                          "pass --weight-decay 0 (none) or a positive rate, e.g. 0.01")
    for flag, value, example in (("--adam-beta1", args.adam_beta1, 0.9), ("--adam-beta2", args.adam_beta2, 0.999)):
        if value is not None and not 0 <= value < 1:
            raise ConfigError(f"{flag} {value} is outside [0, 1)", f"pass {flag} {example} or another decay in [0, 1)")
    if args.adam_eps is not None and not args.adam_eps > 0:
        raise ConfigError(f"--adam-eps {args.adam_eps} must be > 0", "pass a small positive --adam-eps, e.g. 1e-8")
    if args.clip_grad is not None and not args.clip_grad >= 0:
        raise ConfigError(f"--clip-grad {args.clip_grad} is negative",
                          "pass the gradient-norm limit, e.g. --clip-grad 1.0 (0 turns clipping off)")


def check_flag_combinations(args) -> None:
    """The run length, and flags that only mean something with another flag: given without it they
    would be ignored. (Not in check_flags: azureml/submit.py passes it the --save, --load and
    --init-from-hf its job adds to the flags it is given.)"""
    if not (args.train_iters or args.train_samples):
        raise ConfigError("the run length is not set", "pass --train-iters N or --train-samples N")
    needs = ((args.save_interval, "--save-interval", args.save, "--save DIR", "checkpoints are saved only with --save"),
             (args.keep_last, "--keep-last", args.save, "--save DIR", "it prunes the --save folder"),
             (args.exit_duration_in_mins, "--exit-duration-in-mins", args.save, "--save DIR",
              "its stop is saved for a resume"),
             (args.no_position_extension or None, "--no-position-extension", args.init_from_hf, "--init-from-hf DIR",
              "it refuses extending the Hugging Face folder's positions"),
             (args.no_load_rng or None, "--no-load-rng", args.load, "--load DIR", "it skips the checkpoint's RNG "
              "states"),
             (args.override_data_settings or None, "--override-data-settings", args.load, "--load DIR",
              "it lets a resume change the data"),
             (args.finetune or None, "--finetune", args.load, "--load DIR", "it starts from that checkpoint's weights"))
    for value, flag, needed, needed_flag, why in needs:
        if value is not None and not needed:
            raise ConfigError(f"{flag} is given without {needed_flag.split()[0]} ({why})",
                              f"add {needed_flag} or drop {flag}")
    if args.no_load_rng and args.finetune:
        raise ConfigError("--no-load-rng is given with --finetune, which restores no RNG state anyway",
                          "drop --no-load-rng")
    if args.finetune and args.init_from_hf:
        raise ConfigError("--finetune is given with --init-from-hf, whose folder gives the weights (--load then "
                          "names the run's own checkpoints, which a requeue resumes)", "drop --finetune")
    inside = args.init_from_hf and args.save and paths.save_into_weights_folder(args.save, args.init_from_hf,
                                                                                "--init-from-hf")
    if inside:
        raise ConfigError(inside, "choose another --save")
    if args.load and args.save and paths.where_in(args.save, args.load) == "inside the":  # the same: a resume
        raise ConfigError(f"--save {args.save} is inside the checkpoint folder --load {args.load} (resumes and "
                          "--keep-last there remove its iter_* folders, and whatever lies in them)",
                          f"choose a --save outside {args.load}")
    check_outputs_outside_checkpoints(args)


def check_outputs_outside_checkpoints(args) -> None:
    """The folders the run writes to keep (--log-dir, --tensorboard-dir, --data-cache-path) inside an
    iter_* folder of --save or --load: a save at that iteration, a rollback's or --keep-last removes it
    with them (the run's logs gone while it trains, its last lines naming files that no longer exist)."""
    for flag, path in (("--log-dir", getattr(args, "log_dir", None)),
                       ("--tensorboard-dir", getattr(args, "tensorboard_dir", None)),
                       ("--data-cache-path", getattr(args, "data_cache_path", None))):
        for folder_flag, folder in (("--save", args.save), ("--load", args.load)):
            tag = path and folder and paths.checkpoint_holding(path, folder)
            if tag:
                raise ConfigError(f"{flag} {path} is inside checkpoint {tag} of {folder_flag} {folder} (a save at its "
                                  "iteration, a rollback or --keep-last removes that folder, and what lies in it)",
                                  f"choose a {flag} outside the iter_* folders of {folder}")


def check_schedule_flags(args) -> None:
    """The LR schedule's flags alone (Schedule checks them against the run's length, training.check_resolved
    before a launch and at start-up): numbers in range,
    one way to give the warm-up, and no flag that the decay style would not read."""
    if args.lr_warmup_fraction is not None and not 0 <= args.lr_warmup_fraction <= 1:
        raise ConfigError(f"--lr-warmup-fraction {args.lr_warmup_fraction} is outside [0, 1]",
                          "pass the fraction of the steps to warm up over, e.g. --lr-warmup-fraction 0.01")
    if args.lr_warmup_fraction is not None and args.lr_warmup_iters is not None:
        raise ConfigError(f"--lr-warmup-fraction {args.lr_warmup_fraction} and --lr-warmup-iters "
                          f"{args.lr_warmup_iters} both set the warm-up", "pass one of them")
    for flag, value, low in (("--lr-warmup-iters", args.lr_warmup_iters, 0),
                             ("--lr-decay-iters", args.lr_decay_iters, 1),
                             ("--lr-wsd-decay-iters", args.lr_wsd_decay_iters, 1)):
        if value is not None and value < low:
            raise ConfigError(f"{flag} {value} must be >= {low}", f"pass {flag} {low} or more")
    style = args.lr_decay_style
    readers = {"--min-lr": ("linear", "cosine", "inverse-square-root", "WSD"),
               "--lr-decay-iters": ("linear", "cosine", "inverse-square-root", "WSD"),
               "--lr-wsd-decay-iters": ("WSD",), "--lr-wsd-decay-style": ("WSD",)}
    given = {"--min-lr": args.min_lr, "--lr-decay-iters": args.lr_decay_iters,
             "--lr-wsd-decay-iters": args.lr_wsd_decay_iters, "--lr-wsd-decay-style": args.lr_wsd_decay_style}
    for flag, styles in readers.items():
        if given[flag] is not None and style not in styles:
            raise ConfigError(f"{flag} {given[flag]} is given with --lr-decay-style {style}, which does not read it",
                              f"pass --lr-decay-style {' or '.join(styles)}, or drop {flag}")
    if style == "WSD" and args.lr_wsd_decay_iters is None:
        raise ConfigError("--lr-decay-style WSD is given without --lr-wsd-decay-iters (how many of the last steps "
                          "anneal)", "add --lr-wsd-decay-iters N, e.g. a tenth of --train-iters")


def check_split(split: str) -> None:
    """--split TRAIN,VALID,TEST document weights: up to three finite numbers >= 0, the train weight > 0."""
    weights = split_weights(split)  # as the data layer reads it
    if not 1 <= len(weights) <= 3 or any(not math.isfinite(weight) or weight < 0 for weight in weights):
        raise ConfigError(f"--split {split!r} is not up to three finite weights >= 0 (train,valid,test)",
                          "pass e.g. --split 949,50,1")
    if weights[0] <= 0:
        raise ConfigError(f"--split {split!r} gives the training set no documents (its first weight is "
                          f"{weights[0]:g})", "give training a positive share, e.g. --split 949,50,1")


def check_data_path(data_path: list) -> None:
    """--data-path PREFIX or W1 PREFIX1 W2 PREFIX2 ...: each weight a finite number >= 0, not all 0
    (the data layer's parse_data_path names any other malformed list)."""
    pairs = list(zip(data_path[0::2], data_path[1::2])) if len(data_path) > 1 and len(data_path) % 2 == 0 else []
    weights = []
    for weight, prefix in pairs:
        try:
            weights.append(float(weight))
        except ValueError:
            break
        if not math.isfinite(weights[-1]) or weights[-1] < 0:
            raise ConfigError(f"--data-path weight {weight} of {prefix} is not a finite number >= 0",
                              "give each prefix a weight >= 0 (they are normalised to sum 1): --data-path W1 PREFIX1 "
                              "W2 PREFIX2 ...")
    if pairs and len(weights) == len(pairs) and not any(weights):
        raise ConfigError(f"--data-path weights {', '.join(data_path[0::2])} are all 0: no prefix would be read",
                          "give at least one prefix a positive weight")
    parse_data_path(data_path)
