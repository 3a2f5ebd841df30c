"""The run's tokenizer and data: the tokenizer the flags or the starting weights give, checked
against the vocab the data was made with; the train, valid and test sets with rank 0's description
and warnings; the reader of each step's micro-batches."""
import contextlib
import sys
import warnings

import torch
import torch.distributed as dist

from megatron import checkpoint, hf_convert, paths
from megatron.data import index_maps
from megatron.data.bert_dataset import (SPLIT_NAMES, TokenStats, build_train_valid_test_datasets, parse_data_path,
                                        split_tokens, split_weights, token_stats)
from megatron.data.default_dataset import default_vocab_file, prepare_default_dataset
from megatron.data.indexed_dataset import rewrite_warning
from megatron.data.samplers import PretrainingSampler, micro_batches
from megatron.data.tokenizer import (HF_TOKENIZER, BertWordPiece, HFTokenizer, build_tokenizer, case_warning,
                                     explicit_tokenizer, naming_flags)
from megatron.data.tokenizer_identity import (check_data_vocab, choose_tokenizer, recorded_tokenizer,
                                              unchecked_added_tokens_warning, unrecorded_data_warning)
from megatron.data.words import word_rule
from megatron.errors import ConfigError, DataError
from megatron.parallel import state
from megatron.parallel.launch_env import launcher_rank, local_rank, print_warnings
from megatron.start_plan import StartPlan
from megatron.stop_signals import StopSignals


def run_tokenizer(args, plan: StartPlan):
    """The tokenizer the flags name, else the one the --load checkpoint carries or the --init-from-hf
    folder holds (None: none gives one), refused where it differs from the checkpoint's or the
    folder's (`plan`: where the run starts). Needs no process group: tools/extend_context.py checks a
    launch with it."""
    return tokenizer_and_holder(args, plan)[0]


def tokenizer_and_holder(args, plan: StartPlan) -> tuple:
    """(run_tokenizer's tokenizer, the weights whose tokenizer fixes its vocab: 'checkpoint DIR' or
    'the Hugging Face folder DIR', None where they carry none)."""
    explicit = explicit_tokenizer(args)
    if plan.load:
        with warnings.catch_warnings(record=True) as caught:  # a flag's file standing in for a carried one gone
            warnings.simplefilter("always")
            carried = checkpoint.carried_tokenizer(plan.load, stand_in=explicit)
        print_warnings([str(warning.message) for warning in caught])
        tokenizer = choose_tokenizer(explicit, carried, plan.load, args.tokenizer_type)
        return tokenizer, f"checkpoint {plan.load}" if carried is not None else None
    # an HF folder's tokenizer_config may not say its case: an explicit --tokenizer-type wins
    try:
        folder = hf_convert.read_hf_tokenizer(plan.init_from_hf) if plan.init_from_hf else None
    except DataError as error:  # the flags' tokenizer makes up for it
        if explicit is None:
            raise DataError(error.problem, f"{error.fix}, or pass the --tokenizer-file (or --vocab-file) the "
                            "data was made with") from None
        if launcher_rank() == 0:
            print(f"warning: {error.problem}; the run uses {explicit.file}", file=sys.stderr, flush=True)
        folder = None
    if explicit is None and args.tokenizer_type and folder is not None:
        explicit = typed_folder_tokenizer(args.tokenizer_type, folder, plan.init_from_hf)
    tokenizer = choose_tokenizer(explicit, folder, plan.init_from_hf, same_pipeline=not args.tokenizer_type,
                                 hf_folder=True)
    tokenizer = explicit if explicit is not None and args.tokenizer_type else tokenizer
    return tokenizer, f"the Hugging Face folder {plan.init_from_hf}" if folder is not None else None


def typed_folder_tokenizer(flag_type: str, folder, hf_dir: str):
    """--tokenizer-type without a tokenizer file, over the tokenizer of the --init-from-hf folder: a WordPiece
    case is the vocab.txt's (its tokenizer_config may not say it: an explicit type wins, as with --vocab-file);
    the other family (HFTokenizer vs WordPiece) is refused, as a resume and fill_mask refuse it (the folder's
    tokens are the model's)."""
    if (flag_type == HF_TOKENIZER) != isinstance(folder, HFTokenizer):
        raise ConfigError(f"--tokenizer-type {flag_type} differs from {folder.type_name}, which the Hugging Face "
                          f"folder {hf_dir} was trained with",
                          "drop --tokenizer-type (the folder carries its tokenizer)")
    return folder if isinstance(folder, HFTokenizer) else build_tokenizer(flag_type, folder.file)


def data_paths(args, plan: StartPlan, vocab_size: int = 0) -> tuple:
    """(data_path list, tokenizer): --data-path or the embedded default dataset (built once per node);
    the run's tokenizer (run_tokenizer), else the default dataset's vocab, refused where it differs
    from the vocab any dataset was made with."""
    tokenizer, holder = tokenizer_and_holder(args, plan)
    if args.data_path:
        if tokenizer is None:
            source = (f"the --init-from-hf folder {plan.init_from_hf} holds no vocab.txt or tokenizer.json"
                      if plan.init_from_hf else f"the checkpoint {plan.load} carries no tokenizer" if plan.load
                      else "the run starts from nothing that carries a tokenizer")
            raise ConfigError(f"--data-path is given without --vocab-file, and {source}", data_tokenizer_fix(args))
        data_path = args.data_path
    else:
        check_default_data_vocab(args, tokenizer, vocab_size)
        if local_rank() == 0:
            default = prepare_default_dataset(args.default_data_dir)
        dist.barrier()
        if local_rank() != 0:
            default = prepare_default_dataset(args.default_data_dir)  # finds it built: reuses it
        data_path = [default.data_prefix]
        tokenizer = tokenizer or build_tokenizer(args.tokenizer_type, default.vocab_file)
    if args.whole_word_masking:
        word_rule(tokenizer)  # refuses a tokenizer whose words cannot be told, before any data is built
    prefixes = parse_data_path(data_path)[1]
    check_data_vocab(tokenizer, prefixes, holder)
    case = None if holder else case_warning(tokenizer, args.tokenizer_type)  # the weights' own: the one they learned
    print_warnings([unrecorded_data_warning(prefixes, tokenizer.file),
                    unchecked_added_tokens_warning(prefixes, tokenizer), case])
    return data_path, tokenizer


def data_tokenizer_fix(args) -> str:
    """The fix of a --data-path without a tokenizer: the flags of the file its vocab record names, placed
    after the `--` of the tool's command that launches the run (--launched-by)."""
    recorded = recorded_tokenizer(parse_data_path(args.data_path)[1])
    fix = (f"pass {naming_flags(*recorded)}, the tokenizer the data's vocab record names" if recorded
           else "pass the vocab.txt (or --tokenizer-file) the data was made with")
    return fix + (f", after the -- of the {args.launched_by} command" if args.launched_by else "")


def check_default_data_vocab(args, tokenizer, vocab_size: int = 0) -> None:
    """Without --data-path the run trains on the default dataset, made with its own WordPiece vocab
    (the one in --default-data-dir, else the embedded one it is built with): a run that takes another
    tokenizer (a --vocab-file, a ModernBERT's tokenizer.json) is refused before the data is built,
    with the fix that applies to it; so is one whose weights carry no tokenizer and a `vocab_size` (theirs;
    0: the tokenizer decides) too small for that vocab, which the model check would refuse only once the
    data is built. Needs no process group: tools/extend_context.py checks a launch with it."""
    if tokenizer is None and not vocab_size:  # a run from scratch on the default data: its vocab decides
        return
    default = BertWordPiece(str(default_vocab_file(args.default_data_dir)))
    if tokenizer is None:
        if default.vocab_size > vocab_size:
            raise ConfigError(f"no --data-path, and the weights carry no tokenizer: the run would train on the default "
                              f"dataset, whose vocab {default.file} has {default.vocab_size} tokens, more than the "
                              f"model's vocab_size {vocab_size}", "pass the tokenizer the weights were trained with "
                              "(--tokenizer-file or --vocab-file) and --data-path with data preprocessed with it")
        return
    if tokenizer.identity != default.identity:
        made_with = naming_flags(tokenizer.type_name, tokenizer.file)
        raise ConfigError(f"no --data-path: the run would train on the default dataset, made with the vocab "
                          f"{default.file}, while its tokenizer is {tokenizer.file}",
                          f"pass --data-path with data preprocessed with it "
                          f"({paths.in_repository('tools/preprocess_data.py')} "
                          f"{made_with} ...)")


NO_EVALUATION = "no evaluation (--eval-iters 0): no validation or test data is built or read"  # Megatron's 0


def build_datasets(args, config, data_path: list, tokenizer, train_iters: int) -> tuple:
    """The train, valid and test sets (None: a split without documents), sized for `train_iters` steps
    and their evaluations, and the index maps they read; rank 0 describes them and warns of what the
    data flags leave out. Returns ((train, valid, test), used_maps)."""
    global_batch = config.global_batch_size
    eval_runs = train_iters // args.eval_interval + 1
    samples = (train_iters * global_batch, eval_runs * args.eval_iters * global_batch, args.eval_iters * global_batch)
    train_set, valid_set, test_set = build_train_valid_test_datasets(
        data_path, args.data_impl, args.split, samples, config.model.seq_length, tokenizer,
        cache_path=args.data_cache_path, **sample_options(args, config))
    datasets = (train_set, valid_set, test_set)
    if dist.get_rank() == 0:
        describe_datasets(args, config, data_path, datasets, train_iters)
    used_maps = [path for dataset in datasets for path in index_maps.used_maps(dataset)]
    if dist.get_rank() == 0:
        print(index_maps.describe(parse_data_path(data_path)[1], used_maps, args.log_dir, args.data_cache_path),
              flush=True)
    return datasets, used_maps


def describe_datasets(args, config, data_path: list, datasets: tuple, train_iters: int) -> None:
    """Rank 0's line per split (its samples and real-token share), then the warnings of the data flags."""
    train_set, valid_set, test_set = datasets
    stats = {name: token_stats(dataset) for name, dataset in zip(SPLIT_NAMES, datasets) if dataset is not None}
    for name, split in stats.items():
        print(split.describe(name), flush=True)
    if not args.eval_iters:
        print(NO_EVALUATION, flush=True)
    if "train" in stats and (note := padding_note(stats["train"], config)):
        print(f"note: {note}", flush=True)
    small = small_eval_splits({name: (stats[name], split_tokens(dataset)) for name, dataset in (
        ("valid", valid_set), ("test", test_set)) if dataset is not None}, config.micro_batch_size)
    small = with_eval_passes(small, stats, args.eval_iters * config.global_batch_size)
    rewritten = [rewrite_warning(prefix) for prefix in parse_data_path(data_path)[1]]
    flagged = data_warnings(args, data_path, valid_set, train_iters, test_set=test_set)
    for warning in [*filter(None, rewritten), *flagged, *filter(None, [small])]:
        print(f"warning: {warning}", file=sys.stderr, flush=True)


PADDING_NOTED = 0.5  # a train split more padding than this, unpacked, is named with --pack-samples


def padding_note(train: TokenStats, config) -> str | None:
    """The note for unpacked train samples that are mostly padding (a --seq-length far above the corpus's
    documents: 89% at 4096 tokens of the default corpus), which --pack-samples fills with more documents; the
    step costs the same either way. Linformer cannot pack."""
    if train.packed or train.real_token_share >= 1 - PADDING_NOTED or config.model.attention == "linformer":
        return None
    real = train.real_token_share * train.seq_length
    return (f"train samples are {1 - train.real_token_share:.0%} padding at --seq-length {train.seq_length} (one "
            f"document's sentences each, {real:.0f} real tokens on average): --pack-samples fills them with "
            "several documents, each attending only to itself: many more real tokens a step, at little more cost "
            "in a model of real size")


def data_warnings(args, data_path: list, valid_set, train_iters: int, test_set=True) -> list:
    """What the data flags leave out without being wrong: a blended prefix of weight 0, a run that asks
    for evaluation with no validation documents, and a test share of --split that a small corpus rounds
    to no document (no test loss at the end; a test share of 0 asks for none). `test_set`: any true
    value stands for a split with documents."""
    notes = [f"--data-path weight 0 for {prefix}: none of its samples are read"
             for weight, prefix in zip(*parse_data_path(data_path)) if weight == 0]
    if not args.eval_iters:  # no evaluation asked for: no split lacks what it was asked for
        return notes
    if valid_set is None and args.eval_interval <= train_iters:
        shares = split_weights(args.split)
        fix = ("pass a larger validation share of --split, or a larger corpus" if len(shares) > 1 and shares[1]
               else "pass a --split with a validation share, e.g. --split 949,50,1")
        notes.append(f"--split {args.split} leaves no validation documents: the evaluation every --eval-interval "
                     f"{args.eval_interval} steps is skipped; {fix}")
    shares = split_weights(args.split)
    if test_set is None and len(shares) > 2 and shares[2]:
        notes.append(f"--split {args.split} leaves no test documents: there is no test loss at the end; pass a "
                     "larger test share of --split, or a larger corpus (a test share of 0 asks for none)")
    return notes


def small_eval_splits(splits: dict, micro_batch: int) -> str | None:
    """The warning for the evaluation splits ({valid / test: (TokenStats, split_tokens)}) whose documents
    hold fewer tokens than one micro-batch of samples: their samples repeat those few tokens, epoch
    after epoch, among padding, so their losses are measured on them alone. One line for both."""
    seq_length = next(iter(splits.values()))[0].seq_length if splits else 0
    small = [f"{name} {tokens} tokens in {_samples_text(stats)}" for name, (stats, tokens) in splits.items()
             if tokens < micro_batch * seq_length]
    if not small:
        return None
    return (f"evaluation data smaller than one micro-batch of samples ({micro_batch} x {seq_length} tokens): "
            f"{', '.join(small)}: each loss is measured on these few tokens, repeated; give the split more "
            "documents (a larger share of --split, or a larger corpus) or pass a shorter --seq-length")


def _samples_text(stats: TokenStats) -> str:
    """"N samples (P% padding)" of a split's distinct samples, and what its index map repeats them to."""
    distinct = stats.epoch_samples or stats.samples
    repeated = f"repeated to {stats.samples}; " if stats.samples > distinct else ""
    return (f"{distinct} sample{'s' if distinct != 1 else ''} ({repeated}"
            f"{1 - stats.real_token_share:.0%} padding)")


def with_eval_passes(warning: str | None, stats: dict, per_evaluation: int) -> str | None:
    """small_eval_splits' warning (or a new one) naming the evaluation splits ({name: TokenStats}) that one
    evaluation of per_evaluation samples (--eval-iters x global batch) reads more than twice: the same
    documents, masked anew, K passes over the samples of one pass over them (of a blend, over its most-read
    prefix's). Twice is no waste worth a line (each token masked anew); the main job's small splits are read
    up to twice."""
    def described(name, split) -> str | None:
        reads, samples = most_read(split, per_evaluation)
        if reads <= 2:
            return None
        whose = "one prefix's" if split.prefix_epochs else "its"
        return f"{name} {reads:.{1 if reads < 10 else 0}f} passes over {whose} {samples} samples"
    passes = list(filter(None, (described(name, split) for name, split in stats.items() if name != "train")))
    if not passes:
        return warning
    said = (f"each evaluation reads {per_evaluation} samples (--eval-iters x global batch): {', '.join(passes)} "
            "(the same documents, masked anew)")
    return (f"{warning}; {said}" if warning else
            f"{said}; give the split more documents (a larger share of --split, or a larger corpus) or pass a "
            "smaller --eval-iters")


def most_read(split, per_evaluation: int) -> tuple:
    """(passes, samples) over the samples of one pass of the split's most-read part in one evaluation:
    a blend reads its prefixes in their weights' shares, so a small prefix of a large weight repeats
    more often than the blend's sum of samples says. (0, 0): a split of no sample."""
    parts = split.prefix_epochs or ((1.0, split.epoch_samples),)
    return max(((share * per_evaluation / samples, samples) for share, samples in parts if samples), default=(0, 0))


def sample_options(args, config) -> dict:
    """Dataset keyword arguments from the flags, the same for the train, valid and test sets."""
    return dict(masked_lm_prob=args.mask_prob, short_seq_prob=args.short_seq_prob, seed=args.seed,
                binary_head=config.model.add_binary_head,
                whole_word_masking=args.whole_word_masking, pack_samples=config.pack_samples,
                max_segment_length=config.model.max_segment_length)


def batch_reader(config, stop: "StopSignals", num_workers: int):
    """The function that reads `count` steps of this data rank's micro-batches (lists of gas BertBatch)
    of a dataset from sample `start`, built by `num_workers` DataLoader processes ahead of the steps
    (--num-workers); every rank agrees on each step (stop.agree) before it is taken. Closing the
    generator (or its end) ends the workers. With CUDA and the whole sequence on one rank, the loader
    pins the batches (off the step's thread); a sequence-parallel rank pins only its own slice
    (device.to_device)."""
    def batches(dataset, start: int, count: int):
        gas = config.gradient_accumulation_steps
        sampler = PretrainingSampler(len(dataset), start, config.micro_batch_size, state.get_data_parallel_rank(),
                                     state.get_data_parallel_world_size(), micro_batches=count * gas)
        pin = torch.cuda.is_available() and state.get_sequence_parallel_world_size() == 1
        with contextlib.closing(micro_batches(dataset, sampler, num_workers, pin_memory=pin)) as loader:
            for _ in range(count):
                step = [next(loader) for _ in range(gas)]
                stop.agree(step, config.model.vocab_size)
                yield step
    return batches


def data_workers(args) -> int:
    """--num-workers, else 2 DataLoader processes per rank with CUDA (the GPU waits for no sample) and
    0 without (on CPU the workers take cores from the ranks' own threads: docs/data.md's measurement)."""
    if args.num_workers is not None:
        return args.num_workers
    return 2 if torch.cuda.is_available() else 0
