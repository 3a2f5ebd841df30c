"""The pretraining run, top to bottom: the start-up checks, config, engine, the train/eval loop,
checkpoints and logs. Its parts live beside it: flag_checks (the flags alone), start_plan (where
the run starts), starting_weights (what the weights it starts from give it), run_data (tokenizer
and data).

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
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from megatron import checkpoint, checkpoint_compat, checkpoint_save, determinism, locks, monitors, paths
from megatron.arguments import build_parser
from megatron.config import TrainConfig, model_notes, read_ds_config, resolve
from megatron.data import index_maps
from megatron.data.bert_dataset import parse_data_path
from megatron.data.preprocess import FIRST_LOG_SECONDS, LOG_SECONDS, duration_text
from megatron.data.tokenizer import check_fits
from megatron.ds_schema import (OPTIMIZER_DEFAULTS, default_optimizer, expand_home_paths, json_notes,
                                optimizer_params_taken, precision)
from megatron.engine import build_engine, check_precision_supported, eval_step, skip_nonfinite_updates, train_step
from megatron.errors import (WHERE_FIX, ConfigError, Interrupted, cannot_use, ignore_signals, raise_on_signals,
                             restore_signals, stopped_during_start_up)
from megatron.flag_checks import check_flag_combinations, check_flags
from megatron.loss_watch import LossWatch
from megatron.model.args import BertConfig
from megatron.model.attention import blocks
from megatron.parallel import device, peers, same_settings
from megatron.parallel.launch_check import launch_environment
from megatron.parallel.launch_env import launcher_rank
from megatron.parallel.peers import lost_rank_text, report_once
from megatron.relaunch import new_run_fix, resume_fix
from megatron.resume import (data_settings, describe_batch_change, describe_data_change, describe_sample_change,
                             describe_step_change, fresh_run_fix, kept_regime, peak_given, peak_in_use,
                             refuse_data_change, resume_optimizer, resume_schedule, run_length, unrecorded_note,
                             unsaved_note)
from megatron.run_data import batch_reader, build_datasets, data_paths, data_workers
from megatron.run_log import (MovedLogDir, RunLog, free_log_dir, logged_save, logs_record, metrics_problem,
                              shared_log_dir_warning, split_logs_warning, tensorboard_problem)
from megatron.schedule import Schedule
from megatron.start_plan import StartPlan, check_start, pending_origin
from megatron.starting_weights import initial_weights, model_flags
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
        args.log_dir = free_log_dir(args.log_dir, logged_save(args))  # the default runs/bert, or runs/bert-N
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
    report_once(f"pretrain_bert.py: error: {problem}", by_rank_0=getattr(error, "by_rank_0", False))
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
        return ConfigError(problem, f"the last checkpoint is {progress.last_checkpoint}: "
                                    f"{resume_fix(args, os.path.dirname(progress.last_checkpoint))}{raise_it}")
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


def check_log_dirs(args, ds: dict, resumes: bool = False) -> None:
    """--log-dir and --tensorboard-dir (and the tensorboard package), and the monitors the DeepSpeed JSON
    `ds` enables (their packages and folders), which rank 0 alone writes (RunLog, DeepSpeed), checked there
    before any work, and --log-dir's lock taken (one run at a time logs there, as one saves into a --save
    folder); every rank raises rank 0's error, so none goes on training while rank 0 stops. A new run (not
    `resumes`) is warned of chart folders that hold another run's files."""
    found = [None]
    if dist.get_rank() == 0:
        dirs = [("--log-dir", args.log_dir), ("--tensorboard-dir", args.tensorboard_dir)]
        problems = (*(paths.folder_problem(flag, path) for flag, path in dirs if path),
                    tensorboard_problem() if args.tensorboard_dir else None,
                    args.log_dir and metrics_problem(args.log_dir),
                    monitors.monitor_problem(ds, args.deepspeed_config))
        found = [next(filter(None, problems), None)]
        if found[0] is None and args.log_dir:
            found = [lock_log_dir(args.log_dir)]
            for _ in range(3):  # a default log dir another run locked after free_log_dir chose it: the next free one
                if not (found[0] and (args.log_dir is paths.DEFAULT_LOG_DIR or isinstance(args.log_dir, MovedLogDir))):
                    break
                args.log_dir = free_log_dir(paths.DEFAULT_LOG_DIR, logged_save(args))
                found = [lock_log_dir(args.log_dir)]
        shared = found[0] is None and args.log_dir and shared_log_dir_warning(args.log_dir, args.save, args.load,
                                                                              args.finetune)
        reused = found[0] is None and not resumes and monitors.reused_folders_warning(args.tensorboard_dir, ds)
        for warning in filter(None, (shared, reused)):
            print(warning, file=sys.stderr, flush=True)
    dist.broadcast_object_list(found, src=0)
    if found[0]:
        raise ConfigError(*found[0])


def lock_log_dir(log_dir: str) -> tuple[str, str] | None:
    """Takes --log-dir's lock (locks.take_lock), making the folder for it (removed again at the
    release when the run left it empty); (problem, fix) when a live run logs there."""
    created = paths.missing_folders(log_dir)
    os.makedirs(log_dir, exist_ok=True)
    return locks.take_lock(log_dir, created, "--log-dir", locks.LOG_LOCK)


def run_iterations(args, global_batch_size: int) -> int:
    """The run's length in steps: --train-iters, or --train-samples in global batches (the last one whole)."""
    return args.train_iters or math.ceil(args.train_samples / global_batch_size)


def finished_resume(args, plan, global_batch_size: int, ended_only: bool = False) -> str | None:
    """The nothing_to_train line of a resume whose checkpoint has reached the run's length (None: it
    trains): for a checkpoint whose run ended there (checkpoint.RUN_ENDED) the line the trainer exits 0
    with (ended_run), else the one of a run whose final losses it computes again; `ended_only`: None for
    the latter. Tools that launch the trainer say it before they spend a launch on it."""
    if not plan.resume:
        return None
    tag = checkpoint.latest_tag(plan.load)
    iteration, train_iters = checkpoint.tag_iteration(tag), run_iterations(args, global_batch_size)
    if iteration < train_iters:
        return None
    ended = checkpoint.run_state(plan.load, tag).get(checkpoint.RUN_ENDED)
    if ended_only and not ended:
        return None
    return nothing_to_train(args, iteration, train_iters, ended and checkpoint.checkpoint_folder(plan.load, tag))


def nothing_to_train(args, iteration: int, train_iters: int, ended: str | None = None) -> str:
    """The line of a finished run started again, naming the run-length flag that was given. `ended`: the
    checkpoint, whose run ended there (ended_run): nothing is evaluated again either."""
    flag, length = (("--train-iters", f"--train-iters {train_iters}") if args.train_iters else
                    ("--train-samples", f"{train_iters} (--train-samples {args.train_samples})"))
    where = (f"the run of checkpoint {ended} is finished already at iteration {iteration} of {length}" if ended else
             f"the checkpoint is at iteration {iteration} of {length}")
    return f"nothing to train: {where}; pass a larger {flag} to train on"


def ended_run(args, plan, global_batch_size: int) -> str | None:
    """The one line of a resume whose checkpoint is at the run's length and whose run ended there, its final
    losses logged (checkpoint.RUN_ENDED): it has nothing to train or evaluate and exits 0 at once. None: it
    trains, or evaluates a checkpoint whose final evaluation never ran (a stop or a lost rank cut it; an
    older checkpoint). Rank 0 reads the checkpoint, every rank gets its answer."""
    if not plan.resume:
        return None
    line = [None]
    # a checkpoint rank 0 cannot read here is refused by the load, on every rank, in one line
    with contextlib.suppress(ConfigError, OSError):
        if dist.get_rank() == 0:
            line = [finished_resume(args, plan, global_batch_size, ended_only=True)]
    dist.broadcast_object_list(line, src=0)
    return line[0]


def train_samples_note(train_samples: int, global_batch: int) -> str:
    """The line for a --train-samples that is no whole number of global batches: the run rounds the steps up,
    reading every sample asked for and a few more (Megatron-LM rounds down, and trains no step below one
    batch)."""
    steps = math.ceil(train_samples / global_batch)
    return (f"note: --train-samples {train_samples} is {train_samples / global_batch:g} global batches of "
            f"{global_batch}: the run trains {steps} steps ({steps * global_batch} samples)")


def deepspeed_settings(args, cuda: bool | None = None) -> dict:
    """The JSON (if any) with the optimizer the flags describe filled in (--clip-grad: config.resolve):
    flags given on the command line win, the JSON fills the rest, then the defaults. `cuda`: whether the
    run's machines have GPUs (default: this one's; given, as azureml/submit.py checks a job for
    other machines, this one's FusedAdam build is not probed)."""
    ds = expand_home_paths(read_ds_config(args.deepspeed_config)) if args.deepspeed_config else {}
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
    if isinstance(ds.get("comms_logger"), dict) and ds["comms_logger"].get("enabled") is not True:
        del ds["comms_logger"]  # DeepSpeed 0.19.8 times every collective whenever the section is there
    ds.setdefault("steps_per_print", 10**9)  # the run log prints progress
    return ds


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


def start_notes(args, config, plan: StartPlan) -> list:
    """The start-up notes on the resolved model and layout (rank 0 prints them once the run has its
    tokenizer): rope positions, dropout per layout, and model_notes (a model to-hf would refuse, local
    layers that are not local). extend_context.py's --dry-run prints them too, as the launch would."""
    weights_from = plan.load if plan.resume else plan.source and plan.source[0]
    return [note for note in (rope_positions_note(args, config.model), dropout_layout_note(config),
                              *model_notes(config.model, window_given=args.local_attention_window is not None,
                                           weights_from=weights_from))
            if note]


def check_vocab_room(args, tokenizer, vocab_size: int) -> None:
    """Every token id has an embedding row (check_fits), with --vocab-size named where it sets too few."""
    if args.vocab_size and tokenizer.vocab_size > vocab_size:
        raise ConfigError(f"--vocab-size {args.vocab_size} is below the {tokenizer.vocab_size} tokens of the "
                          f"tokenizer {tokenizer.file}", f"raise --vocab-size to {tokenizer.vocab_size} or more, or "
                          "drop it (the tokenizer's size is the default)")
    check_fits(tokenizer, vocab_size)


def check_resolved(args, config, ds: dict) -> Schedule:
    """The resolved config against the flags beyond the model: room for a sample, and the LR schedule's
    flags against the run's length in steps (--train-samples in this layout's global batches:
    Schedule's checks, from the flags alone). The trainer's before its rendezvous, and the launch checks of
    extend_context.py and azureml/submit.py, so that a dry run that passes gets past start-up."""
    check_sample_room(config)
    return Schedule.from_args(args, ds, run_iterations(args, config.global_batch_size))


def check_sample_room(config) -> None:
    shortest = 5 if config.model.add_binary_head else 4  # [CLS] A [SEP] B [SEP] with a token each (no B: 4)
    if config.model.seq_length < shortest:
        raise ConfigError(f"--seq-length {config.model.seq_length} leaves no room for a sample's text (the "
                          f"[CLS]/[SEP] tokens and one token per segment need {shortest})",
                          f"pass --seq-length {shortest} or more (BERT uses 128 to 512)")


def pretrain(args, start_up: dict | None = None, progress: Progress | None = None) -> int | None:
    """The run: where it starts (check_start; `args` stays as given, the functions that read the start
    take the StartPlan), start-up checks, data, engine, then training from the start or a checkpoint;
    returns the signal number of an agreed stop (None: the run trained every step, or stopped at
    --exit-duration-in-mins). `progress` is kept up to date for the line of a lost rank (lost_rank_problem)."""
    started = time.monotonic()  # what --exit-duration-in-mins counts from
    progress = progress or Progress()
    plan = check_start(args)
    setup = check_start_up(args, plan)
    config = setup.config
    ended = ended_run(args, plan, config.global_batch_size)
    if ended:  # before the data and the engine: nothing of them is used
        if dist.get_rank() == 0:
            print(ended, flush=True)
        return None
    train_iters = run_iterations(args, config.global_batch_size)
    if args.train_samples and args.train_samples % config.global_batch_size and dist.get_rank() == 0:
        print(train_samples_note(args.train_samples, config.global_batch_size), flush=True)
    schedule = Schedule.from_args(args, setup.ds, train_iters)  # checked against the run length before any map
    datasets, used_maps = build_datasets(args, config, setup.data_path, setup.tokenizer, train_iters)
    build_note = device.cpu_optimizer_build_note(setup.ds)
    if build_note and dist.get_rank() == 0:
        print(build_note, flush=True)
    engine = build_engine(config, bert_state=setup.bert_state, lr_scheduler=schedule.lambda_lr)
    if args.skip_nan_batches:
        skip_nonfinite_updates(engine)
    run = resume_or_start(args, plan, setup, engine, used_maps, schedule, progress)
    stop = StopSignals(setup.tokenizer.file, run.log, start_up,
                       time_limit=args.exit_duration_in_mins and (args.exit_duration_in_mins, started))
    read_batches = batch_reader(config, stop, data_workers(args))
    train_loop(run, datasets, read_batches, stop)
    return end_run(run, datasets, read_batches, stop)


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
    join_process_group(args, note, setup.ds)
    if args.save:
        checkpoint_save.check_writable(args.save)  # before any work that a failed first save would lose
    check_log_dirs(args, setup.ds, resumes=plan.resume)
    setup.data_path, setup.tokenizer = data_paths(args, plan, setup.flags["vocab_size"])
    if plan.resume:  # another run's checkpoint, or this one's on other data: before the index maps are built
        refuse_data_change(checkpoint.run_state(plan.load, checkpoint.latest_tag(plan.load)).get("data"),
                           data_settings(args, setup.data_path), plan.load, args.override_data_settings)
    if setup.flags["vocab_size"] is None:  # --vocab-size 0 is refused (BertConfig), not taken for "not given"
        setup.flags["vocab_size"] = setup.tokenizer.vocab_size
    setup.config = resolve(setup.flags, setup.ds, dist.get_world_size(), deepspeed_check=not setup.checked,
                           json_given=bool(args.deepspeed_config), weights_given=plan.weights)
    check_model_fits(args, plan, setup.config, setup.ds, setup.tokenizer)
    if setup.bert_state is None:
        setup.bert_state = initial_weights(args, plan, setup.config)
    return setup


def check_before_rendezvous(args, plan: StartPlan) -> StartUp:
    """One validation pass before any work (rendezvous, data, model): the JSON, the optimizer, the model
    and layout at the launcher's world size, with a stand-in vocab size where the vocab file decides
    it; the weights the run starts from (an HF folder's missing tensor) where the vocab is known."""
    ds = deepspeed_settings(args)
    check_precision_supported(ds)  # fp16 on a CPU without its kernels: before the rendezvous and the data
    user_json = read_ds_config(args.deepspeed_config) if args.deepspeed_config else {}  # not what the trainer fills
    for note in json_notes(user_json, args.log_interval) if launcher_rank() == 0 else ():  # the run's start only
        print(note, flush=True)
    flags = model_flags(args, ds, plan)
    origin = pending_origin(plan, args.save)  # the starting weights' hash, after the checks above: a mistake
    world = os.environ.get("WORLD_SIZE", "")  # is one line before it
    checked, bert_state = world.isdigit(), None
    if checked:  # else (MPI, AzureML discovery) at the resolve after the rendezvous, still before the data
        stand_in = BertConfig.vocab_size if flags["vocab_size"] is None else flags["vocab_size"]
        config = resolve({**flags, "vocab_size": stand_in}, ds, int(world),
                         json_given=bool(args.deepspeed_config), weights_given=plan.weights)
        check_resolved(args, config, ds)
        if flags["vocab_size"] is not None:  # the run's config is this one
            bert_state = initial_weights(args, plan, config)
    return StartUp(ds, flags, checked, bert_state, origin=origin)


def join_process_group(args, note: str | None, ds: dict) -> None:
    """The rendezvous of every rank, on the device each uses (init_distributed names left-over JIT build
    locks first: DeepSpeed's ops build during it), then every rank's flags and DeepSpeed JSON `ds` compared
    with rank 0's before any other collective (a node launched otherwise); rank 0 then prints the launcher
    `note` (launch_environment)."""
    device.select_device()  # cuda:LOCAL_RANK before NCCL starts (parallel/device.py)
    device.init_distributed(rendezvous_timeout=args.rendezvous_timeout,  # and the /dev/shm names DeepSpeed leaves
                            collective_timeout=timedelta(minutes=args.distributed_timeout_minutes))
    same_settings.check_same_settings(same_settings.launch_settings(args, ds),
                                      lambda: same_settings.flag_names(build_parser()))
    if note and dist.get_rank() == 0:
        print(note, flush=True)


def check_model_fits(args, plan: StartPlan, config, ds: dict, tokenizer) -> None:
    """The resolved model against this machine and the tokenizer (head size of the CUDA kernels, a row
    per token id, room for a sample), with rank 0's notes on the settings it reads differently than a
    user may expect."""
    if torch.cuda.is_available() and config.model.attention != "linformer":  # linformer: torch's F.sdpa picks
        blocks.check_cuda_head_dim(config.model.head_dim, precision(ds), torch.cuda.get_device_capability())
    check_vocab_room(args, tokenizer, config.model.vocab_size)
    for note in start_notes(args, config, plan):
        if dist.get_rank() == 0:
            print(note, flush=True)
    if tokenizer.vocab_size < config.model.vocab_size and dist.get_rank() == 0:  # rows that are never a token
        source = f"--vocab-size {args.vocab_size}" if args.vocab_size else "the weights the run starts from"
        print(f"warning: the model's vocab_size {config.model.vocab_size} ({source}) exceeds the tokenizer's "
              f"{tokenizer.vocab_size} tokens: {config.model.vocab_size - tokenizer.vocab_size} embedding rows no "
              "token reaches", file=sys.stderr, flush=True)
    check_sample_room(config)


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
    validated: int | None = None  # the iteration whose validation loss train_steps logged last (a stop cuts one)
    # the validation after `iteration` was cut short by a stop: the stop's checkpoint records it
    # (checkpoint.VALIDATION_CUT), and a resume computes it before its first step, with the same weights
    validation_cut: bool = False
    watch: LossWatch = dataclasses.field(default_factory=LossWatch)  # the loss, and each checkpoint's


def resume_or_start(args, plan: StartPlan, setup: StartUp, engine, used_maps: list, schedule: Schedule,
                    progress: Progress) -> Run:
    """The engine restored from --load (a resume), else the run's start (scratch or starting weights);
    opens the run log, which says which, and rank 0 warns of what a resume changes. The checkpoints
    record what the run started from: a resume's, else rank 0's setup.origin, taken here."""
    config, train_iters = setup.config, schedule.train_iters
    client = checkpoint.load(engine, plan.load, config, load_rng=not args.no_load_rng) if plan.resume else None
    if not client or args.no_load_rng:  # else the checkpoint's RNG states go on
        determinism.seed_dropout(args.seed)
    if client:  # every rank loaded before rank 0 says so: a rank whose load failed says why, and the
        dist.barrier()  # others, lost here, print nothing that reads like a resume (config:, resuming from)
    saved = dict(schedule=peak_in_use(engine, schedule.record()) if client else schedule.record(),
                 data=data_settings(args, setup.data_path), logs=logs_record(args),
                 tokenizer=setup.tokenizer, origin=client.get(checkpoint.ORIGIN) if client else  # rank 0 writes it
                 setup.origin and setup.origin.result())
    # before config.json records the optimizer settings
    optimizer_change = resume_optimizer(engine, config, args, fresh_run_fix(args, plan.load)) if client else None
    # after the load: a checkpoint that fails to load leaves no log
    log = RunLog(args, config, train_iters, engine.monitor)
    log.config(config, schedule=saved["schedule"], data=saved["data"], num_workers=data_workers(args))
    if dist.get_rank() == 0:
        # what tools/clean_index_maps.py --keep-run keeps
        index_maps.write_used(args.log_dir, used_maps, parse_data_path(setup.data_path)[1], args.data_cache_path)
    run = Run(args, plan, engine, config, log, saved, progress, train_iters, watch=LossWatch(args=args))
    # the run id its checkpoints carry, in the start record: a moved copy of the run folder is told as this run's
    run_id = {checkpoint.RUN_ID: saved["origin"][checkpoint.RUN_ID]} if checkpoint.RUN_ID in (saved["origin"] or {}) \
        else {}
    if not client:
        source = plan.source and plan.source[0]
        log.start(0, f"starting from the weights of {source}" if source else "starting from scratch",
                  weights_from=source, **run_id)
        return run
    run.first_iteration = run.iteration = client["iteration"]
    run.consumed = client["consumed_samples"]
    run.validation_cut = bool(client.get(checkpoint.VALIDATION_CUT))
    run.last_checkpoint = progress.last_checkpoint = os.path.join(plan.load, checkpoint.tag_for(run.iteration))
    run.watch.saved(run.last_checkpoint, run.iteration, loaded=True)
    log.resumed(run.iteration, run.consumed)
    log.start(run.iteration, f"resuming from {run.last_checkpoint} iteration {run.iteration}, consumed samples "
                             f"{run.consumed}", resumed_from=run.last_checkpoint, **run_id)
    trains = run.iteration < train_iters  # else the warnings would describe steps that never run
    regime = kept_regime(client["config"]["model"], dict(setup.flags), setup.ds, f"the checkpoint {plan.load}")
    split_logs = split_logs_warning(client.get(checkpoint.LOGS), saved["logs"])
    for warning in (*resume_changes(run, client, schedule), optimizer_change, regime, split_logs):
        if warning and trains and dist.get_rank() == 0:
            print(warning, file=sys.stderr, flush=True)
    unsaved = unsaved_note(args.save, plan.load, run.iteration, train_iters)
    if unsaved and dist.get_rank() == 0:
        print(unsaved, flush=True)
    if run.iteration >= train_iters:  # a finished run started again (a rerun of the same command)
        log.message(nothing_to_train(args, run.iteration, train_iters))
    return run


def resume_changes(run: Run, client: dict, schedule: Schedule) -> list:
    """The warnings (None: no change) for what a resume changes against its checkpoint (`client`): the
    LR schedule (this run's `schedule`), the samples and batch, the data, the attention."""
    change = checkpoint_compat.attention_change(f"checkpoint {run.plan.load}", client["config"]["model"],
                                                vars(run.config.model))
    length = run_length(run.args, run.train_iters, run.config.global_batch_size)
    return [resume_schedule(run.engine, client.get("schedule"), schedule, run.iteration, length,
                            peak_given(run.args), fresh_run_fix(run.args, run.plan.load)),
            describe_sample_change(client["config"], run.config, run.consumed),
            describe_batch_change(client["config"], run.config, run.iteration, run.train_iters, length),
            describe_data_change(client.get("data"), run.saved["data"], run.consumed),
            unrecorded_note(run.plan.load, client.get("data")),
            describe_step_change(client["config"], run.config),
            change and f"warning: {change}"]


def train_loop(run: Run, datasets: tuple, read_batches, stop: "StopSignals") -> None:
    """The steps from run.iteration to run.train_iters, with the validation and the saves the flags ask
    for; it ends early once the ranks agree to stop (stop.agreed). The train batches' workers end with
    it, before the stop's save."""
    train_set, valid_set, _ = datasets
    with contextlib.closing(read_batches(train_set, run.consumed, run.train_iters - run.iteration)) as train_batches:
        stop.install()
        train_steps(run, valid_set, train_batches, read_batches, stop)


def train_steps(run: Run, valid_set, train_batches, read_batches, stop: "StopSignals") -> None:
    """train_loop's steps, reading `train_batches`; first the validation a stop cut short at the checkpoint's
    iteration (Run.validation_cut), with its weights, as the stopped run would have logged it."""
    args, engine, log, progress = run.args, run.engine, run.log, run.progress
    if run.validation_cut and valid_set is not None and not validate(run, valid_set, read_batches, stop):
        return
    while run.iteration < run.train_iters:
        progress.phase = f"the step of iteration {run.iteration + 1}"
        start = time.perf_counter()
        step_batches = next(train_batches)
        if stop.agreed:
            break
        set_attention_iteration(engine, run.iteration)
        lr = engine.get_lr()[0]  # the rate of this step: DeepSpeed steps the scheduler after it
        result = train_step(engine, step_batches)
        stop.steps += 1
        run.iteration += 1
        run.consumed += run.config.global_batch_size
        log.step(run.iteration, run.consumed, result, engine, time.perf_counter() - start, lr)
        check_step(args, engine, run.iteration, result.loss, run.watch, log)
        if valid_set is not None and run.iteration % args.eval_interval == 0 \
                and not validate(run, valid_set, read_batches, stop):
            break
        if args.save and (run.iteration == run.train_iters
                          or (args.save_interval and run.iteration % args.save_interval == 0)):
            progress.phase = f"the checkpoint save of iteration {run.iteration}"
            run.last_checkpoint = save_checkpoint(args, engine, run.config, run.iteration, run.consumed, log,
                                                  after=run.last_checkpoint, **run.saved)
            progress.last_checkpoint = run.last_checkpoint
            run.watch.saved(run.last_checkpoint, run.iteration)


def validate(run: Run, valid_set, read_batches, stop: "StopSignals") -> bool:
    """The validation loss at run.iteration, logged; False when a stop cut it short (Run.validation_cut)."""
    run.progress.phase = f"the evaluation after iteration {run.iteration}"
    loss = evaluate(read_batches, run.engine, valid_set, max(0, run.iteration // run.args.eval_interval - 1),
                    run.args.eval_iters, stop, EvaluationProgress(f"validation after iteration {run.iteration}",
                                                                  run.log))
    run.validation_cut = bool(stop.agreed)
    if stop.agreed:
        return False
    run.log.evaluation("validation", run.iteration, run.consumed, loss)
    run.validated = run.iteration
    return True


def end_run(run: Run, datasets: tuple, read_batches, stop: "StopSignals") -> int | None:
    """The validation and test losses of a run that was not stopped, as Megatron's pretrain ends (the
    validation unless its last step just logged one: a rerun of a finished checkpoint, Megatron's
    --skip-train, evaluates it), then the stop's save and line (its signal number returned) or the end
    of a complete run."""
    _, valid_set, test_set = datasets
    interval = run.args.eval_interval
    # the slice a validation at this iteration reads in train_steps: a rerun logs the loss the run did
    ends = (("validation", valid_set, max(0, run.iteration // interval - 1)) if run.validated != run.iteration
            else None,
            ("test", test_set, 0))
    cut = []  # the losses a stop came before
    for kind, dataset, slice_index in filter(None, ends):
        if dataset is None:
            continue
        if not stop.agreed:
            run.progress.phase = f"the {kind} evaluation after iteration {run.iteration}"
            loss = evaluate(read_batches, run.engine, dataset, slice_index, run.args.eval_iters, stop,
                            EvaluationProgress(f"{kind} evaluation after iteration {run.iteration}", run.log))
        if stop.agreed:
            cut.append(kind)
        else:
            run.log.evaluation(kind, run.iteration, run.consumed, loss)
    summary = run.watch.skipped_summary()
    if summary and dist.get_rank() == 0:
        print(summary, file=sys.stderr, flush=True)
    if not cut and ended_in_save(run) and dist.get_rank() == 0:  # every held-out loss of the run is logged
        checkpoint_save.mark_ended(run.last_checkpoint)  # the same command again exits at once (ended_run)
    if stop.agreed:  # the stop's checkpoint first, in the scheduler's grace period: no comms_logger summary
        run.progress.phase = f"the stop after iteration {run.iteration}"
        final = run.iteration == run.train_iters
        losses = f"the {' and '.join(cut)} loss{'es' * (len(cut) > 1)}"
        return stop.finish(run.args, run.iteration, run.first_iteration, run.last_checkpoint, run.log,
                           lambda: save_checkpoint(run.args, run.engine, run.config, run.iteration, run.consumed,
                                                   run.log, after=run.last_checkpoint,
                                                   validation_cut=run.validation_cut, **run.saved),
                           cut=losses if cut and final else None, validation_cut=run.validation_cut)
    run.progress.phase = END_OF_RUN
    comms_summary()  # before the last agreement, which may find a rank lost (no barrier after it)
    stop.complete(run.args, run.iteration, run.last_checkpoint, run.log)
    return None


def ended_in_save(run: Run) -> bool:
    """The run ended at its length on a checkpoint of --save at its last iteration (saved by it, or loaded)."""
    last = run.last_checkpoint
    return bool(run.args.save and last and run.iteration >= run.train_iters
                and os.path.basename(last) == checkpoint.tag_for(run.iteration)
                and paths.where_in(os.path.dirname(last), run.args.save) == "the")


def comms_summary() -> None:
    """The table of the JSON's "comms_logger" (each collective's count, sizes, latency, bandwidth), printed by
    rank 0 at the end of a run that trained to its end (not at a stop: the grace period is the save's).
    DeepSpeed records it but leaves printing it to the training script, and its log_summary() holds
    barriers, so every rank calls it (the logger is on alike on every rank: one JSON)."""
    import deepspeed.comm

    if deepspeed.comm.comms_logger.enabled:
        sys.stdout.flush()  # the run's lines before DeepSpeed's table
        deepspeed.comm.log_summary()
        sys.stdout.flush()


def save_checkpoint(args, engine, config, iteration: int, consumed: int, log, **state) -> str:
    """checkpoint_save.save into --save (`state`: schedule, data, tokenizer, origin, after); returns its folder.
    Timed: the log line says how long it took, which a stop's acknowledgement compares with a launcher's grace.
    --keep-last removes old checkpoints after that line, which names the save that made room."""
    start = time.monotonic()
    folder = os.path.join(args.save, checkpoint_save.save(engine, config, args.save, iteration, consumed, **state))
    log.saved(folder, time.monotonic() - start)
    if args.keep_last:
        removed = checkpoint_save.keep_newest(args.save, args.keep_last)
        if removed:
            log.message(removed)
        log.last_save_s = time.monotonic() - start  # a stop's save removes old ones too, within its grace
    return folder


def check_step(args, engine, iteration: int, loss: float, watch: LossWatch, log) -> None:
    """A NaN/inf loss stops the run (fp32, bf16) unless --skip-nan-batches. Steps whose gradients
    were not finite are skipped by DeepSpeed's optimizers (fp16 loss scaling, bf16, ZeRO) or by
    skip_nonfinite_updates; SKIPPED_IN_A_ROW_LIMIT of them in a row (an fp16 loss-scale overflow of a
    finite loss aside) stop the run too: the weights give NaN then, whatever the batch. A finite loss
    far above the run's first is warned of once (LossWatch). The loss is already a host float: no
    extra device sync."""
    applied = engine.was_step_applied()
    warning = watch.step(iteration, loss, skipped_for_nan=not applied and not (engine.fp16_enabled()
                                                                              and math.isfinite(loss)))
    if warning and dist.get_rank() == 0:
        print(warning, file=sys.stderr, flush=True)
    if math.isfinite(loss) or engine.fp16_enabled() or args.skip_nan_batches:
        if not applied:
            log.message(f"iteration {iteration}: loss {loss:.4f}, gradients not finite: update skipped")
        elif not math.isfinite(loss):
            log.message(f"iteration {iteration}: loss {loss}, gradients finite: update applied")
        if watch.too_many_skipped():
            raise ConfigError(f"{watch.skipped_in_a_row} steps in a row, up to iteration {iteration}, skipped their "
                              "update for a non-finite loss or gradients: the weights give NaN/inf whatever the batch",
                              restart_fix(args, iteration, watch))
        return
    raise ConfigError(f"loss is {loss} at iteration {iteration}",
                      f"{restart_fix(args, iteration, watch)}, or pass --skip-nan-batches to skip such steps")


def restart_fix(args, iteration: int, watch: LossWatch) -> str:
    """Where a run whose loss went NaN can start again: the last checkpoint whose loss was in range,
    with its logged loss (LossWatch), else a rerun that saves before that iteration."""
    where, good = watch.where_to_go_back()
    if good:  # a resume keeps the checkpoint's peak --lr (resume_schedule): --finetune
        # restarts the optimizer and schedule from its weights, in another --save (check_save_dir)
        return (f"{where}{'' if where.endswith(' then') else ':'} start a new run from its weights with a lower "
                f"rate ({new_run_fix(args, os.path.dirname(good.folder))}; a resume "
                "keeps the checkpoint's peak --lr)")
    if not args.save:
        return f"{where}: rerun with --save and --save-interval (e.g. with a lower --lr)"
    if watch.checkpoints:
        return f"{where}: rerun with a lower --lr"
    # --save is set: a save before the step is what it lacked (none at the first step)
    return f"{where}: rerun" + (f" with a --save-interval below {iteration}" if iteration > 1 else "") + \
        " (e.g. with a lower --lr)"


def evaluate(batches, engine, dataset, run: int, eval_iters: int, stop: StopSignals,
             progress: "EvaluationProgress") -> float | None:
    """Mean loss over `eval_iters` steps; validation run k reads the k-th slice of the set. None
    when a stop is agreed (every rank at the same step): a scheduler's grace period goes to the
    final checkpoint, not to the rest of the evaluation. A long one says how far it is (`progress`)."""
    per_run = eval_iters * engine.train_batch_size()
    start = min(run * per_run, max(0, len(dataset) - per_run))
    losses = []
    with contextlib.closing(batches(dataset, start, eval_iters)) as steps:
        for step in steps:
            if stop.agreed:
                return None
            losses.append(eval_step(engine, step))
            progress.step(len(losses), eval_iters)
    return sum(losses) / len(losses)


class EvaluationProgress:
    """Progress lines of one evaluation, by time as the preprocessing's (the first after FIRST_LOG_SECONDS,
    then every LOG_SECONDS, with an ETA): --eval-iters 100000 otherwise prints nothing for hours. Read
    after each step, on the loop's thread: an evaluation step takes at most seconds."""

    def __init__(self, what: str, log):
        self.what, self.log = what, log
        self.start, self.due = time.perf_counter(), FIRST_LOG_SECONDS

    def step(self, done: int, total: int) -> None:
        elapsed = time.perf_counter() - self.start
        if elapsed < self.due or done == total:
            return
        self.due = elapsed + LOG_SECONDS
        self.log.message(f"{self.what}: step {done} of {total} ({duration_text(elapsed)}, ETA "
                         f"{duration_text(elapsed * (total - done) / done)})")


def set_attention_iteration(engine, iteration: int) -> None:
    """BigBird draws its random blocks per (seed, iteration, layer); other variants ignore it."""
    from megatron.model.attention.bigbird import set_iteration

    set_iteration(engine.module, iteration)
