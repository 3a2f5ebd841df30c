"""Continues a model with rotary positions (a ModernBERT folder or a checkpoint of this trainer)
at a longer sequence: one command that picks the launch for you and starts the `deepspeed` launcher.

  - the weights: `--init-from-hf FROM` for a Hugging Face folder, `--load FROM --finetune` for a
    checkpoint (a new run from its weights, any layout); once `--save` holds a checkpoint the same
    command resumes from it instead (a requeued job goes on, with the launch restated: `--load` alone
    takes the model from the checkpoint, not the split, attention or packing; another --from than the
    first run's, which its checkpoint records (weights_from: the path and a hash of its config and
    weights), a --save of a run from scratch, or another length or theta than --save holds is refused);
    a checkpoint already at the run's length is said here (the trainer's
    `nothing to train` line, training.finished_resume), with no launch;
  - the length: `--seq-length`, 1-64x the length the model was trained at (an HF folder's
    `max_position_embeddings`, a checkpoint's `seq_length`), packed samples on;
  - the positions: the global layers' rope theta scaled with the length (NTK-aware:
    theta x factor^(d / (d - 2)) for head size d, which stretches the slowest rotation by the
    factor and leaves the fastest ones alone) unless `--rotary-base` names one; local layers keep
    theirs (their window does not grow);
  - the split: every rank on one sequence (`--sequence-parallel-size`, default all ranks), global
    layers by ring, Ulysses or hybrid attention, local layers by their halo exchange.

Anything after `--` goes to pretrain_bert.py unchanged (data, tokenizer, schedule, logging flags),
except a flag this tool sets (--seq-length, --save, ...: refused, naming the option to use). The
command is checked here as the trainer checks it at start-up (its parser, flags, tokenizer, the
--data-path datasets, model and layout); `--dry-run` prints it instead of running it. It runs as
DeepSpeed's runner under megatron/parallel/deepspeed_command.py: Ctrl-C during the runner's imports
is one line, as during this tool's own imports.
"""
import argparse
import contextlib
import io
import os
import shlex
import sys
from pathlib import Path

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import ConfigError, DataError, OneLineParser, run_tool, start_up_stops_in_one_line
from megatron.flag_checks import check_no_empty_values
from megatron.flag_habits import wrapped_fix
from megatron.paths import in_repository, python_command, where_in
from megatron.quiet import quiet_deepspeed

with start_up_stops_in_one_line("extend_context.py"):  # Ctrl-C during the seconds of imports: one line
    quiet_deepspeed(on_the_device=True)  # before DeepSpeed is first imported (megatron.checkpoint imports it)
    from megatron import checkpoint, hf_convert, hf_io
    from megatron.arguments import flag_setting, flags_given
    from megatron.config import json_pipeline_stages, read_ds_config, section_values
    from megatron.ds_schema import SECTION
    from megatron.model.args import check_bounded
    from megatron.model.fields import fields_with, info, variants_with_options
    from megatron.start_plan import StartPlan
    from megatron.starting_weights import initial_model_fields, starting_weights_fields, table_extension_route

ROOT = Path(__file__).resolve().parents[1]
MAX_FACTOR = 64
EXTENDED = ("max_position_embeddings", "rotary_base")  # the fields this tool sets, not --from
ATTENTIONS = ("ring", "ulysses", "hybrid")  # sequence-parallel, exact, and what the local layers' halo goes with


def parse_args(argv=None):
    parser = OneLineParser(prog="extend_context.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", required=True, metavar="DIR",
                        help="a Hugging Face ModernBERT folder, or a checkpoint folder of this trainer")
    parser.add_argument("--seq-length", type=int, required=True, help="the new sequence length")
    parser.add_argument("--save", required=True, help="checkpoint folder of the continued run")
    parser.add_argument("--num-gpus", type=int, help="ranks on this machine (default: its GPUs; without GPUs, "
                        "CPU processes, as many as --sequence-parallel-size or 2)")
    parser.add_argument("--sequence-parallel-size", type=int, help="ranks per sequence (default: all ranks)")
    parser.add_argument("--attention", choices=ATTENTIONS, help="the global layers' variant (default: the "
                        "--deepspeed-config's, with its ulysses_size, when it names one; else ring)")
    parser.add_argument("--ulysses-size", type=int, help="hybrid: ranks per all-to-all group")
    parser.add_argument("--rotary-base", type=float, help="the global layers' rope theta (default: scaled with "
                        "the length, see above)")
    parser.add_argument("--deepspeed-config", default=str(ROOT / "ds_configs" / "ring_sp2.json"),
                        help="DeepSpeed JSON (batch, ZeRO, precision; its sequence_parallel section is overridden, "
                        "its ring, ulysses or hybrid attention taken where --attention is not given)")
    parser.add_argument("--master-port", type=int, help="the launcher's rendezvous port (default its 29500)")
    parser.add_argument("--dry-run", action="store_true", help="print the launch command, do not run it")
    parser.add_argument("pretrain_args", nargs=argparse.REMAINDER, help="-- then flags for pretrain_bert.py")
    refuse_misplaced_flags(parser, sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(argv)
    if args.pretrain_args[:1] == ["--"]:
        args.pretrain_args = args.pretrain_args[1:]
    else:
        unknown += args.pretrain_args
    if unknown:
        raise ConfigError(f"{unknown[0]} is not an option of extend_context.py", "flags for pretrain_bert.py go "
                          "after --: extend_context.py --from DIR --seq-length N --save DIR -- --data-path ...")
    check_no_empty_values(args, {"source": "--from", "save": "--save", "deepspeed_config": "--deepspeed-config"})
    if args.master_port is not None and not 1 <= args.master_port <= 65535:
        raise ConfigError(f"--master-port {args.master_port} is not a TCP port", "pass a free port in 1-65535, "
                          "e.g. 29500")
    refuse_set_flags(args.pretrain_args)
    return args


def refuse_misplaced_flags(parser: argparse.ArgumentParser, argv: list) -> None:
    """Flags on the wrong side of `--`, named before argparse reads them: a pretrain_bert.py flag before it
    made the rest a remainder (`required: --save` for a --save given after it), and this tool's options
    after it were `required: --seq-length, --save` rather than where to put them."""
    split = argv.index("--") if "--" in argv else len(argv)
    own = {flag for flag, _ in flags_given(parser, argv[:split])}
    for flag, _ in flags_given(trainer_parser(), argv[:split]):
        if flag not in own:
            raise ConfigError(f"{flag} is a pretrain_bert.py flag, given before --",
                              f"put it after --: extend_context.py --from DIR --seq-length N --save DIR -- {flag} ...")
    refuse_set_flags(argv[split + 1:])


# the config fields that launch_command sets -> this tool's option for them (None: none, the tool's own choice)
TOOL_SETS = {"seq_length": "--seq-length", "max_position_embeddings": "--seq-length", "rotary_base": "--rotary-base",
             "sequence_parallel_size": "--sequence-parallel-size", "attention": "--attention",
             "ulysses_size": "--ulysses-size", "pack_samples": None}
# pretrain_bert.py flags (by destination) that launch_command sets -> this tool's option for it: those of
# TOOL_SETS' fields, and the run's own
SET_FLAGS = {**{info(field).dest or field: option for field, option in TOOL_SETS.items()},
             "save": "--save", "load": "--from", "init_from_hf": "--from", "finetune": "--from",
             "deepspeed_config": "--deepspeed-config", "deepscale_config": "--deepspeed-config", "deepspeed": None,
             "deepscale": None, "local_rank": None, "launched_by": None}


# the trainer's flags this tool takes as its own (before --), by the names a habit row's fix may use
OWN_FLAGS = {"--deepspeed_config": "--deepspeed-config", "--sequence-parallel-size": "--sequence-parallel-size",
             "--attention": "--attention", "--ulysses-size": "--ulysses-size"}


def trainer_parser() -> argparse.ArgumentParser:
    """pretrain_bert.py's parser, its errors one line in this tool's form."""
    from megatron.arguments import build_parser

    def refuse(message):
        raise ConfigError(f"pretrain_bert.py flags after --: {message}",
                          f"see {python_command()} {in_repository('pretrain_bert.py')} --help")

    def refuse_habit(problem, fix):  # another trainer's flag, named with its equivalent in this tool's terms
        raise ConfigError(f"pretrain_bert.py flags after --: {problem}", wrapped_fix(fix, OWN_FLAGS))

    parser = build_parser()
    parser.error, parser.refuse = refuse, refuse_habit  # not argparse's usage and exit
    return parser


def refuse_set_flags(pretrain_args: list) -> None:
    """Flags after `--` that would override what this tool sets (the last flag wins in argparse): a
    run at another length than the theta was scaled for, or saving where the same command does not
    resume from."""
    for flag, action in flags_given(trainer_parser(), pretrain_args):
        if action.dest in SET_FLAGS:
            named = flag if flag in action.option_strings else f"{flag} (for {action.option_strings[-1]})"
            instead = SET_FLAGS[action.dest]
            raise ConfigError(f"{named} after -- would override what extend_context.py sets",
                              f"pass {instead} to extend_context.py (before --)" if instead else f"drop {flag}")


def source_model(source: str) -> tuple[dict, str]:
    """(BertConfig fields, how the run starts from them) of an HF folder or a checkpoint folder."""
    folder = Path(source)
    if not folder.exists():
        raise DataError(f"--from {source} does not exist",
                        "pass a ModernBERT folder or a --save folder of this trainer")
    if not folder.is_dir():
        raise DataError(f"--from {source} is a file", "pass the folder holding it")
    if (folder / "config.json").is_file():
        if not any((folder / name).is_file() for name in hf_io.HF_WEIGHT_FILES):
            checkpoint.refuse_log_dir(source, "--from")
            raise DataError(f"--from {source} holds config.json but no weights "
                            f"({', '.join(hf_io.HF_WEIGHT_FILES)})",
                            "pass the whole folder save_pretrained wrote")
        return hf_convert.bert_fields_from_hf(hf_io.read_hf_config(folder)), "hf"
    if os.path.lexists(folder / checkpoint.LATEST):  # latest_tag names one that is no file
        return checkpoint.stored_config(source, checkpoint.latest_tag(source))["model"], "checkpoint"
    checkpoint.refuse_tag_folder(source, "--from")
    checkpoint.refuse_unfinished_only(source, "--from", reader=True)
    raise DataError(f"--from {source} is neither a Hugging Face folder (no config.json) nor a checkpoint folder "
                    f"(no {checkpoint.LATEST} file)", "pass a ModernBERT folder or a --save folder of this trainer")


def trained_length(fields: dict, kind: str) -> int:
    """The length the model was trained at: a checkpoint's seq_length; an HF folder's
    max_position_embeddings (what its config declares)."""
    return int(fields["seq_length"] if kind == "checkpoint" else fields["max_position_embeddings"])


def scaled_theta(theta: float, factor: float, head_dim: int) -> float:
    """NTK-aware rope base for a sequence `factor` times longer: the slowest of the d/2 rotations
    turns `factor` times slower, the fastest keeps its rate."""
    return theta * factor ** (head_dim / (head_dim - 2))


def check(args, fields: dict, kind: str) -> float:
    """The length factor, after refusing what cannot be extended this way."""
    if fields.get("position_embedding_type", "learned") != "rope":
        raise ConfigError(f"--from {args.source} has learned positions, not rotary ones", f"extend a learned-position "
                          f"BERT with {table_extension_route(args.source, kind, 'N')} (it repeats the table), or "
                          "start from a ModernBERT")
    old = trained_length(fields, kind)
    factor = args.seq_length / old
    if not 1 <= factor <= MAX_FACTOR:
        raise ConfigError(f"--seq-length {args.seq_length} is {factor:g}x the {old} tokens the model was trained at",
                          f"pick 1 to {MAX_FACTOR} times {old}")
    if args.rotary_base is not None:
        check_bounded("rotary_base", args.rotary_base)
    return factor


def pipeline_stages(args, ds: dict) -> tuple[int, str]:
    """(the run's pipeline stages, them named for a message), as the trainer resolves them: a
    --pipeline-model-parallel-size after `--` over the JSON's pipeline.stages."""
    given = trainer_parser().parse_args(args.pretrain_args).pipeline_model_parallel_size
    if given is not None and given < 1:
        raise ConfigError(f"--pipeline-model-parallel-size {given} after -- must be >= 1",
                          "pass 1 or more, or drop it (the --deepspeed-config's pipeline.stages then)")
    if given:
        return given, f"the {given} pipeline stages of --pipeline-model-parallel-size after --"
    stages = json_pipeline_stages(ds)
    return stages, f"the JSON's {stages} pipeline stages"


def ranks(args, stages: int, named: str) -> tuple[int, int, bool]:
    """(ranks on this machine, ranks per sequence, on CPU) for `stages` pipeline stages (`named` so),
    checked here in this tool's flag names (the trainer would name its own, after the launcher has
    started). Without GPUs or --num-gpus: one sequence-parallel group per stage."""
    import torch
    for flag, value in (("--num-gpus", args.num_gpus), ("--sequence-parallel-size", args.sequence_parallel_size),
                        ("--ulysses-size", args.ulysses_size)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value} must be >= 1", f"pass {flag} 1 or more")
    if (args.attention == "hybrid") != (args.ulysses_size is not None):
        raise ConfigError("--ulysses-size goes with --attention hybrid and only with it",
                          "give both or neither")
    gpus = torch.cuda.device_count()
    world = args.num_gpus or gpus or (args.sequence_parallel_size or 2) * stages
    if world % stages:
        raise ConfigError(f"{named} do not divide the {world} ranks",
                          f"pass --num-gpus a multiple of {stages}")
    sequence = args.sequence_parallel_size or world // stages
    if world % (sequence * stages):
        pipeline = f" x {named}" if stages > 1 else ""
        raise ConfigError(f"--sequence-parallel-size {sequence}{pipeline} does not divide the {world} ranks",
                          f"pass --num-gpus a multiple of {sequence * stages}, or a --sequence-parallel-size that "
                          f"divides {world // stages}")
    if args.ulysses_size and sequence % args.ulysses_size:
        raise ConfigError(f"--ulysses-size {args.ulysses_size} does not divide the {sequence} ranks per sequence",
                          f"pass a divisor of {sequence}")
    return world, sequence, gpus == 0


def check_paths(args) -> dict:
    """--save and --deepspeed-config, before the launcher starts -> the JSON."""
    if where_in(args.save, args.source) == "the":
        raise ConfigError("--save is the --from folder", "choose another --save")
    if Path(args.save).exists() and not Path(args.save).is_dir():
        raise ConfigError(f"--save {args.save} is a file", "pass a folder (a new one, or the --save of this run)")
    ds = read_ds_config(args.deepspeed_config, "to --deepspeed-config")
    section = ds.get(SECTION) if isinstance(ds.get(SECTION), dict) else {}
    # a variant the JSON names or sets up that this tool does not run: refused, not replaced by its default
    # (the trainer would say "set attention ...", which this tool overrides)
    named = section.get("attention")
    for variant in [*(name for name in variants_with_options() if name in section), named]:
        if variant is not None and variant not in ATTENTIONS:
            fix = (f"pass a JSON without sequence_parallel.{variant} and" if variant in section else
                   f"pass --attention {'/'.join(ATTENTIONS)}, or a JSON")
            raise ConfigError(f"--deepspeed-config {args.deepspeed_config} sets up {variant} attention, and "
                              f"extend_context.py runs {', '.join(ATTENTIONS[:-1])} or {ATTENTIONS[-1]} "
                              "(sequence-parallel, exact, and what the local layers need)",
                              f"{fix} with one of them, such as {in_repository('ds_configs/ring_sp2.json')}")
    return ds


def refuse_save_inside_source(args) -> None:
    """A --save inside the --from model (once it is one, source_model): a checkpoint's resumes and --keep-last
    remove its iter_* folders and what lies in them, and a Hugging Face folder is no place for a run."""
    if where_in(args.save, args.source) == "inside the":
        raise ConfigError(f"--save {args.save} is inside the --from folder {args.source}",
                          f"choose a --save outside {args.source}")


def take_attention(args, ds: dict) -> None:
    """--attention and --ulysses-size, where not given, from the JSON (check_paths refused a variant this
    tool does not run; a JSON that names none: ring): the command passes them to the trainer, whose flags
    override the JSON. A JSON's ulysses_size under --attention ring or ulysses would be refused by the
    trainer, which would say to edit the JSON."""
    section = section_values(ds)  # type-checked
    in_json = section.get("ulysses_size")
    if args.attention is None:
        args.attention = section.get("attention", "ring")
        if args.attention == "hybrid" and args.ulysses_size is None:
            if in_json is None:
                raise ConfigError(f"--deepspeed-config {args.deepspeed_config} runs hybrid attention without "
                                  "ulysses_size", "pass --ulysses-size N (ranks per all-to-all group) to "
                                  "extend_context.py")
            args.ulysses_size = in_json
    elif args.attention != "hybrid" and in_json is not None:
        raise ConfigError(f"--attention {args.attention} contradicts the sequence_parallel.ulysses_size {in_json} of "
                          f"--deepspeed-config {args.deepspeed_config}", f"pass --attention hybrid --ulysses-size "
                          f"{in_json} to extend_context.py, or a JSON without ulysses_size")


def default_theta(fields: dict, factor: float) -> float:
    """The source's global theta scaled with the length (6 digits, as the command shows it)."""
    head_dim = fields["hidden_size"] // fields["num_attention_heads"]
    return float(f"{scaled_theta(fields['rotary_base'], factor, head_dim):.6g}")


def warn_faster_theta(args, fields: dict, factor: float) -> None:
    """A --rotary-base below the source's makes the slow rotations faster, where an extension slows
    them; it is also what a local theta given for the global one (ModernBERT: 10000 vs 160000) does.
    A warning, not a refusal: fine-tuning at a smaller base is a method of its own (Liu et al. 2023,
    "Scaling Laws of RoPE-based Extrapolation")."""
    if args.rotary_base is not None and args.rotary_base < fields["rotary_base"]:
        print(f"warning: --rotary-base {args.rotary_base:g} is below the model's global rope theta "
              f"{fields['rotary_base']:g}: its slowest rotations turn faster, not slower as an extension's do; "
              f"drop --rotary-base for the scaled {default_theta(fields, factor):g}", file=sys.stderr, flush=True)


def source_fields(args, kind: str) -> dict:
    """The model fields the first run took from --from (the trainer's own choice), less those this
    tool sets: the command states them, so that it reads the same for the first run and a resume."""
    hf = kind == "hf"  # as the first run starts (launch_command): --init-from-hf, else --load --finetune
    start = StartPlan(load=None if hf else args.source, init_from_hf=args.source if hf else None, finetune=not hf,
                      weights_only=not hf)
    fields = initial_model_fields(starting_weights_fields(start))
    return {field: value for field, value in fields.items() if field not in EXTENDED}


def check_source(args, kind: str) -> None:
    """A resume goes on from the model --from names, else it would continue another model's extension
    under this command's summary. The record is the checkpoint's own (its run_state's weights_from: the
    path and fingerprint of the weights the first run started from, carried by every resume), so a
    launch that fails before its first save leaves no record behind; a run from scratch records none (its
    "from" is None), and is no extension of anything. A checkpoint without a record (saved before runs
    recorded it) is left to resumed_model's comparison of the model fields."""
    record = checkpoint.run_state(args.save, checkpoint.latest_tag(args.save)).get(checkpoint.ORIGIN)
    if not isinstance(record, dict):
        return
    if not record.get("from"):
        raise ConfigError(f"--save {args.save} holds the checkpoint of a run that started from random weights, not "
                          f"from --from {args.source}", "choose a new --save (resume that run with pretrain_bert.py "
                          f"--load {args.save})")
    recorded, digest = record["from"], record.get("sha256")
    if digest == hf_io.weights_fingerprint(args.source, kind):
        return
    if recorded != str(Path(args.source).resolve()):
        raise ConfigError(f"the checkpoint in --save was extended from {recorded}, --from {args.source} holds another "
                          "model", f"rerun with --from {recorded} or choose a new --save")
    raise ConfigError(f"--from {args.source} has changed since the checkpoint in --save was extended from it (its "
                      "config or weights differ)", "restore it, or choose a new --save")


def resumed_model(args, fields: dict, theta: float) -> dict:
    """The model fields a resume restates: --from's, with those a run may set otherwise (window, local
    theta, head, vocab padding: Field.adjustable_start, maybe given after `--` the first
    time) as the checkpoint in --save holds them. Refuses a resume of another model (first: then a
    length or theta would be the wrong thing to change) or extension."""
    stored = checkpoint.stored_config(args.save, checkpoint.latest_tag(args.save))["model"]
    adjustable = fields_with(adjustable_start=True)
    for field, value in fields.items():
        if field not in adjustable and stored.get(field) != value:
            raise ConfigError(f"the checkpoint in --save is of a model with {field} {stored.get(field)}, --from "
                              f"{args.source} has {value}: --save holds another run's checkpoint",
                              "choose a new --save (or, if it is an extension, rerun with the --from it started from)")
    if stored["seq_length"] != args.seq_length:
        raise ConfigError(f"the checkpoint in --save was extended to {stored['seq_length']} tokens",
                          f"rerun with --seq-length {stored['seq_length']} or choose a new --save")
    if stored["rotary_base"] != theta:
        raise ConfigError(f"the checkpoint in --save was extended with global rope theta {stored['rotary_base']}, "
                          f"this command gives {theta}",
                          f"rerun with --rotary-base {stored['rotary_base']} or choose a new --save")
    return {field: stored.get(field, value) if field in adjustable else value
            for field, value in fields.items()}


def model_flags(fields: dict) -> list:
    """pretrain_bert.py flags that set `fields`; a sentence-order head is the trainer's default and has
    no flag of its own."""
    return [part for field, value in fields.items() if not (field == "add_binary_head" and value)
            for part in flag_setting(field, value).split()]


def launch_command(args, kind: str, theta: float, world: int, sequence: int, resume: list | None) -> list:
    """`resume`: the model flags of a requeued job (None: a first run, the trainer takes the model from --from)."""
    if resume is not None:
        start = ["--load", args.save, *resume]  # a requeued job: go on from the last save
    elif kind == "hf":
        start = ["--init-from-hf", args.source]
    else:
        start = ["--load", args.source, "--finetune"]
    hybrid = ["--ulysses-size", str(args.ulysses_size)] if args.ulysses_size else []
    port = ["--master_port", str(args.master_port)] if args.master_port else []
    return [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", str(world), *port,
            str(ROOT / "pretrain_bert.py"),
            "--deepspeed", "--deepspeed_config", args.deepspeed_config, *start,
            "--sequence-parallel-size", str(sequence), "--attention", args.attention,
            *hybrid, "--seq-length", str(args.seq_length), "--max-position-embeddings", str(args.seq_length),
            "--rotary-base", str(theta), "--pack-samples", "--save", args.save,
            "--launched-by", "extend_context.py", *args.pretrain_args]  # its lines on how to go on name this tool


def check_launch(command: list, world: int) -> None:
    """pretrain_bert.py's start-up checks, run here (--dry-run too) on the flags `command` gives it at
    `world` ranks: its parser, its flag checks, where the run starts, the tokenizer and the --data-path
    datasets (the vocab they were made with, their files; without --data-path, the default dataset's
    vocab, which is not built here), the model and layout it resolves from the DeepSpeed JSON and the LR
    schedule against the run's length (training.check_resolved), so that a command that passes here passes them
    once launched. Returns the trainer's nothing-to-train line of a resume already at the run's length (None: the
    launch trains)."""
    from megatron.config import resolve
    from megatron.data.bert_dataset import parse_data_path
    from megatron.data.indexed_dataset import make_dataset
    from megatron.data.tokenizer import check_fits
    from megatron.engine import check_precision_supported
    from megatron.model.bert import BertConfig
    from megatron.flag_checks import check_flag_combinations, check_flags
    from megatron.run_data import check_default_data_vocab, data_paths, run_tokenizer
    from megatron.start_plan import check_start
    from megatron.starting_weights import model_flags as trainer_flags
    from megatron.training import check_resolved, deepspeed_settings, finished_resume, start_notes

    args = trainer_parser().parse_args(command[command.index(str(ROOT / "pretrain_bert.py")) + 1:])
    check_flags(args)
    check_flag_combinations(args)
    plan = check_start(args)
    ds = deepspeed_settings(args)
    check_precision_supported(ds)
    flags = trainer_flags(args, ds, plan)
    if args.data_path:
        tokenizer = data_paths(args, plan)[1]
    else:  # the trainer builds the default dataset, which is not done here: its vocab is checked
        tokenizer = run_tokenizer(args, plan)
        check_default_data_vocab(args, tokenizer, flags["vocab_size"])
    vocab_size = flags["vocab_size"] if flags["vocab_size"] is not None else (  # --vocab-size 0: refused
        tokenizer.vocab_size if tokenizer is not None else BertConfig.vocab_size)
    config = resolve({**flags, "vocab_size": vocab_size}, ds, world, weights_given=plan.weights)
    if tokenizer is not None:
        check_fits(tokenizer, config.model.vocab_size)
    check_resolved(args, config, ds)  # room for a sample, the LR schedule against the run's length
    for prefix in parse_data_path(args.data_path)[1] if args.data_path else ():
        # opened as the run opens it; "cached" is "lazy"'s index with the whole .bin read into memory
        make_dataset(prefix, "lazy" if args.data_impl == "cached" else args.data_impl)
    for note in start_notes(args, config, plan):  # the launched run's, printed by --dry-run (main)
        print(note)
    return finished_resume(args, plan, config.global_batch_size)


def main(argv=None) -> int:
    args = parse_args(argv)
    ds = check_paths(args)
    take_attention(args, ds)
    world, sequence, on_cpu = ranks(args, *pipeline_stages(args, ds))
    fields, kind = source_model(args.source)
    refuse_save_inside_source(args)
    factor = check(args, fields, kind)
    theta = args.rotary_base or default_theta(fields, factor)
    resume = None
    if (Path(args.save) / checkpoint.LATEST).is_file():  # a requeued job
        check_source(args, kind)
        resume = model_flags(resumed_model(args, source_fields(args, kind), theta))
    command = launch_command(args, kind, theta, world, sequence, resume)
    with contextlib.redirect_stdout(io.StringIO()) as notes:  # the trainer's notes, once its checks have all passed
        finished = check_launch(command, world)
    if finished:  # the same command run again: said before a launch that would only say it
        print(finished, flush=True)
        return 0
    if args.dry_run:  # a launched run prints them itself
        print(notes.getvalue(), end="")
    warn_faster_theta(args, fields, factor)
    print(f"extend_context.py: {kind} {args.source} trained at {trained_length(fields, kind)} tokens -> "
          f"{args.seq_length} ({factor:g}x); global rope theta {fields['rotary_base']:g} -> {theta}", flush=True)
    print(shlex.join(command), flush=True)
    if args.dry_run:
        return 0
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if on_cpu else {})}  # CPU: processes over gloo
    launcher = [sys.executable, "-P", "-m", "megatron.parallel.deepspeed_command", *command[1:]]
    os.execve(launcher[0], launcher, env)  # the launcher takes this process: signals reach it directly


if __name__ == "__main__":
    sys.exit(run_tool("extend_context.py", main))
