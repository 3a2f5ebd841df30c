"""Where a run starts (StartPlan: scratch, a resume of --load, or weights: --init-from-hf, a
weights-only --load, --finetune), resolved from the flags and the folders they name before any
start-up work, a requeued job's resume included; and the origin its checkpoints record, against
which a requeue is checked."""
import concurrent.futures
import dataclasses
import os
import sys
import uuid

from megatron import checkpoint, checkpoint_save, hf_io
from megatron.errors import ConfigError
from megatron.parallel.launch_env import launcher_rank
from megatron.relaunch import resume_fix


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
    def weights(self) -> bool:
        """Whether the run starts from weights or resumes them: their model (its head count) is fixed."""
        return bool(self.load or self.init_from_hf)

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
    first run's); one whose newer checkpoints a rollback will overwrite is named in a warning; one holding
    another run's checkpoints, in a resume from another folder, is refused (checkpoint_save.refuse_foreign_tags)."""
    if args.save:
        checkpoint_save.refuse_unnamed_checkpoints(args.save, resume_fix(args, args.save))
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
    newer = checkpoint_save.check_save_dir(args.save, start)
    if plan.resume and not same_folder(plan.load, args.save):
        checkpoint_save.refuse_foreign_tags(args.save, plan.load, start)
    if newer and launcher_rank() == 0:
        print(checkpoint_save.overwrite_warning(args.save, newer, start), file=sys.stderr, flush=True)
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
    or the weights' folder, kind and fingerprint (a hash of every weight: pending_origin runs it aside).
    Its RUN_ID, made here and kept by every resume, tells this run's checkpoints from another's wherever
    they were moved (checkpoint_save.foreign_tags)."""
    run = {checkpoint.RUN_ID: uuid.uuid4().hex}
    if plan.source is None:
        return {"from": None, checkpoint.OWN_POSITIONS: True, **run}
    source, kind = plan.source
    return {"from": os.path.realpath(source), "kind": kind, "sha256": hf_io.weights_fingerprint(source, kind), **run}


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
