"""Reads, edits, checks and compares DeepSpeed JSON configs the way pretrain_bert.py resolves them.

    python tools/ds_config.py show CONFIG [--world-size N] [model/parallel flags]
    python tools/ds_config.py set CONFIG key.path=value ... [-o OUT|-] [--world-size N] [flags]
    python tools/ds_config.py validate CONFIG --world-size N [--pipeline-model-parallel-size P] [flags]
    python tools/ds_config.py diff A B

`set` parses each value as JSON (`4`, `true`, `null`, `[0.9, 0.999]`, `"text"`; a bare word
that is not JSON is a string; NaN, Infinity and numbers too large for a float are refused, as
in the files it reads), creates missing objects on the path, resolves the result and
writes it (in place, or to OUT) through a temporary file and os.replace: on any error nothing
is written. A null value leaves the setting to be derived (e.g. gradient_accumulation_steps).
The model and parallel flags are pretrain_bert.py's (--seq-length, --attention-dropout,
--pipeline-model-parallel-size, ...): settings that live on the command line, not in the JSON,
take part in the checks. Without --world-size the smallest world the JSON fits is used:
pipeline x sequence-parallel x (train_batch_size / (micro x grad-acc)).
Setting the global or micro batch of a template that also fixes grad-acc makes
gradient_accumulation_steps null (derived), said on stderr. The pipeline degree may be in the
JSON (`pipeline.stages`). `show` prints what the trainer will use: BigBird's seed is --seed, and
the optimizer is filled as there (AdamW, the default params the JSON lacks, torch_adam without
CUDA: --cuda / --no-cuda for the run's machines, default this one's; the trainer's --lr,
--weight-decay, --adam-* and --clip-grad flags win over all of these), and the vocab size is the
--vocab-file's or --tokenizer-file's (else the default data's vocab), as the trainer takes it. The tool imports neither
torch nor DeepSpeed: it answers in a fraction of a second; --deepspeed-check adds DeepSpeed's
own checks of its sections (seconds), which the trainer runs at start-up. A file edited in place
keeps its permissions; a symbolic link is written through (its target is edited, the link stays).
Errors are one line naming the key and the fix (with --script-names SCRIPT, the launch scripts' positional
arguments for the flags and keys they set: GLOBAL_BATCH, LAYERS, ..., after `SCRIPT: error:`), exit code 2;
`diff` exits 1 when the files differ; output into a closed pipe (`show ... | head`) stops quietly with 141, as cat's.
"""
import argparse
import copy
import glob
import importlib.util
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.arguments import add_model_and_parallel_args, add_packing_args, config_flags
from megatron.config import model_notes, read_ds_config, resolve, strict_json_loads
from megatron.ds_schema import SECTION, default_optimizer, json_notes
from megatron.errors import ConfigError, OneLineParser, run_tool
from megatron.data.default_dataset import default_vocab_file
from megatron.data.tokenizer import add_tokenizer_flags, build_tokenizer, explicit_tokenizer
from megatron.parallel.launch_check import in_script_terms
from megatron.paths import DEFAULT_DATA_DIR, file_in_the_way, in_repository


def implied_world_size(ds_config: dict, flags: dict) -> int:
    """pipeline x sequence-parallel x the data-parallel degree the batch keys imply (1 if they don't).
    A degree that is not a positive integer counts as 1 here: resolve() then names its key."""
    def degree(flag, section: str, key: str) -> int:
        value = ds_config.get(section, {}).get(key) if isinstance(ds_config.get(section), dict) else None
        value = value if flag is None else flag
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1

    pipeline = degree(flags.get("pipeline_parallel_size"), "pipeline", "stages")
    sequence = degree(flags.get("sequence_parallel_size"), SECTION, "size")
    batch = [ds_config.get(key) for key in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                             "gradient_accumulation_steps")]
    data = 1
    if all(isinstance(value, int) and value > 0 for value in batch) and batch[0] % (batch[1] * batch[2]) == 0:
        data = batch[0] // (batch[1] * batch[2])
    return pipeline * sequence * data


def cuda_visible() -> bool:
    """torch.cuda.is_available() as the trainer will see it on this machine, without importing
    torch (seconds): a torch built for CUDA (or ROCm), a GPU device node (NVIDIA's /dev/nvidia0...,
    ROCm's /dev/kfd, WSL2's /dev/dxg), and CUDA_VISIBLE_DEVICES not set empty or to -1."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    if not (os.path.exists("/dev/kfd") or os.path.exists("/dev/dxg") or glob.glob("/dev/nvidia[0-9]*")):
        return False
    spec = importlib.util.find_spec("torch")  # finds the package, imports nothing
    version = Path(spec.origin).with_name("version.py") if spec and spec.origin else None
    return bool(version and version.is_file()
                and re.search(r"^(cuda|hip)\b.*=\s*['\"]\d", version.read_text(), re.MULTILINE))


def resolved(ds_config: dict, args, notes: bool = False) -> dict:
    """The config as the trainer resolves it: its flags, the optimizer it fills, and BigBird's
    seed from --seed as it does; with `notes`, the trainer's start-up notes of the model and of the JSON
    settings that show or change nothing (json_notes) on stderr."""
    ds_config = copy.deepcopy(ds_config)  # `set` writes the file's own keys, not the filled ones
    default_optimizer(ds_config, cuda_visible() if args.cuda is None else args.cuda)  # as deepspeed_settings
    flags = config_flags(args)
    if flags["vocab_size"] is None:  # 0 is refused as -5 is (BertConfig), not taken for "not given"
        flags["vocab_size"] = run_vocab_size(args)
    flags["bigbird_seed"] = args.seed
    world_size = args.world_size if args.world_size is not None else implied_world_size(ds_config, flags)
    if args.deepspeed_check:
        from megatron.quiet import quiet_deepspeed

        quiet_deepspeed()
    config = resolve(flags, ds_config, world_size, deepspeed_check=args.deepspeed_check)
    for note in [*model_notes(config.model, window_given=flags["local_attention_window"] is not None),
                 *json_notes(ds_config)] if notes else ():
        print(note, file=sys.stderr)
    return {"world_size": world_size, "global_batch_size": config.global_batch_size, **config.to_dict()}


def run_vocab_size(args) -> int:
    """The vocab size a run without --vocab-size takes, as the trainer takes it: its --vocab-file's or
    --tokenizer-file's, else the default data's vocab (a run without them trains on the default data); not
    BertConfig's 30522, which `show` printed as what the trainer will use."""
    tokenizer = explicit_tokenizer(args) or build_tokenizer(args.tokenizer_type,
                                                            str(default_vocab_file(args.default_data_dir)))
    return tokenizer.vocab_size


BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def derive_untouched_batch_key(ds_config: dict, assigned: set) -> str | None:
    """`set train_batch_size=16` on a template that fixes micro and grad-acc would contradict them at
    the world size the template was made for: setting the global or the micro batch without grad-acc
    leaves grad-acc to be derived (null), as the trainer derives it, when the JSON fixes the global
    batch as well. Returns the key made null, if any."""
    key = "gradient_accumulation_steps"
    if key in assigned or ds_config.get(key) is None or not assigned & set(BATCH_KEYS):
        return None
    if ds_config.get("train_batch_size") is None:
        return None  # micro x grad-acc x data gives the global batch: nothing contradicts
    ds_config[key] = None
    return key


def assign(ds_config: dict, assignment: str) -> None:
    """Applies one `key.path=value` in place; the value is JSON, or a string if it is not JSON."""
    key, sep, text = assignment.partition("=")
    if not sep or not key:
        raise ConfigError(f"{assignment!r} is not key.path=value", "write e.g. sequence_parallel.size=4")
    try:
        value = strict_json_loads(text, "set", key)  # NaN, Infinity, 1e999: no strict reader accepts them
    except json.JSONDecodeError:
        value = text
    *parents, leaf = parts = key.split(".")
    if any(not part or part != part.strip() for part in parts):  # DeepSpeed would read '' or 'stage ' as another key
        raise ConfigError(f"{key!r} in {assignment!r} has an empty or space-padded key",
                          "write the key path without blanks, e.g. zero_optimization.stage=1")
    node = ds_config
    for depth, part in enumerate(parents):
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            path = ".".join(parents[:depth + 1])
            raise ConfigError(f"{path} holds {json.dumps(node)}, not an object, so {key} cannot be set",
                              f"set {path} itself or pick another key")
    node[leaf] = value


def write_atomically(path: Path, text: str) -> None:
    """Whole file or nothing: a temporary file in the same folder, then os.replace. The folder must
    exist, as for `cp` or `> file`: a mistyped --output makes no folders. A symbolic link is written
    through, as `cp` and `> file` do: its target is replaced, the link stays (os.replace over the
    link would have put a copy in its place and left the file it names as it was)."""
    given = path
    if path.is_symlink():
        path = Path(os.path.realpath(path))
        given = f"{given} (a link to {path})"
    if path.is_dir():
        raise ConfigError(f"output {given} is a directory", "pass a file path to write the JSON to")
    if problem := file_in_the_way(f"output {given}: its folder", str(path.parent)):
        raise ConfigError(problem, "pass a path inside a directory")
    if not path.parent.is_dir():
        raise ConfigError(f"output {given}: its folder {path.parent} does not exist",
                          f"check the path, or create the folder first (mkdir -p {path.parent})")
    temporary = None
    try:
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.chmod(temporary, file_mode(path))  # mkstemp's 0600 would replace the file's own mode
        os.replace(temporary, path)
    except BaseException as error:
        if temporary and os.path.exists(temporary):
            os.unlink(temporary)
        if isinstance(error, OSError):
            raise ConfigError(f"cannot write {given} ({error.strerror or error})",
                              "pass an --output in a folder this user can write") from None
        raise


def file_mode(path: Path) -> int:
    """The mode the written file keeps: the existing file's, else a plain open()'s (0666 less the umask)."""
    if path.exists():
        return path.stat().st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def flatten(value, prefix: str = "") -> dict:
    if isinstance(value, dict) and value:
        items = {}
        for key, child in value.items():
            items.update(flatten(child, f"{prefix}.{key}" if prefix else key))
        return items
    return {prefix: value}


def read_config(args, argument: str = "config") -> dict:
    """The JSON of this command's `argument`, its fixes naming that argument (this tool has no
    --deepspeed_config, whose name the shared reader's fixes give)."""
    return read_ds_config(getattr(args, argument), f"as the {argument} argument of ds_config.py {args.command}")


def show(args) -> int:
    print(json.dumps(resolved(read_config(args), args, notes=True), indent=2, allow_nan=False))
    return 0


def set_keys(args) -> int:
    ds_config = read_config(args)
    for assignment in args.assignments:
        assign(ds_config, assignment)
    derived = derive_untouched_batch_key(ds_config, {text.partition("=")[0] for text in args.assignments})
    config = resolved(ds_config, args)
    text = json.dumps(ds_config, indent=2, allow_nan=False) + "\n"
    if str(args.output) == "-":  # print the result, write nothing (the launch scripts' dry run)
        print(text, end="")
        return 0
    output = args.output or args.config
    write_atomically(output, text)
    if derived:  # once written: an output that cannot be is the only line
        print(f"{derived} set to null: derived at each world size ({config['ds_config'][derived]} at world size "
              f"{config['world_size']})", file=sys.stderr)
    print(output)
    return 0


def validate(args) -> int:
    config = resolved(read_config(args), args, notes=True)
    print(f"{args.config}: valid at world size {config['world_size']}: pipeline {config['pipeline_parallel_size']} "
          f"x data {config['data_parallel_size']} x sequence {config['sequence_parallel_size']}, global batch "
          f"{config['global_batch_size']} = micro {config['micro_batch_size']} x grad-acc "
          f"{config['gradient_accumulation_steps']} x data {config['data_parallel_size']}, "
          f"attention {config['model']['attention']}{_hybrid_layout(config)}, ZeRO stage {config['zero_stage']}"
          + (f", packed samples (segments of up to {config['model']['max_segment_length']} tokens)"
             if config["pack_samples"] else ""))
    return 0


def _hybrid_layout(config: dict) -> str:
    """' (Ulysses 2 x ring 2)' for hybrid attention: the all-to-all groups of adjacent ranks x the ring (none at
    SP 1: plain attention)."""
    if config["model"]["attention"] != "hybrid" or config["sequence_parallel_size"] == 1:
        return ""
    ulysses = config["model"]["ulysses_size"]
    return f" (Ulysses {ulysses} adjacent ranks x ring {config['sequence_parallel_size'] // ulysses})"


def diff(args) -> int:
    first, second = (flatten(read_config(args, name)) for name in ("config", "other"))

    def text(values: dict, key: str) -> str:  # JSON text: true and 1 differ
        return json.dumps(values[key]) if key in values else "(absent)"

    changed = [key for key in sorted(first.keys() | second.keys()) if text(first, key) != text(second, key)]
    for key in changed:
        print(f"{key}: {text(first, key)} -> {text(second, key)}")
    return 1 if changed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="ds_config.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, run, help: str, world_size_required: bool = False) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.add_argument("config", type=Path, help="DeepSpeed JSON file")
        sub.add_argument("--world-size", type=int, required=world_size_required,
                         help="processes the run launches (default: the smallest the JSON fits)")
        sub.add_argument("--seed", type=int, default=1234, help="the trainer's --seed (BigBird's random blocks "
                         "follow it; default 1234, the trainer's)")
        sub.add_argument("--cuda", action=argparse.BooleanOptionalAction,
                         help="the run's machines have CUDA (DeepSpeed's FusedAdam, which the trainer replaces "
                              "by torch's Adam, with a warning, where it cannot be built) or not (torch's Adam: "
                              "optimizer.params.torch_adam); default: this machine's")
        sub.add_argument("--script-names", metavar="SCRIPT",
                         help="name the launch scripts' positional arguments (LAYERS, MICRO_BATCH, GLOBAL_BATCH, ...) "
                              "for the flags and keys they set, in errors, which start with SCRIPT: error: (the "
                              "launch script's name; bert_common.sh)")
        sub.add_argument("--deepspeed-check", action="store_true",
                         help="also run DeepSpeed's own checks of its sections, as the trainer does at start-up "
                              "(imports DeepSpeed: a few seconds)")
        add_model_and_parallel_args(sub)
        add_tokenizer_flags(sub, "the run's vocab.txt: the model's vocab size is its size, as in the trainer "
                            "(default: the default data's vocab, a run's without --data-path; a run from a "
                            "checkpoint or a Hugging Face folder takes its tokenizer: pass that file, or "
                            "--vocab-size)")
        sub.add_argument("--default-data-dir", default=in_repository(DEFAULT_DATA_DIR),
                         help="the trainer's --default-data-dir, whose vocab.txt a run without --vocab-file or "
                              "--tokenizer-file takes (default: %(default)s)")
        add_packing_args(sub.add_argument_group("data packing"))
        sub.set_defaults(run=run)
        return sub

    command("show", show, "print the resolved config: model, parallel layout, batch sizes, with defaults")
    setter = command("set", set_keys, "set key.path=value ... (JSON-typed), validate, write atomically")
    setter.add_argument("assignments", nargs="+", metavar="key.path=value")
    setter.add_argument("-o", "--output", type=Path,
                        help="write here (in an existing folder) instead of editing CONFIG in place; "
                        "'-' prints the result and writes nothing")
    command("validate", validate, "check pipeline x data x sequence and the batch arithmetic at a world size",
            world_size_required=True)
    differ = commands.add_parser("diff", help="print the keys whose values differ (exit 1 if any)")
    differ.add_argument("config", type=Path)
    differ.add_argument("other", type=Path)
    differ.set_defaults(run=diff)
    return parser


def main(argv=None) -> int:
    """The exit code: run_tool's one line for a mistake, a Ctrl-C or a full disk; 141 into a closed pipe."""
    parsed = {}

    def parse_and_run() -> int:
        parsed["args"] = build_parser().parse_args(argv)
        return run(parsed["args"])
    return run_tool(lambda: getattr(parsed.get("args"), "script_names", None) or "ds_config.py", parse_and_run)


def run(args) -> int:
    try:
        return args.run(args)
    except ConfigError as error:  # a launch script's user changes its arguments, which set these flags and keys
        if not getattr(args, "script_names", False):
            raise
        raise ConfigError(in_script_terms(error.problem), in_script_terms(error.fix)) from None


if __name__ == "__main__":
    sys.exit(main())
