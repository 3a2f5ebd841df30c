"""What a resume compares with its checkpoint and what a start from weights keeps of them: a changed
LR schedule taken over (resume_schedule; schedule.py holds the schedule), the optimizer settings kept
(resume_optimizer), the warnings of changed samples, batch and data (describe_*_change, over the
record data_settings keeps), and the dropout regime and rope settings of the weights (kept_regime,
take_regime, note_replaced_settings). training.py and starting_weights.py call them; none reads a run's
state."""
import math

from megatron import optimizer_state
from megatron.arguments import flag_setting
from megatron.checkpoint_compat import NEW_RUN_FIX
from megatron.config import model_preset, preset_source, read_ds_config
from megatron.data import index_maps
from megatron.data.bert_dataset import parse_data_path, split_weights
from megatron.errors import ConfigError
from megatron.ds_schema import SECTION, precision
from megatron.model.args import BertConfig
from megatron.model.fields import Role, fields_with, info
from megatron.model.attention.rules import RULES, Rules
from megatron.parallel.launch_env import launcher_rank
from megatron.schedule import Schedule


def run_length(args, train_iters: int, global_batch: int) -> str | None:
    """The run's length as the user gave it, for a line about it: --train-samples with the steps it makes at this
    run's global batch (the schedule counts steps); None for --train-iters, which the lines name by default."""
    if args.train_iters:
        return None
    return f"--train-samples {args.train_samples} ({train_iters} steps at global batch {global_batch})"


def unsaved_note(save: str | None, load: str, iteration: int, train_iters: int) -> str | None:
    """The start-up line of a resume without --save (None: it saves, or trains nothing): its steps would be lost
    at the end with no word."""
    if save or iteration >= train_iters:
        return None
    steps = train_iters - iteration
    return (f"note: no --save: the {steps} step{'s' * (steps != 1)} this run trains after iteration {iteration} "
            f"{'are' if steps != 1 else 'is'} not kept; pass --save {load} to keep them")


def written_optimizer_params(args) -> dict:
    """The optimizer.params of the user's JSON as written ({} without one): a value it lacks is the flag's default
    (deepspeed_settings), so a line names a setting by the flag or by the JSON key that gave it."""
    if not getattr(args, "deepspeed_config", None):
        return {}
    return read_ds_config(args.deepspeed_config).get("optimizer", {}).get("params", {})


def peak_given(args) -> str:
    """How this run's peak rate was given, for a line that names it: --lr, else the JSON's key."""
    return "optimizer.params.lr" if getattr(args, "lr", None) is None and "lr" in written_optimizer_params(args) \
        else "--lr"


def peak_in_use(engine, record: dict) -> dict:
    """The schedule `record` of a resumed run, which its config.json and checkpoints keep, with the peak it
    trains at: the checkpoint's, which the scheduler state restored (resume_schedule), not --lr."""
    if engine.lr_scheduler is None:
        return record
    return {**record, "lr": engine.lr_scheduler.base_lrs[0]}


def fresh_run_fix(args, load: str) -> str:
    """How a resume of checkpoint folder `load` would start a new run from its weights instead: NEW_RUN_FIX,
    but a requeued --finetune (whose --save is resumed: start_plan.requeue_from_weights) has --finetune
    already, and its --load names the weights it first started from, not `load`."""
    if getattr(args, "finetune", False):
        return (f"pass --load {load} with --finetune and another --save to start a new run from the checkpoint's "
                "weights")
    return NEW_RUN_FIX


def resume_schedule(engine, stored: dict | None, schedule: Schedule, iteration: int,
                    length: str | None = None, peak: str = "--lr", fix: str = NEW_RUN_FIX) -> str | None:
    """When the schedule settings differ from the checkpoint's: this run's schedule sets the next
    step's rate at once (as Megatron's scheduler does on load; the optimizer would otherwise keep
    the rate the checkpoint's schedule left it, 0 after a finished run, for one step), the peak
    staying the checkpoint's (the scheduler state restores it). Returns the warning saying so
    (`length`: the run's, as run_length says it; `peak`: how the peak was given, as peak_given says it; `fix`:
    fresh_run_fix's)."""
    if not stored:
        return None
    changed = schedule.changes(stored, length, {"lr": peak})
    if not changed or engine.lr_scheduler is None:
        return None
    scheduler = engine.lr_scheduler
    # the factors were built for this run's --lr; the floor (--min-lr) is a fraction of the peak they scale
    scheduler.lr_lambdas = [schedule.factor(base) for base in scheduler.base_lrs]
    rates = [base * rule(scheduler.last_epoch) for base, rule in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, rate in zip(scheduler.optimizer.param_groups, rates):
        group["lr"] = rate
    scheduler._last_lr = rates  # what get_last_lr() reports until its next step
    peak, factor = scheduler.base_lrs[0], scheduler.lr_lambdas[0]
    train_iters = schedule.train_iters
    ending = (f", ending at {peak * factor(train_iters - 1):.3e} at iteration {train_iters}"
              if train_iters > iteration + 2 else "")
    then = (f"then {peak * factor(iteration + 1):.3e} at iteration {iteration + 2}{ending}"
            if train_iters > iteration + 1 else f"and the run ends at iteration {train_iters}")
    return (f"warning: resuming with {', '.join(changed)}: the schedule continues from iteration {iteration} with "
            f"the checkpoint's peak {peak:.3e} and this run's warm-up and decay: lr {engine.get_lr()[0]:.3e} for "
            f"iteration {iteration + 1}, {then}; to change the peak, {fix} with a fresh optimizer and "
            "schedule")


# the flags that set entries of optimizer.params (key, index in a list), whose values a resume takes
# from the checkpoint (resume_optimizer), with their argparse destinations
OPTIMIZER_PARAM_FLAGS = {("weight_decay", None): ("--weight-decay", "weight_decay"),
                         ("eps", None): ("--adam-eps", "adam_eps"),
                         ("betas", 0): ("--adam-beta1", "adam_beta1"), ("betas", 1): ("--adam-beta2", "adam_beta2")}


def resume_optimizer(engine, config, args=None, fix: str = NEW_RUN_FIX) -> str | None:
    """Both load paths restore the checkpoint's optimizer settings over this run's (--weight-decay,
    --adam-beta1/2, --adam-eps, the JSON's optimizer.params): config.ds_config then records the values
    the optimizer uses for the JSON's keys (config.json, the next checkpoint), and the warning names
    those given otherwise, by the flag where `args` has it set, else by the JSON key. The peak lr is
    the schedule's (resume_schedule): the checkpoint's, which config.json records too (peak_in_use). `fix`:
    fresh_run_fix's."""
    params = config.ds_config.get("optimizer", {}).get("params", {})
    used = optimizer_state.settings(engine)["param_groups"][0]  # the weights' group: the JSON's values (the
    # other, of biases and norm weights, differs by its weight decay 0 alone: engine.optimizer_groups)
    written = written_optimizer_params(args)

    def named(key: str, index: int | None) -> str:
        flag, dest = OPTIMIZER_PARAM_FLAGS.get((key, index), (None, None))
        if flag and args is not None and (getattr(args, dest) is not None or key not in written):
            return flag
        return f"optimizer.params.{key}" + ("" if index is None else f"[{index}]")

    changes = []
    for key in [key for key in params if key != "lr" and key in used]:
        now, then = params[key], used[key]
        if isinstance(then, (list, tuple)):
            then = list(then)
            changes += [f"{named(key, index)} {new} (the checkpoint's: {old})"
                        for index, (new, old) in enumerate(zip(now, then)) if new != old]
        elif now != then:
            changes.append(f"{named(key, None)} {now} (the checkpoint's: {then})")
        params[key] = then
    if "lr" in params and getattr(engine, "lr_scheduler", None) is not None:
        params["lr"] = peak_in_use(engine, params)["lr"]
    if not changes:
        return None
    return (f"warning: resuming with {', '.join(changes)}: the optimizer goes on with the checkpoint's settings, "
            f"which config.json records; {fix} with a fresh optimizer that takes the new values")


def describe_sample_change(stored: dict, config, consumed: int) -> str | None:
    """A warning when a resume changes what one sample is (its length, packing, a packed segment's
    length): the consumed-samples count then points into another index map, so the rest of the
    current epoch is not exactly the samples the run has not read yet."""
    # a packed segment's longest length, where both pack (else --pack-samples says it); an older config may lack it
    length = config.model.max_segment_length
    packed = stored.get("pack_samples") and config.pack_samples
    then = stored["model"].get("max_segment_length", length)
    # a default segment length follows --seq-length, which names the change then
    own = then != stored["model"]["seq_length"] or length != config.model.seq_length
    segments = (then, length) if packed and own else (None, None)
    changes = [f"{flag} {now} (the checkpoint's: {then})" for flag, then, now in (
        ("--seq-length", stored["model"]["seq_length"], config.model.seq_length),
        ("--max-segment-length", *segments)) if then != now]
    if stored.get("pack_samples", False) != config.pack_samples:
        changes.insert(1, "--pack-samples (the checkpoint's run did not pack samples)" if config.pack_samples
                       else "no --pack-samples (the checkpoint's run packed samples)")
    if not changes:
        return None
    return (f"warning: resuming with {', '.join(changes)}: samples are cut differently now, and the data goes on "
            f"at sample {consumed} of the new index map, so some text of the current epoch may be read twice or "
            "not at all (an epoch later every sample is read again); keep the checkpoint's settings to continue the "
            "same order")


def describe_batch_change(stored: dict, config, iteration: int, train_iters: int,
                          length: str | None = None) -> str | None:
    """A warning when a resume changes the global batch (other ranks, micro batch or accumulation): the
    schedule counts steps, so the samples the rest of the run reads, and the rate each sees, change
    (`length`: the run's, as run_length says it)."""
    then = math.prod(stored.get(key, 1) for key in ("micro_batch_size", "gradient_accumulation_steps",
                                                    "data_parallel_size"))
    now = config.global_batch_size
    if then == now:
        return None
    left, length = max(0, train_iters - iteration), length or f"--train-iters {train_iters}"
    return (f"warning: resuming with global batch {now} (the checkpoint's: {then}): the learning-rate schedule counts "
            f"steps, so its remaining {left} steps to {length} read {left * now} samples in place of {left * then} "
            f"({now / then:.3g}x per step, at the same rate); pass --global-batch-size {then} to keep the batch")


def describe_step_change(stored: dict, config) -> str | None:
    """A note when a resume changes how each step computes, on the same samples at the same rate: the
    gradient clipping (from here on the run's, on every load path), the precision, or the split of the
    global batch into micro-batches (the loss is averaged per micro-batch): the steps are then no longer
    bit-exact with the checkpoint's run going on."""
    then_ds, now_ds = stored.get("ds_config") or {}, config.ds_config
    changes = []
    clip = then_ds.get("gradient_clipping", 1.0), now_ds.get("gradient_clipping", 1.0)  # DeepSpeed's default 1.0
    if clip[0] != clip[1]:
        changes.append(f"gradient_clipping {clip[1]} (the checkpoint's: {clip[0]}; it applies from this step on)")
    if precision(then_ds) != precision(now_ds):
        changes.append(f"{precision(now_ds)} (the checkpoint's: {precision(then_ds)}; the weights go on from its fp32 "
                       "values)")
    split = [(run.get("micro_batch_size"), run.get("gradient_accumulation_steps", 1)) for run in (stored, vars(config))]
    if None not in split[0] and split[0] != split[1] and math.prod(split[0]) == math.prod(split[1]):
        changes.append(f"micro-batches of {split[1][0]} x {split[1][1]} (the checkpoint's: {split[0][0]} x "
                       f"{split[0][1]}; the loss is averaged per micro-batch)")
    if not changes:
        return None
    return (f"note: resuming with {', '.join(changes)}: the same samples at the same rate, but the steps are no "
            "longer bit-exact with the checkpoint's run going on")


def unrecorded_note(folder: str, data: dict | None) -> str | None:
    """A note for a checkpoint of an earlier version that kept no record (or a partial one) of the data it read:
    what the resume then cannot compare (describe_data_change), said rather than passed over. One written
    before the record may also predate per-epoch index maps (2026-11-26): its data goes on in that order."""
    if data is None:
        return (f"note: {folder} was written by an earlier version of this trainer, which did not record the data it "
                "read: a change of --data-path, --split, --seed, --short-seq-prob or the masking is not checked on "
                "this resume; and if it was written before index maps were shuffled per epoch, the rest of its "
                "current epoch is not exactly the samples it had not read")
    missing = [flag for key, flag in (("short_seq_prob", "--short-seq-prob"), *MASKING.items()) if key not in data]
    if not missing:
        return None
    return (f"note: {folder} was written by an earlier version of this trainer, which did not record "
            f"{', '.join(missing)}: a change of {'it' if len(missing) == 1 else 'them'} is not checked on this resume")


# data_settings' keys of the masking, by flag: the samples' text stays, the objective changes (a record
# written before them lacks them: not compared)
MASKING = {"mask_prob": "--mask-prob", "whole_word_masking": "--whole-word-masking"}


def data_settings(args, data_path: list) -> dict:
    """What decides the text a sample index names, kept with each checkpoint: the datasets by
    content (a moved copy matches) and blend weight, --split's shares, --seed (the shuffle;
    the ranks' random states come from the checkpoint) and --short-seq-prob (the samples' lengths);
    and how its tokens are masked (MASKING)."""
    weights, prefixes = parse_data_path(data_path)
    shares = split_weights(args.split)
    return {"data": [[weight, index_maps.fingerprint(prefix, cache_path=args.data_cache_path)]
                     for weight, prefix in zip(weights, prefixes)],
            "data_path": list(data_path), "split": [share / sum(shares) for share in shares], "split_flag": args.split,
            "seed": args.seed, "short_seq_prob": args.short_seq_prob, **{key: getattr(args, key) for key in MASKING}}


def _same_shares(a: list, b: list) -> bool:
    """Normalised weights equal up to rounding ('1 a 1 b' and '0.5 a 0.5 b' alike)."""
    return len(a) == len(b) and all(abs(x - y) <= 1e-9 for x, y in zip(a, b))


def data_changes(stored: dict | None, now: dict, consumed: int) -> tuple[list, list]:
    """(each change of the data a resume reads against its checkpoint's record, what the changes do) of
    data_settings' records: other text or weights, another split, shuffle seed, short-sample share or masking.
    Nothing for a checkpoint without the record."""
    if not stored:
        return [], []
    changes, effects = [], []
    if [name for _, name in stored["data"]] != [name for _, name in now["data"]] or not _same_shares(
            [weight for weight, _ in stored["data"]], [weight for weight, _ in now["data"]]):
        changes.append(f"--data-path {' '.join(now['data_path'])} (the checkpoint's: {' '.join(stored['data_path'])}; "
                       "other text or weights)")
    if not _same_shares(stored["split"], now["split"]):
        changes.append(f"--split {now['split_flag']} (the checkpoint's: {stored['split_flag']})")
        effects.append("documents moved between train, validation and test, so the held-out losses may include text "
                       "the run trained on")
    if stored["seed"] != now["seed"]:
        changes.append(f"--seed {now['seed']} (the checkpoint's: {stored['seed']}; it shuffles and masks the samples)")
    short = stored.get("short_seq_prob"), now.get("short_seq_prob")  # an older record lacks it
    if None not in short and short[0] != short[1]:
        changes.append(f"--short-seq-prob {short[1]} (the checkpoint's: {short[0]}; the samples' lengths)")
    if changes:
        effects.insert(0, f"the data goes on at sample {consumed} of another index map, so text of the current epoch "
                          "may be read twice or not at all")
    masking = [f"{flag} {now[key]} (the checkpoint's: {stored[key]})" for key, flag in MASKING.items()
               if key in stored and stored[key] != now[key]]
    if masking:
        changes += masking
        effects.append("other tokens are masked from here on, so the objective is not the one the checkpoint "
                       "trained on")
    return changes, effects


def describe_data_change(stored: dict | None, now: dict, consumed: int) -> str | None:
    """A warning when a resume (given --override-data-settings: refuse_data_change) reads other data, splits it
    otherwise or shuffles it with another seed: the consumed-samples count then points into another index map, and
    with another split validation and test may hold text the run trained on; or masks it otherwise (another
    objective). None for a checkpoint without the record."""
    changes, effects = data_changes(stored, now, consumed)
    if not changes:
        return None
    return (f"warning: resuming with {', '.join(changes)}: {'; '.join(effects)}; keep the checkpoint's settings to "
            "continue the same data")


OVERRIDE_DATA = "--override-data-settings"


def refuse_data_change(stored: dict | None, now: dict, load: str, override: bool) -> None:
    """A resume of checkpoint folder `load` on data settings other than those its checkpoint records (`stored`,
    against this run's `now`: data_settings) is refused before any work unless `override` (OVERRIDE_DATA: a change
    made on purpose, then describe_data_change's warning): a --save folder that another run left (the launch
    scripts resume their --save) would otherwise go on with that run's weights, optimizer and schedule on this
    run's data, with a warning only. Model changes are refused apart (refuse_contradictions, check_same_model)."""
    changes = data_changes(stored, now, 0)[0]
    if override or not changes:
        return
    raise ConfigError(f"--load {load} holds a checkpoint of a run with other data settings: resuming it with "
                      f"{', '.join(changes)}", f"keep the checkpoint's settings to resume it, pass another --save "
                      f"(and no --load {load}) to start a new run, or pass {OVERRIDE_DATA} to resume it on these")


def note_replaced_settings(flags: dict, start: dict, source: str) -> None:
    """The lines of a new run from weights with a flag that replaces their rope theta or window: a choice
    (a longer context wants one), but every layer it reaches then computes otherwise than the weights
    were trained to, which the config line alone would not say. From the first rank."""
    for field in fields_with(role=Role.WEIGHTLESS):
        value, have = flags.get(field), start.get(field)
        if value is None or have is None or value == have or launcher_rank() != 0:
            continue
        trained = f" (its local layers were trained seeing {have // 2} tokens each side)" \
            if field == "local_attention_window" else ""
        print(f"note: {flag_setting(field, value)} replaces the {info(field).said_as} {have:g} of {source}"
              f"{trained}", flush=True)


def given_attention(flags: dict, ds: dict) -> str | None:
    """The attention variant the flags or the JSON section name (None: neither, the default)."""
    section = ds.get(SECTION)
    return flags.get("attention") or (section.get("attention") if isinstance(section, dict) else None)


def kept_regime(stored: dict, flags: dict, ds: dict, source: str) -> str | None:
    """A resume trains with the checkpoint's dropout (and records its init_method_std) where no flag or
    preset sets them: BertConfig's defaults (dropout 0.1) would change a preset run's regime silently.
    Sets them in `flags` (model_flags has: the run's flags give the same warning again); returns the warning
    naming those a flag or preset changes, or attention dropout dropped by a variant without it (ring,
    hybrid, BigBird: their default 0) (None: no change), for once the checkpoint has loaded."""
    changes = take_regime(stored, flags, ds)[1]
    return f"warning: {'; '.join(changes)}, which {source}'s run trained with" if changes else None


def take_regime(stored: dict, flags: dict, ds: dict, local_layers: bool = False) -> tuple[list, list]:
    """Sets in `flags` the Role.REGIME fields (dropout, init: they train a model, shape none of it) of
    `stored` (the weights' config) that no flag or preset sets; attention dropout 0 where the variant or
    the weights' local layers (`local_layers`) have none. Returns ('name value' of each taken, 'SETTER
    changes name from value' of each set otherwise)."""
    preset, named = model_preset(flags, ds), preset_source(flags, ds)
    variant = given_attention(flags, ds) or BertConfig.attention
    without = f"{variant} attention" if not RULES.get(variant, Rules).supports_attention_dropout else \
        "local layers" if local_layers else None
    taken, changes = [], []
    for name in (name for name in fields_with(role=Role.REGIME) if name in stored):
        value = flags.get(name)
        setter = flag_setting(name, value) if value is not None else None
        if value is None and name in preset:
            value, setter = preset[name], f"{named} ({name} {preset[name]})"
        if value is None and name == "attention_dropout" and stored[name] and without:
            value, setter = 0.0, f"{without} (no attention dropout)"
        if value is None:
            flags[name] = stored[name]
            taken.append(f"{name} {stored[name]}")
        elif value != stored[name]:
            changes.append(f"{setter} changes {name} from {stored[name]}")
    return taken, changes


def note_taken_regime(taken: list, source: str) -> None:
    """The line of a new run from weights whose dropout (init_method_std) comes from them, not from
    BertConfig's defaults (a ModernBERT's dropout 0, not 0.1), from the first rank."""
    if taken and launcher_rank() == 0:
        print(f"{', '.join(taken)} as in {source} (--hidden-dropout, --attention-dropout or --init-method-std set "
              "others)", flush=True)
