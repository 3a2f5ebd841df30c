"""The pretraining run: config, data, engine, the train/eval loop, checkpoints and logs.

pretrain_bert.py calls `main`; every rank runs this, started by the `deepspeed` launcher (or
any env:// launcher). Errors a user can cause end the run with one line and exit code 2.
"""
import argparse
import atexit
import concurrent.futures
import contextlib
import dataclasses
import math
import os
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from megatron import checkpoint, checkpoint_compat, determinism, hf_convert, hf_io, hf_modernbert, locks, paths
from megatron.arguments import build_parser, config_flags
from megatron.config import (TrainConfig, adjustable_start_fields, model_notes, read_ds_config, refuse_contradictions,
                             resolve)
from megatron.data import index_maps
from megatron.data.bert_dataset import (SPLIT_NAMES, build_train_valid_test_datasets, parse_data_path, split_tokens,
                                        split_weights, token_stats)
from megatron.data.default_dataset import EMBEDDED_VOCAB, prepare_default_dataset
from megatron.data.samplers import PretrainingSampler, micro_batches
from megatron.data.tokenizer import (HF_TOKENIZER, BertWordPiece, HFTokenizer, build_tokenizer,
                                     check_data_vocab, check_fits, choose_tokenizer, explicit_tokenizer,
                                     naming_flags)
from megatron.data.words import word_rule
from megatron.data.workers import check_num_workers
from megatron.ds_schema import OPTIMIZER_DEFAULTS, default_optimizer, optimizer_params_taken, precision
from megatron.engine import build_engine, check_precision_supported, eval_step, skip_nonfinite_updates, train_step
from megatron.errors import (WHERE_FIX, ConfigError, DataError, Interrupted, cannot_use, ignore_signals,
                             raise_on_signals, restore_signals, stopped_during_start_up)
from megatron.model.args import BertConfig
from megatron.model.attention import blocks
from megatron.model.attention.rules import refuse_local_layers
from megatron.model.bert import BertModel
from megatron.model.fields import weights_fixed
from megatron.parallel import device, jit_locks, peers, state
from megatron.parallel.launch_check import launch_environment
from megatron.parallel.launch_env import launcher_rank, local_rank
from megatron.parallel.peers import lost_rank_text, report_once
from megatron.resume import (data_settings, describe_batch_change, describe_data_change, describe_sample_change,
                             given_attention, kept_regime, note_replaced_settings, note_taken_regime,
                             resume_optimizer, resume_schedule, take_regime)
from megatron.run_log import RunLog, free_log_dir, log_dir_problem, tensorboard_problem
from megatron.schedule import Schedule
from megatron.stop_signals import END_OF_RUN, StopSignals


def main(argv=None) -> int:
    # until the training loop notes a stop (StopSignals), a stop runs the clean-ups below; from before
    # the arguments are parsed (the parser imports DeepSpeed)
    start_up = raise_on_signals()
    args, debug = None, False  # args: None until parsed (a stop or a flag error before)
    progress = Progress()
    try:
        args = build_parser().parse_args(argv)
        debug = args.debug
        check_flags(args)
        check_flag_combinations(args)
        args.log_dir = free_log_dir(args.log_dir, args.save)  # the default runs/bert, or runs/bert-N when taken
        stopped_by = pretrain(args, start_up, progress)
    except Interrupted as error:  # a stop signal before the training loop (raise_on_signals)
        if debug:
            raise
        line = stopped_during_start_up(error.signum)
        if dist.is_available() and dist.is_initialized():  # the rank signalled may be the only one that knows
            locks.release_lock()
            report_once(line)
        elif launcher_rank() == 0:  # every rank stops alike (the launcher signals each); one line
            print(line, file=sys.stderr, flush=True)
        return 128 + error.signum
    except (ConfigError, OSError, RuntimeError) as error:  # OSError: a path the run reads or writes; RuntimeError:
        try:  # another rank lost (peers.lost)
            return report_error(error, args, progress, start_up)
        except Interrupted:  # the launcher's SIGTERM to every rank once one ended, handled only now (the first
            return report_error(error, args, progress, start_up)  # call after a blocking one): the error says why
    finally:
        locks.release_lock()  # the --save folder's and --log-dir's, taken by rank 0 at start-up
        close_process_group()  # after an error too (reported above): a failed start aborted at exit just the same
        restore_signals(start_up)  # also when the training loop ended in an error (StopSignals left installed)
    return 128 + stopped_by if stopped_by else 0


def report_error(error: Exception, args, progress, start_up: dict) -> int:
    """Exit code 2 once the error's one line is printed (report_once) and rank 0's --save lock released;
    an error no check foresaw (or --debug) is raised again, for its traceback. `args`: None when the
    error came while the flags were parsed."""
    problem = None if args is not None and args.debug else one_line_problem(error, args, progress)
    if problem is None:
        raise error
    # the handlers main was given: a rank left to outlive the one that prints (report_once) ends
    # on its launcher's SIGTERM silently
    locks.release_lock()  # before a launcher's SIGTERM can end this rank (rank 0 holds it)
    restore_signals(start_up)
    report_once(f"pretrain_bert.py: error: {problem}", node_leaders=getattr(error, "node_leaders", False))
    return 2


@dataclasses.dataclass
class Progress:
    """Where this rank's run is, kept by the training loop for the line of a lost rank (lost_rank_problem)."""
    phase: str = "start-up"
    last_checkpoint: str | None = None  # the newest complete one: the loaded one, then each saved


def one_line_problem(error: Exception, args, progress: Progress) -> ConfigError | None:
    """The one line an error ends the run with, or None for one no check foresaw (its traceback)."""
    if isinstance(error, ConfigError):
        return error
    if isinstance(error, OSError):
        return cannot_use(error, WHERE_FIX) if error.filename else None
    return lost_rank_problem(error, args, progress) if args is not None else None


def lost_rank_problem(error: Exception, args, progress: Progress) -> ConfigError | None:
    """A collective that failed for another rank (peers.lost) as one line: what happened, in which
    phase, and where the run can resume from. The rank that ended says why itself, or its launcher does."""
    how = peers.lost(error)
    if how is None:
        return None
    problem, raise_it = lost_rank_text(how, args, progress.phase)
    if progress.phase == "start-up":
        return ConfigError(problem, f"nothing was trained; rerun the same command{raise_it}")
    if progress.last_checkpoint:
        return ConfigError(problem, f"the last checkpoint is {progress.last_checkpoint}: resume with --load "
                                    f"{os.path.dirname(progress.last_checkpoint)}{raise_it}")
    keep = "" if args.save and args.save_interval else " (--save DIR with --save-interval N keeps a run's steps)"
    return ConfigError(problem, f"nothing was saved before it: rerun the same command{raise_it}{keep}")


def close_process_group() -> None:
    """When main ends, however it ends, as torch asks. It does not stop gloo's threads: DeepSpeed's
    engine keeps the groups alive (see exit_rank). No collective: a rank that failed alone (rank 0's
    final log write) must not keep the others waiting."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_rank(code: int) -> NoReturn:
    """Ends a rank process without the interpreter's and the C++ runtime's teardown, as multiprocessing
    ends its children. DeepSpeed's engine holds the process groups in reference cycles through
    autograd's hooks, which the garbage collector cannot free: after destroy_process_group a rank
    still runs 2 gloo worker threads per group and gloo's I/O loops, and one that is busy while the
    process tears itself down aborts it (SIGABRT, 'terminate called without an active exception':
    exit code -6 and the launcher's 250 after a run that had finished; seen in CI). Every file the
    run writes is closed, or flushed record by record (metrics.jsonl, TensorBoard), by then; the
    Python exit hooks run (logging, multiprocessing, DeepSpeed's wandb / comet monitors), and the
    streams are flushed. A stop signal from here on changes nothing: the rank is leaving."""
    ignore_signals()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing left to show
            stream.flush()
    os._exit(code)


def check_flags(args) -> None:
    """Flag values that cannot mean what was asked, and flags the run would not read, refused before
    DeepSpeed starts (cheap, on every rank alike). Model sizes and parallel degrees are checked by
    megatron.config; the data's weights and split here, before any index map is built."""
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
    if args.data_cache_path and (problem := log_dir_problem("--data-cache-path", args.data_cache_path)):
        raise ConfigError(*problem)  # a file in the way or a read-only mount, named with the flag: before any map
    if args.train_iters is not None and args.train_samples is not None:
        raise ConfigError(f"--train-iters {args.train_iters} and --train-samples {args.train_samples} both set the "
                          "run length", "pass one of them")
    for flag, value in (("--log-interval", args.log_interval), ("--eval-interval", args.eval_interval),
                        ("--eval-iters", args.eval_iters), ("--save-interval", args.save_interval),
                        ("--micro-batch-size", args.micro_batch_size),
                        ("--global-batch-size", args.global_batch_size),
                        ("--checkpoint-num-layers", args.checkpoint_num_layers), ("--keep-last", args.keep_last),
                        ("--rendezvous-timeout", args.rendezvous_timeout)):
        at_least(flag, value, 1)
    check_num_workers(args.num_workers)  # bounded by the CPUs (megatron/data/workers.py)
    if not 0 < args.mask_prob <= 1:
        raise ConfigError(f"--mask-prob {args.mask_prob} is outside (0, 1]",
                          "pass the fraction of tokens to mask, e.g. --mask-prob 0.15")
    if not 0 <= args.lr_warmup_fraction <= 1:
        raise ConfigError(f"--lr-warmup-fraction {args.lr_warmup_fraction} is outside [0, 1]",
                          "pass the fraction of the steps to warm up over, e.g. --lr-warmup-fraction 0.01")
    check_optimizer_flags(args)
    if args.distributed_timeout_minutes is not None and not args.distributed_timeout_minutes > 0:
        # (--init-method-std and --layernorm-epsilon: config._check_model_numbers, with the model's numbers)
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
    would be ignored. (Not in check_flags: azureml/submit.py checks the flags it is given with it and
    adds --save, --load and the data flags itself.)"""
    if not (args.train_iters or args.train_samples):
        raise ConfigError("the run length is not set", "pass --train-iters N or --train-samples N")
    needs = ((args.save_interval, "--save-interval", args.save, "--save DIR", "checkpoints are saved only with --save"),
             (args.keep_last, "--keep-last", args.save, "--save DIR", "it prunes the --save folder"),
             (args.checkpoint_num_layers, "--checkpoint-num-layers", args.checkpoint_activations,
              "--checkpoint-activations", "it sizes the recomputed chunks"),
             (args.no_position_extension or None, "--no-position-extension", args.init_from_hf, "--init-from-hf DIR",
              "it refuses extending the Hugging Face folder's positions"),
             (args.no_load_rng or None, "--no-load-rng", args.load, "--load DIR", "it skips the checkpoint's RNG "
              "states"),
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
    if args.min_lr is not None and args.lr_decay_style == "constant":
        raise ConfigError(f"--min-lr {args.min_lr} is given with --lr-decay-style constant, which never decays",
                          "pass --lr-decay-style linear or cosine, or drop --min-lr")


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


@dataclasses.dataclass(frozen=True)
class StartPlan:
    """Where the run starts, as check_start resolved it from the flags and the folders they name: the
    flags stay as given, and every function that reads the start takes this plan. `weights_only`:
    --load gives weights only (--finetune, or a weights-only checkpoint such as from-hf writes), a new
    run from them, not a resume."""
    load: str | None
    init_from_hf: str | None
    finetune: bool
    weights_only: bool

    @classmethod
    def at(cls, load: str | None, init_from_hf: str | None, finetune: bool) -> "StartPlan":
        """The plan of these three, `weights_only` read from --load's run state."""
        weights_only = bool(load and (finetune or checkpoint.run_state(
            load, checkpoint.latest_tag(load)).get("weights_only")))
        return cls(load, init_from_hf, finetune, weights_only)

    @classmethod
    def given(cls, args) -> "StartPlan":
        """The start the flags name as given, with no requeue resolved (check_start's): for tools and tests."""
        return cls.at(args.load, args.init_from_hf, args.finetune)

    @property
    def resume(self) -> bool:
        """--load restores a whole run (engine, optimizer, schedule)."""
        return bool(self.load) and not self.weights_only

    @property
    def source(self) -> tuple | None:
        """(folder, "hf" | "checkpoint") of the weights a new run starts from; None: scratch or a resume."""
        if self.init_from_hf:
            return self.init_from_hf, "hf"
        return (self.load, "checkpoint") if self.weights_only else None


def check_start(args) -> StartPlan:
    """Where the run starts, checked from the files before any start-up work (DeepSpeed, data,
    model): a --save directory whose checkpoint is ahead of that start is refused now, not after
    the engine is built. --load naming the --save folder before it holds a checkpoint starts from
    scratch (Megatron's `--load X --save X`: a job that is resubmitted or requeued with the same
    command resumes from its last save, and its first run starts fresh); a run from weights does the
    same (requeue_from_weights). A --save folder with checkpoints but no `latest` is refused (it is no
    first run's); one whose newer checkpoints a rollback will overwrite is named in a warning."""
    if args.save:
        checkpoint.refuse_unnamed_checkpoints(args.save)
        refuse_finetune_in_place(args)
    load = args.load
    if args.load and args.save and same_folder(args.load, args.save) \
            and not os.path.isfile(os.path.join(args.load, checkpoint.LATEST)):
        if args.init_from_hf and launcher_rank() == 0:
            print(f"--load {args.load} holds no checkpoint yet: starting from --init-from-hf {args.init_from_hf}",
                  flush=True)
        load = None
    plan = requeue_from_weights(StartPlan.at(load, args.init_from_hf, args.finetune), args.save)
    if plan.init_from_hf:  # a folder of weights: a checkpoint, one iter_* of it or a --log-dir is named by the flag
        hf_io.hf_weight_files(plan.init_from_hf)  # that takes it, before pending_origin's hash reads those files
    if not args.save:
        return plan
    start = 0
    if plan.resume:
        start = checkpoint.run_state(plan.load, checkpoint.latest_tag(plan.load))["iteration"]
    newer = checkpoint.check_save_dir(args.save, start)
    if newer and launcher_rank() == 0:
        print(checkpoint.overwrite_warning(args.save, newer, start), file=sys.stderr, flush=True)
    return plan


def refuse_finetune_in_place(args) -> None:
    """`--finetune --load S --save S`: the new run, from iteration 0, would overwrite the checkpoints of
    the run it starts from; named before check_save_dir's line, which would advise the --load given."""
    if not (args.finetune and args.load and same_folder(args.load, args.save)
            and os.path.isfile(os.path.join(args.load, checkpoint.LATEST))):
        return
    iteration = checkpoint.run_state(args.load, checkpoint.latest_tag(args.load))["iteration"]
    if iteration > 0:
        raise ConfigError(f"--finetune starts a new run at iteration 0, and --save {args.save} holds iteration "
                          f"{iteration} of the run it starts from", f"pass another --save, or drop --finetune to "
                          f"resume {args.save}")


def same_folder(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def requeue_from_weights(plan: StartPlan, save: str | None) -> StartPlan:
    """A run from weights given with the folder of its own checkpoints resumes from them, as Megatron's
    --load with --pretrained-checkpoint does, so that one command serves a job's first run and every
    requeue: `--init-from-hf X --load S --save S` resumes S once it holds a checkpoint (before, it starts
    from X: check_start); `--load W [--finetune] --save S` (W weights only, or --finetune) resumes S once
    it holds a checkpoint of a run that started from W. The unused start is named in one line; a
    checkpoint of a run that started elsewhere is refused (check_origin), as is an S without a checkpoint
    that this run does not save into (a typo, an unmounted disk: it would never be resumed). Returns
    `plan` with the start it resumes (`save`: --save)."""
    if plan.init_from_hf and plan.load:
        state = checkpoint.run_state(plan.load, checkpoint.latest_tag(plan.load))  # no or a broken S: its line
        check_origin(state.get(checkpoint.ORIGIN), f"--load {plan.load}", plan.init_from_hf, "hf")
        note_unused_start(f"--init-from-hf {plan.init_from_hf}", f"--load {plan.load}", state["iteration"])
        return dataclasses.replace(plan, init_from_hf=None)
    if plan.load and save and not same_folder(plan.load, save) \
            and os.path.isfile(os.path.join(save, checkpoint.LATEST)) and plan.weights_only:
        state = checkpoint.run_state(save, checkpoint.latest_tag(save))
        if checkpoint.ORIGIN not in state:  # saved before runs recorded their start: check_save_dir's line
            return plan
        given = f"--load {plan.load}{' --finetune' if plan.finetune else ''}"
        check_origin(state[checkpoint.ORIGIN], f"--save {save}", plan.load, "checkpoint", given)
        note_unused_start(given, f"--save {save}", state["iteration"])
        return StartPlan.at(save, plan.init_from_hf, False)
    return plan


def weights_origin(plan: StartPlan) -> dict:
    """What a new run starts from, kept with each of its checkpoints (checkpoint.ORIGIN) for a requeue
    to compare (check_origin): scratch (storing its own max_position_embeddings: checkpoint.OWN_POSITIONS),
    or the weights' folder, kind and fingerprint (a hash of every weight: pending_origin runs it aside)."""
    if plan.source is None:
        return {"from": None, checkpoint.OWN_POSITIONS: True}
    source, kind = plan.source
    return {"from": os.path.realpath(source), "kind": kind, "sha256": hf_io.weights_fingerprint(source, kind)}


def pending_origin(plan: StartPlan, save: str | None) -> concurrent.futures.Future | None:
    """weights_origin for the checkpoints of a new run's rank 0 (None: another rank, a resume, which keeps
    its checkpoint's, or a run that saves none); resume_or_start takes its result (its error, if any).
    An HF folder's hash reads its files block by block in a thread: neither the start-up nor the
    rendezvous, whose --rendezvous-timeout the other ranks count while rank 0 is not there yet, waits on
    it. A checkpoint's hash loads its weights: done here, before initial_weights loads them again, so
    that rank 0 never holds two copies (it did, hashed aside while the run's copy was held)."""
    if not save or plan.resume or launcher_rank() != 0:
        return None
    if plan.source is None or plan.source[1] == "checkpoint":
        done = concurrent.futures.Future()
        done.set_result(weights_origin(plan))
        return done
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="weights-origin")
    try:
        return pool.submit(weights_origin, plan)
    finally:
        pool.shutdown(wait=False)


def check_origin(recorded, folder: str, source: str, kind: str, given: str | None = None) -> None:
    """A requeue names the weights the checkpoint's run started from (that folder, or a copy of it: the
    same fingerprint); another start would go on training another model under this command. `recorded`:
    weights_origin of that run, None in a checkpoint saved before runs recorded it (not compared)."""
    if not isinstance(recorded, dict):
        return
    start = recorded.get("from")
    if start and (same_folder(source, start) or (recorded.get("kind") == kind and
                                                 same_fingerprint(source, kind, recorded.get("sha256")))):
        return
    given = given or f"--init-from-hf {source}"
    path = folder.split(" ", 1)[1]
    hf_start = recorded.get("kind") == "hf"
    started = f"--init-from-hf {start}" if hf_start else f"--load {start}"
    if not start:
        fix = f"resume it with --load {path} alone"
    elif hf_start == (kind == "hf"):  # the same kind: only the weights change
        fix = f"requeue it with {started}"
    else:  # the other kind: the first run's whole start, in place of this one's
        fix = f"requeue it with {started}{f' --load {path}' * hf_start} --save {path} in place of {given}" + \
              (", --load and --save" if kind == "hf" else " and --save")
    others = "another --load and --save" if kind == "hf" else "another --save"
    raise ConfigError(f"{folder} holds a run that started from {started if start else 'scratch'}, not from {given}",
                      f"{fix}, or pass {others} to start from {source}")


def same_fingerprint(source: str, kind: str, recorded) -> bool:
    try:
        return hf_io.weights_fingerprint(source, kind) == recorded
    except (OSError, ConfigError):  # not the folder it was (ConfigError: DataError too)
        return False


def note_unused_start(given: str, folder: str, iteration: int) -> None:
    """The one line of a requeued run from weights (requeue_from_weights), from the first rank."""
    if launcher_rank() == 0:
        print(f"{given} is not used: {folder} holds iteration {iteration}, which this run resumes (a requeued "
              "job)", flush=True)


def check_log_dirs(args) -> None:
    """--log-dir and --tensorboard-dir (and the tensorboard package), which rank 0 alone writes
    (RunLog), checked there before any work, and --log-dir's lock taken (one run at a time logs
    there, as one saves into a --save folder); every rank raises rank 0's error, so none goes on
    training while rank 0 stops."""
    found = [None]
    if dist.get_rank() == 0:
        dirs = [("--log-dir", args.log_dir), ("--tensorboard-dir", args.tensorboard_dir)]
        problems = (*(log_dir_problem(flag, path) for flag, path in dirs if path),
                    tensorboard_problem() if args.tensorboard_dir else None)
        found = [next(filter(None, problems), None)]
        if found[0] is None and args.log_dir:
            found = [lock_log_dir(args.log_dir)]
    dist.broadcast_object_list(found, src=0)
    if found[0]:
        raise ConfigError(*found[0])


def lock_log_dir(log_dir: str) -> tuple[str, str] | None:
    """Takes --log-dir's lock (locks.take_lock), making the folder for it (removed again at the
    release when the run left it empty); (problem, fix) when a live run logs there."""
    created = paths.missing_folders(log_dir)
    os.makedirs(log_dir, exist_ok=True)
    return locks.take_lock(log_dir, created, "--log-dir", locks.LOG_LOCK)


def nothing_to_train(args, iteration: int, train_iters: int) -> str:
    """The line of a finished run started again, naming the run-length flag that was given."""
    flag, length = (("--train-iters", f"--train-iters {train_iters}") if args.train_iters else
                    ("--train-samples", f"{train_iters} (--train-samples {args.train_samples})"))
    return f"nothing to train: the checkpoint is at iteration {iteration} of {length}; pass a larger {flag} to train on"


def deepspeed_settings(args, cuda: bool | None = None) -> dict:
    """The JSON (if any) with the optimizer the flags describe filled in (--clip-grad: config.resolve):
    flags given on the command line win, the JSON fills the rest, then the defaults. `cuda`: whether the
    run's machines have GPUs (default: this one's; given, as azureml/submit.py checks a job for
    other machines, this one's FusedAdam build is not probed)."""
    ds = read_ds_config(args.deepspeed_config) if args.deepspeed_config else {}
    here, cuda = cuda is None, torch.cuda.is_available() if cuda is None else cuda
    params = default_optimizer(ds, cuda)  # AdamW, the params the JSON lacks, torch_adam without CUDA
    taken, optimizer = optimizer_params_taken(ds, cuda)
    flags = (("--lr", "lr", args.lr), ("--weight-decay", "weight_decay", args.weight_decay),
             ("--adam-beta1", "betas", args.adam_beta1), ("--adam-beta2", "betas", args.adam_beta2),
             ("--adam-eps", "eps", args.adam_eps))
    for flag, key, value in flags:
        if value is not None and taken is not None and key not in taken:
            raise ConfigError(f"{flag} {value} is given but {optimizer} takes no {key}",
                              f"drop {flag}, or use an optimizer.type that takes {key} (e.g. AdamW)")
    if args.adam_beta1 is not None or args.adam_beta2 is not None:
        betas = list(params.get("betas", OPTIMIZER_DEFAULTS["betas"]))  # two numbers: checked with the JSON
        for index, beta in enumerate((args.adam_beta1, args.adam_beta2)):
            betas[index] = betas[index] if beta is None else beta
        params["betas"] = betas
    given = {"lr": args.lr, "weight_decay": args.weight_decay, "eps": args.adam_eps}
    params.update({key: value for key, value in given.items() if value is not None})
    if args.min_lr is not None and args.lr is None and args.min_lr > params["lr"]:
        raise ConfigError(f"--min-lr {args.min_lr} is above the JSON's optimizer.params.lr {params['lr']}: the "
                          "schedule would rise as it decays", "pass a --min-lr at most the peak, or --lr")
    if here and cuda and ds["optimizer"].get("type", "").lower() in ("adam", "adamw") and "torch_adam" not in params:
        problem = device.fused_adam_problem()  # a JIT build that would fail every rank at start-up
        if problem:
            params["torch_adam"] = True
            if launcher_rank() == 0:
                print(f"warning: DeepSpeed's FusedAdam cannot be had here: {problem[0]}; training with torch's Adam "
                      f"(the same update, unfused). For the fused kernel: {problem[1]}", file=sys.stderr, flush=True)
    ds.setdefault("steps_per_print", 10**9)  # the run log prints progress
    return ds


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


def data_paths(args, plan: StartPlan) -> tuple:
    """(data_path list, tokenizer): --data-path or the embedded default dataset (built once per node);
    the run's tokenizer (run_tokenizer), else the default dataset's vocab, refused where it differs
    from the vocab any dataset was made with."""
    tokenizer, holder = tokenizer_and_holder(args, plan)
    if args.data_path:
        if tokenizer is None:
            source = (f"the --init-from-hf folder {plan.init_from_hf} holds no vocab.txt or tokenizer.json"
                      if plan.init_from_hf else f"the checkpoint {plan.load} carries no tokenizer" if plan.load
                      else "the run starts from nothing that carries a tokenizer")
            raise ConfigError(f"--data-path is given without --vocab-file, and {source}",
                              "pass the vocab.txt (or --tokenizer-file) the data was made with")
        data_path = args.data_path
    else:
        check_default_data_vocab(args, tokenizer)
        if local_rank() == 0:
            default = prepare_default_dataset(args.default_data_dir)
        dist.barrier()
        if local_rank() != 0:
            default = prepare_default_dataset(args.default_data_dir)  # finds it built: reuses it
        data_path = [default.data_prefix]
        tokenizer = tokenizer or build_tokenizer(args.tokenizer_type, default.vocab_file)
    if args.whole_word_masking:
        word_rule(tokenizer)  # refuses a tokenizer whose words cannot be told, before any data is built
    check_data_vocab(tokenizer, parse_data_path(data_path)[1], holder)
    return data_path, tokenizer


def check_default_data_vocab(args, tokenizer) -> None:
    """Without --data-path the run trains on the default dataset, made with its own WordPiece vocab
    (the one in --default-data-dir, else the embedded one it is built with): a run that takes another
    tokenizer (a --vocab-file, a ModernBERT's tokenizer.json) is refused before the data is built,
    with the fix that applies to it. Needs no process group: tools/extend_context.py checks a launch with it."""
    if tokenizer is None:
        return
    built = Path(args.default_data_dir) / "vocab.txt"
    default = BertWordPiece(str(built if built.is_file() else EMBEDDED_VOCAB))
    if tokenizer.identity != default.identity:
        made_with = naming_flags(tokenizer.type_name, tokenizer.file)
        raise ConfigError(f"no --data-path: the run would train on the default dataset, made with the vocab "
                          f"{default.file}, while its tokenizer is {tokenizer.file}",
                          f"pass --data-path with data preprocessed with it "
                          f"({paths.in_repository('tools/preprocess_data.py')} "
                          f"{made_with} ...)")


def model_flags(args, ds: dict, plan: StartPlan) -> dict:
    """BertConfig / TrainConfig field values from the flags, with the sizes of the weights the run
    starts from (--init-from-hf, weights-only --load) or resumes (--load: its whole model and
    --seq-length) where the flags (a preset) leave them out; vocab_size None where neither gives it (the
    vocab file's, once it is read: a preset never sets it). Flags that contradict those weights are
    refused, as is linformer or bigbird over their local layers."""
    flags = config_flags(args)
    weights = starting_weights_fields(plan)
    resume = plan.resume
    start = initial_model_fields(weights, resume)
    if start and not (resume or plan.init_from_hf):  # a checkpoint's weights: the longest length they trained at
        start["max_position_embeddings"] = checkpoint.declared_positions(plan.load, checkpoint.latest_tag(plan.load))
    source = (f"the --init-from-hf folder {plan.init_from_hf}" if plan.init_from_hf
              else f"the checkpoint {plan.load}" if plan.finetune or resume
              else f"the weights-only checkpoint {plan.load}")
    refuse_contradictions(start, source, flags, ds, adjustable_start_fields(start, bool(plan.init_from_hf), resume))
    if args.no_position_extension and start.get("position_embedding_type") == "rope":
        raise ConfigError(f"--no-position-extension has no effect on {source}: its positions are rotary, with no "
                          "table to extend", "drop --no-position-extension")
    if "local_attention_window" in start:  # the weights have local layers (carried_fields), which no flag drops
        refuse_local_layers(given_attention(flags, ds), source)
    if not resume:  # a resume refuses them (refuse_contradictions)
        note_replaced_settings(flags, start, source)
    for field, value in start.items():
        flags[field] = value if flags.get(field) is None else flags[field]
    if resume:
        print_warnings([kept_regime(weights, flags, ds, source)])
    elif start:  # a new run from weights: their regime, not BertConfig's defaults, where no flag sets it
        note_taken_regime(take_regime(weights, flags, ds, "local_attention_window" in start)[0], source)
    if flags.get("seq_length") is None and start:
        flags["seq_length"] = start_length(plan, weights, flags)
    if start and not resume:
        trained = weights["max_position_embeddings" if plan.init_from_hf else "seq_length"]
        note_longer_than_trained(flags, start, trained, source)
    flags["bigbird_seed"] = args.seed  # BigBird's random blocks follow the run's seed
    return flags


def note_longer_than_trained(flags: dict, start: dict, trained: int, source: str) -> None:
    """The line of a new run from rotary weights at a longer --seq-length than they trained at and at
    their own global theta: the model extrapolates (a choice, so not refused), where the recipe for a
    longer context also scales the theta (tools/extend_context.py). From the first rank."""
    if (start.get("position_embedding_type") != "rope" or not flags.get("seq_length") or not trained
            or flags["seq_length"] <= trained or flags.get("rotary_base") != start.get("rotary_base")):
        return
    if launcher_rank() == 0:
        print(f"note: --seq-length {flags['seq_length']} is {flags['seq_length'] / trained:g}x the {trained} tokens "
              f"{source} was trained at, with its global rope theta {start.get('rotary_base'):g}: the model "
              f"extrapolates; {paths.in_repository('tools/extend_context.py')} continues at a longer length with a "
              f"scaled theta ({paths.in_repository('docs/hugging-face.md')}), or pass --rotary-base", flush=True)


def start_length(plan: StartPlan, weights: dict, flags: dict) -> int:
    """The --seq-length a run from weights takes when the flag is left out: the default 512, or less
    where the weights reach less: a weights-only checkpoint's stored length (a from-hf one stores its
    folder's positions), an HF folder's positions as this run sets them (--max-position-embeddings).
    A resume goes on at the checkpoint's length (another one, given, is a warning: describe_sample_change)."""
    if plan.resume:
        return weights["seq_length"]
    if plan.init_from_hf:
        reach = flags.get("max_position_embeddings") or BertConfig.seq_length
    else:
        reach = weights["seq_length"]
    return min(BertConfig.seq_length, reach)


def rope_positions_note(args, model: BertConfig) -> str | None:
    """The line for --max-position-embeddings with rotary positions at another length than the run's:
    there is no table for it to size, it only declares the trained length of the Hugging Face export."""
    if model.position_embedding_type != "rope" or args.max_position_embeddings in (None, model.seq_length):
        return None
    return (f"note: --max-position-embeddings {args.max_position_embeddings} sizes no table with rope positions: it "
            "is only the max_position_embeddings a Hugging Face export (convert_checkpoint.py to-hf) declares as "
            f"the trained length, while this run trains at --seq-length {model.seq_length}")


def dropout_layout_note(config) -> str | None:
    """The line for a sequence-parallel or pipeline run with dropout: each rank draws the masks of its
    own tokens or layers, so the run is not the single-process run to rounding, as the same layout
    with dropout 0 is, but the same in distribution."""
    model = config.model
    layout = " x ".join(f"{name} {size}" for name, size in (("pipeline", config.pipeline_parallel_size),
                                                            ("sequence-parallel", config.sequence_parallel_size))
                        if size > 1)
    if not layout or not (model.hidden_dropout or model.attention_dropout):
        return None
    return (f"note: dropout (hidden {model.hidden_dropout:g}, attention {model.attention_dropout:g}) draws its masks "
            f"per layout: this {layout} run matches the single-process run statistically, not bit for bit (with "
            "--hidden-dropout 0 --attention-dropout 0: to fp32 rounding)")


def check_vocab_room(args, tokenizer, vocab_size: int) -> None:
    """Every token id has an embedding row (check_fits), with --vocab-size named where it sets too few."""
    if args.vocab_size and tokenizer.vocab_size > vocab_size:
        raise ConfigError(f"--vocab-size {args.vocab_size} is below the {tokenizer.vocab_size} tokens of the "
                          f"tokenizer {tokenizer.file}", f"raise --vocab-size to {tokenizer.vocab_size} or more, or "
                          "drop it (the tokenizer's size is the default)")
    check_fits(tokenizer, vocab_size)


def check_sample_room(config) -> None:
    shortest = 5 if config.model.add_binary_head else 4  # [CLS] A [SEP] B [SEP] with a token each (no B: 4)
    if config.model.seq_length < shortest:
        raise ConfigError(f"--seq-length {config.model.seq_length} leaves no room for a sample's text (the "
                          f"[CLS]/[SEP] tokens and one token per segment need {shortest})",
                          f"pass --seq-length {shortest} or more (BERT uses 128 to 512)")


def pretrain(args, start_up: dict | None = None, progress: Progress | None = None) -> int | None:
    """The run: where it starts (check_start; `args` stays as given, the functions that read the start
    take the StartPlan), start-up checks, data, engine, then training from the start or a checkpoint;
    returns the signal number of an agreed stop (None: the run trained every step). `progress` is kept
    up to date for the line of a lost rank (lost_rank_problem)."""
    progress = progress or Progress()
    plan = check_start(args)
    setup = check_start_up(args, plan)
    config = setup.config
    train_iters = args.train_iters or math.ceil(args.train_samples / config.global_batch_size)
    datasets, used_maps = build_datasets(args, config, setup.data_path, setup.tokenizer, train_iters)
    schedule = Schedule.from_args(args, setup.ds, train_iters)
    engine = build_engine(config, bert_state=setup.bert_state, lr_scheduler=schedule.lambda_lr)
    if args.skip_nan_batches:
        skip_nonfinite_updates(engine)
    run = resume_or_start(args, plan, setup, engine, used_maps, schedule, progress)
    stop = StopSignals(setup.tokenizer.file, run.log, start_up)
    read_batches = batch_reader(config, stop, data_workers(args))
    train_loop(run, datasets, read_batches, stop)
    return end_run(run, datasets[2], read_batches, stop)


@dataclasses.dataclass
class StartUp:
    """What the start-up checks hand the run: check_before_rendezvous fills the first four fields,
    check_start_up the rest after the rendezvous."""
    ds: dict  # the DeepSpeed JSON
    flags: dict  # the model's BertConfig / TrainConfig field values (model_flags)
    checked: bool  # the layout was checked before the rendezvous (the launcher's WORLD_SIZE was known)
    bert_state: dict | None  # the model state the run starts from (initial_weights); None: not known yet
    config: TrainConfig | None = None
    tokenizer: object = None
    data_path: list | None = None
    origin: concurrent.futures.Future | None = None  # rank 0's weights_origin for its checkpoints (pending_origin)


def check_start_up(args, plan: StartPlan) -> StartUp:
    """Everything a run checks before its data and engine, each mistake one line before any work it
    would waste: the flags at the launcher's world size, then the rendezvous, the output folders, the
    tokenizer and the resolved config with its notes."""
    note = launch_environment()
    determinism.configure(args.deterministic)
    torch.manual_seed(args.seed)  # the heads an HF folder lacks are initialised below
    setup = check_before_rendezvous(args, plan)
    join_process_group(args, note)
    if args.save:
        checkpoint.check_writable(args.save)  # before any work that a failed first save would lose
    check_log_dirs(args)
    setup.data_path, setup.tokenizer = data_paths(args, plan)
    setup.flags["vocab_size"] = setup.flags["vocab_size"] or setup.tokenizer.vocab_size
    setup.config = resolve(setup.flags, setup.ds, dist.get_world_size(), deepspeed_check=not setup.checked)
    check_model_fits(args, setup.config, setup.ds, setup.tokenizer)
    if setup.bert_state is None:
        setup.bert_state = initial_weights(args, plan, setup.config)
    return setup


def check_before_rendezvous(args, plan: StartPlan) -> StartUp:
    """One validation pass before any work (rendezvous, data, model): the JSON, the optimizer, the model
    and layout at the launcher's world size, with a stand-in vocab size where the vocab file decides
    it; the weights the run starts from (an HF folder's missing tensor) where the vocab is known."""
    ds = deepspeed_settings(args)
    check_precision_supported(ds)  # fp16 on a CPU without its kernels: before the rendezvous and the data
    flags = model_flags(args, ds, plan)
    origin = pending_origin(plan, args.save)  # the starting weights' hash, after the checks above: a mistake
    world = os.environ.get("WORLD_SIZE", "")  # is one line before it
    checked, bert_state = world.isdigit(), None
    if checked:  # else (MPI, AzureML discovery) at the resolve after the rendezvous, still before the data
        config = resolve({**flags, "vocab_size": flags["vocab_size"] or BertConfig.vocab_size}, ds, int(world))
        check_sample_room(config)
        if flags["vocab_size"]:  # the run's config is this one
            bert_state = initial_weights(args, plan, config)
    return StartUp(ds, flags, checked, bert_state, origin=origin)


def join_process_group(args, note: str | None) -> None:
    """The rendezvous of every rank, on the device each uses; rank 0 then prints the launcher `note`
    (launch_environment). Left-over JIT build locks go first: DeepSpeed's ops build during it."""
    if local_rank() == 0:  # before DeepSpeed's ops build (or wait on a killed build's lock)
        for line in jit_locks.clear_left_over():
            print(line, file=sys.stderr, flush=True)
    device.select_device()  # cuda:LOCAL_RANK before NCCL starts (parallel/device.py)
    device.init_distributed(rendezvous_timeout=args.rendezvous_timeout,  # and the /dev/shm names DeepSpeed leaves
                            collective_timeout=timedelta(minutes=args.distributed_timeout_minutes))
    if note and dist.get_rank() == 0:
        print(note, flush=True)


def check_model_fits(args, config, ds: dict, tokenizer) -> None:
    """The resolved model against this machine and the tokenizer (head size of the CUDA kernels, a row
    per token id, room for a sample), with rank 0's notes on the settings it reads differently than a
    user may expect."""
    if torch.cuda.is_available() and config.model.attention != "linformer":  # linformer: torch's F.sdpa picks
        blocks.check_cuda_head_dim(config.model.head_dim, precision(ds), torch.cuda.get_device_capability())
    check_vocab_room(args, tokenizer, config.model.vocab_size)
    for note in (rope_positions_note(args, config.model), dropout_layout_note(config),
                 *model_notes(config.model, window_given=args.local_attention_window is not None)):
        if note and dist.get_rank() == 0:
            print(note, flush=True)
    if tokenizer.vocab_size < config.model.vocab_size and dist.get_rank() == 0:  # rows that are never a token
        source = f"--vocab-size {args.vocab_size}" if args.vocab_size else "the weights the run starts from"
        print(f"warning: the model's vocab_size {config.model.vocab_size} ({source}) exceeds the tokenizer's "
              f"{tokenizer.vocab_size} tokens: {config.model.vocab_size - tokenizer.vocab_size} embedding rows no "
              "token reaches", file=sys.stderr, flush=True)
    check_sample_room(config)


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
    small = small_eval_splits({name: (stats[name], split_tokens(dataset)) for name, dataset in (
        ("valid", valid_set), ("test", test_set)) if dataset is not None}, config.micro_batch_size)
    small = with_eval_passes(small, stats, args.eval_iters * config.global_batch_size)
    for warning in [*data_warnings(args, data_path, valid_set, train_iters), *filter(None, [small])]:
        print(f"warning: {warning}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Run:
    """What the training loop and the run's end share: the run's parts (pretrain builds them once)
    and how far it is, which the loop advances."""
    args: argparse.Namespace  # the flags as given
    plan: StartPlan  # where the run started (check_start)
    engine: object  # DeepSpeed's engine (PipelineEngine with a pipeline)
    config: TrainConfig
    log: RunLog
    saved: dict  # what each checkpoint records besides the engine (save_checkpoint's state)
    progress: Progress
    train_iters: int
    first_iteration: int = 0  # where this process started: the loaded checkpoint's iteration, else 0
    iteration: int = 0
    consumed: int = 0  # samples
    last_checkpoint: str | None = None  # the newest complete one: the loaded one, then each saved


def resume_or_start(args, plan: StartPlan, setup: StartUp, engine, used_maps: list, schedule: Schedule,
                    progress: Progress) -> Run:
    """The engine restored from --load (a resume), else the run's start (scratch or starting weights);
    opens the run log, which says which, and rank 0 warns of what a resume changes. The checkpoints
    record what the run started from: a resume's, else rank 0's setup.origin, taken here."""
    config, train_iters = setup.config, schedule.train_iters
    client = checkpoint.load(engine, plan.load, config, load_rng=not args.no_load_rng) if plan.resume else None
    if client:  # every rank loaded before rank 0 says so: a rank whose load failed says why, and the
        dist.barrier()  # others, lost here, print nothing that reads like a resume (config:, resuming from)
    saved = dict(schedule=schedule.record(), data=data_settings(args, setup.data_path),
                 tokenizer=setup.tokenizer, origin=client.get(checkpoint.ORIGIN) if client else  # rank 0 writes it
                 setup.origin and setup.origin.result())
    optimizer_change = resume_optimizer(engine, config, args) if client else None  # before config.json records it
    log = RunLog(args, config, train_iters)  # after the load: a checkpoint that fails to load leaves no log
    log.config(config)
    if dist.get_rank() == 0:
        index_maps.write_used(args.log_dir, used_maps)  # what tools/clean_index_maps.py --keep-run keeps
    run = Run(args, plan, engine, config, log, saved, progress, train_iters)
    if not client:
        source = plan.source and plan.source[0]
        log.start(0, f"starting from the weights of {source}" if source else "starting from scratch",
                  weights_from=source)
        return run
    run.first_iteration = run.iteration = client["iteration"]
    run.consumed = client["consumed_samples"]
    run.last_checkpoint = progress.last_checkpoint = os.path.join(plan.load, checkpoint.tag_for(run.iteration))
    log.start(run.iteration, f"resuming from {run.last_checkpoint} iteration {run.iteration}, consumed samples "
                             f"{run.consumed}", resumed_from=run.last_checkpoint)
    for warning in (*resume_changes(run, client), optimizer_change):
        if warning and dist.get_rank() == 0:
            print(warning, file=sys.stderr, flush=True)
    if run.iteration >= train_iters:  # a finished run started again (a rerun of the same command)
        log.message(nothing_to_train(args, run.iteration, train_iters))
    return run


def resume_changes(run: Run, client: dict) -> list:
    """The warnings (None: no change) for what a resume changes against its checkpoint (`client`): the
    LR schedule, the samples and batch, the data, the attention."""
    change = checkpoint_compat.attention_change(f"checkpoint {run.plan.load}", client["config"]["model"],
                                                vars(run.config.model))
    return [resume_schedule(run.engine, client.get("schedule"), Schedule.from_record(run.saved["schedule"]),
                            run.iteration),
            describe_sample_change(client["config"], run.config, run.consumed),
            describe_batch_change(client["config"], run.config, run.iteration, run.train_iters),
            describe_data_change(client.get("data"), run.saved["data"], run.consumed),
            change and f"warning: {change}"]


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


def train_loop(run: Run, datasets: tuple, read_batches, stop: "StopSignals") -> None:
    """The steps from run.iteration to run.train_iters, with the validation and the saves the flags ask
    for; it ends early once the ranks agree to stop (stop.agreed). The train batches' workers end with
    it, before the stop's save."""
    train_set, valid_set, _ = datasets
    with contextlib.closing(read_batches(train_set, run.consumed, run.train_iters - run.iteration)) as train_batches:
        stop.install()
        train_steps(run, valid_set, train_batches, read_batches, stop)


def train_steps(run: Run, valid_set, train_batches, read_batches, stop: "StopSignals") -> None:
    """train_loop's steps, reading `train_batches`."""
    args, engine, log, progress = run.args, run.engine, run.log, run.progress
    while run.iteration < run.train_iters:
        progress.phase = f"the step of iteration {run.iteration + 1}"
        start = time.perf_counter()
        step_batches = next(train_batches)
        if stop.agreed:
            break
        set_attention_iteration(engine, run.iteration)
        lr = engine.get_lr()[0]  # the rate of this step: DeepSpeed steps the scheduler after it
        result = train_step(engine, step_batches)
        run.iteration += 1
        run.consumed += run.config.global_batch_size
        log.step(run.iteration, run.consumed, result, engine, time.perf_counter() - start, lr)
        check_step(args, engine, run.iteration, result.loss, run.last_checkpoint, log)
        if valid_set is not None and run.iteration % args.eval_interval == 0:
            progress.phase = f"the evaluation after iteration {run.iteration}"
            loss = evaluate(read_batches, engine, valid_set, run.iteration // args.eval_interval - 1, args.eval_iters,
                            stop)
            if stop.agreed:
                break
            log.evaluation("validation", run.iteration, loss)
        if args.save and (run.iteration == run.train_iters
                          or (args.save_interval and run.iteration % args.save_interval == 0)):
            progress.phase = f"the checkpoint save of iteration {run.iteration}"
            run.last_checkpoint = save_checkpoint(args, engine, run.config, run.iteration, run.consumed, log,
                                                  **run.saved)
            progress.last_checkpoint = run.last_checkpoint


def end_run(run: Run, test_set, read_batches, stop: "StopSignals") -> int | None:
    """The test loss of a run that was not stopped, then the stop's save and line (its signal number
    returned) or the end of a complete run."""
    if test_set is not None and not stop.agreed:
        run.progress.phase = f"the test evaluation after iteration {run.iteration}"
        loss = evaluate(read_batches, run.engine, test_set, 0, run.args.eval_iters, stop)
        if not stop.agreed:
            run.log.evaluation("test", run.iteration, loss)
    if stop.agreed:
        run.progress.phase = f"the stop after iteration {run.iteration}"
        return stop.finish(run.args, run.iteration, run.first_iteration, run.last_checkpoint, run.log,
                           lambda: save_checkpoint(run.args, run.engine, run.config, run.iteration, run.consumed,
                                                   run.log, **run.saved),
                           test_cut=test_set is not None and run.iteration == run.train_iters)
    run.progress.phase = END_OF_RUN
    stop.complete(run.args, run.iteration, run.last_checkpoint, run.log)
    return None


def save_checkpoint(args, engine, config, iteration: int, consumed: int, log, **state) -> str:
    """checkpoint.save into --save (`state`: schedule, data, tokenizer, origin); returns its folder. Timed: the
    log line says how long it took, which a stop's acknowledgement compares with a launcher's grace."""
    start = time.monotonic()
    folder = os.path.join(args.save, checkpoint.save(engine, config, args.save, iteration, consumed,
                                                     keep_last=args.keep_last, **state))
    log.saved(folder, time.monotonic() - start)
    return folder


def data_warnings(args, data_path: list, valid_set, train_iters: int) -> list:
    """What the data flags leave out without being wrong: a blended prefix of weight 0, and a run
    that asks for evaluation with no validation documents."""
    notes = [f"--data-path weight 0 for {prefix}: none of its samples are read"
             for weight, prefix in zip(*parse_data_path(data_path)) if weight == 0]
    if valid_set is None and args.eval_interval <= train_iters:
        shares = split_weights(args.split)
        fix = ("pass a larger validation share of --split, or a larger corpus" if len(shares) > 1 and shares[1]
               else "pass a --split with a validation share, e.g. --split 949,50,1")
        notes.append(f"--split {args.split} leaves no validation documents: the evaluation every --eval-interval "
                     f"{args.eval_interval} steps is skipped; {fix}")
    return notes


def small_eval_splits(splits: dict, micro_batch: int) -> str | None:
    """The warning for the evaluation splits ({valid / test: (TokenStats, split_tokens)}) whose documents
    hold fewer tokens than one micro-batch of samples: their samples repeat those few tokens, epoch
    after epoch, among padding, so their losses are measured on them alone. One line for both."""
    seq_length = next(iter(splits.values()))[0].seq_length if splits else 0
    small = [f"{name} {tokens} tokens in {stats.samples} samples ({1 - stats.real_token_share:.0%} padding)"
             for name, (stats, tokens) in splits.items() if tokens < micro_batch * seq_length]
    if not small:
        return None
    return (f"evaluation data smaller than one micro-batch of samples ({micro_batch} x {seq_length} tokens): "
            f"{', '.join(small)}: each loss is measured on these few tokens, repeated; give the split more "
            "documents (a larger share of --split, or a larger corpus) or pass a shorter --seq-length")


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
    return dict(masked_lm_prob=args.mask_prob, seed=args.seed, binary_head=config.model.add_binary_head,
                whole_word_masking=args.whole_word_masking, pack_samples=config.pack_samples,
                max_segment_length=config.model.max_segment_length)


def starting_weights_fields(plan: StartPlan) -> dict:
    """The BertConfig fields of the weights a run starts from (--init-from-hf, a weights-only --load)
    or resumes (--load), read once."""
    if plan.init_from_hf:
        return hf_convert.bert_fields_from_hf(hf_io.read_hf_config(plan.init_from_hf))
    if plan.load:
        return checkpoint.stored_config(plan.load, checkpoint.latest_tag(plan.load))["model"]
    return {}


def initial_model_fields(fields: dict, resume: bool = False) -> dict:
    """Of the starting weights' fields (starting_weights_fields): the sizes and layout, which the flags
    may restate but not change; for a modern model (a ModernBERT folder) also its layer rule (rope
    thetas, window, global period), head and vocab padding, which the flags may change, the global
    period aside (config.refuse_contradictions). A resume takes the layer rule of any model: it keeps
    the whole model (checkpoint_compat.check_same_model), which the user then need not restate."""
    if not fields:
        return {}
    # the vocab padding and the sentence-order head: the layer rule's (hf_modernbert.layer_rule_fields)
    shaping = tuple(name for name in weights_fixed() if name not in ("make_vocab_size_divisible_by", "add_binary_head"))
    rule = hf_modernbert.layer_rule_fields(fields) if resume else hf_modernbert.carried_fields(fields)
    return {**{field: fields[field] for field in shaping if field in fields}, **rule}


def initial_weights(args, plan: StartPlan, config) -> dict | None:
    """BertModel state to start from (None: fresh init, or a full checkpoint that --load restores,
    whose model is checked here, before the data's index maps are built).
    Weights of another attention variant (a weights-only --load, --finetune) start the run as
    --init-from-hf does: Linformer's projections they lack initialised, those this run lacks dropped
    (check_model_shapes); a line names what is initialised, and one says when the weights were trained
    here with attention of other math, other BigBird blocks or other local layers (attention_change),
    or elsewhere (an HF folder, a from-hf checkpoint) with every layer global (local_layers_added)."""
    if plan.init_from_hf:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state = hf_convert.load_hf_as_bert_state(plan.init_from_hf, config.model,
                                                     extend_positions=not args.no_position_extension)
        notes = [str(warning.message) for warning in caught] + [checkpoint_compat.local_layers_added(
            f"the Hugging Face folder {plan.init_from_hf}", starting_weights_fields(plan), config.model)]
        print_warnings(notes)
        return state
    if not plan.load:
        return None
    load = plan.load
    tag = checkpoint.latest_tag(load)
    run_state = checkpoint.run_state(load, tag)
    stored = run_state["config"]["model"]
    if plan.resume:
        checkpoint_compat.check_same_model(stored, config.model, checkpoint.checkpoint_folder(load, tag))
        return None
    padding = {"make_vocab_size_divisible_by": config.model.make_vocab_size_divisible_by}  # the run's: padded again
    fresh, dropped = checkpoint_compat.check_model_shapes({**stored, **padding}, config.model,
                                                          os.path.join(load, tag), start=True)
    state = hf_convert.repadded_vocab(checkpoint.bert_state_from_checkpoint(load, tag), config.model)
    checkpoint.refuse_non_finite(state, f"checkpoint {os.path.join(load, tag)}",
                                 "start from another checkpoint (an earlier one of the run that wrote it)")
    for name in dropped:
        del state[name]
    notes = [checkpoint_compat.local_layers_added(f"checkpoint {load}", stored, config.model)
             if run_state.get("weights_only")  # from-hf: as --init-from-hf; else trained here
             else checkpoint_compat.attention_change(f"checkpoint {load}", stored, vars(config.model))]
    if fresh:  # as --init-from-hf initialises them (hf_convert.completed)
        state.update({name: tensor for name, tensor in BertModel(config.model).state_dict().items()
                      if name in fresh})
        notes.append(f"not in checkpoint {load}, initialised: {', '.join(fresh)}")
    print_warnings(notes)
    return state


def print_warnings(notes: list) -> None:
    """One `warning:` line per note (None: none) from the first rank, also before the process group exists."""
    if launcher_rank() == 0:
        for note in filter(None, notes):
            print(f"warning: {note}", file=sys.stderr, flush=True)


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
    if last_checkpoint:  # a resume keeps the checkpoint's peak --lr (resume_schedule): --finetune
        # restarts the optimizer and schedule from its weights, in another --save (check_save_dir)
        where = (f"the last good checkpoint is {last_checkpoint}: start a new run from its weights with a lower "
                 f"rate (--finetune --load {os.path.dirname(last_checkpoint)} --lr LOWER --save ANOTHER_DIR; a "
                 "resume keeps the checkpoint's peak --lr)")
    elif not args.save:
        where = "no checkpoint was saved before it: rerun with --save and --save-interval (e.g. with a lower --lr)"
    else:  # --save is set: a save before the step is what it lacked (none at the first step)
        where = "no checkpoint was saved before it: rerun" + (f" with a --save-interval below {iteration}"
                                                              if iteration > 1 else "") + " (e.g. with a lower --lr)"
    raise ConfigError(f"loss is {loss} at iteration {iteration}",
                      f"{where}, or pass --skip-nan-batches to skip such steps")


def evaluate(batches, engine, dataset, run: int, eval_iters: int, stop: StopSignals) -> float | None:
    """Mean loss over `eval_iters` steps; validation run k reads the k-th slice of the set. None
    when a stop is agreed (every rank at the same step): a scheduler's grace period goes to the
    final checkpoint, not to the rest of the evaluation."""
    per_run = eval_iters * engine.train_batch_size()
    start = min(run * per_run, max(0, len(dataset) - per_run))
    losses = []
    with contextlib.closing(batches(dataset, start, eval_iters)) as steps:
        for step in steps:
            if stop.agreed:
                return None
            losses.append(eval_step(engine, step))
    return sum(losses) / len(losses)


def set_attention_iteration(engine, iteration: int) -> None:
    """BigBird draws its random blocks per (seed, iteration, layer); other variants ignore it."""
    from megatron.model.attention.bigbird import set_iteration

    set_iteration(engine.module, iteration)
