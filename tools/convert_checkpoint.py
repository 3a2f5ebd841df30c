"""Converts BERT checkpoints between this trainer and Hugging Face Transformers.

  to-hf    a checkpoint of any pipeline / sequence-parallel degree and ZeRO stage -> a Hugging Face
           folder (config.json, model.safetensors, the tokenizer the checkpoint carries: vocab.txt, or
           tokenizer.json for a Hugging Face tokenizer, and tokenizer_config.json) for
           BertForPreTraining (post-LayerNorm layout) or MegatronBertForPreTraining (pre-LayerNorm);
           *ForMaskedLM when the model has no sentence-order head; ModernBertForMaskedLM for a model
           with the modern layer options (--model-preset modernbert-*). Padded vocab rows are trimmed.
  to-torch a checkpoint of any layout -> one PyTorch file of its fp32 weights (this trainer's parameter
           names), what DeepSpeed's zero_to_fp32.py gives, which cannot read pipeline checkpoints.
  from-hf  a Hugging Face Bert* / MegatronBert* / ModernBert* folder -> a weights-only checkpoint for this
           trainer. Heads the folder lacks are initialised, listed in one warning line and recorded in
           the checkpoint (to-hf and fill_mask.py name them again until a training run saves). A
           larger --max-position-embeddings extends the 512 learned positions by repeating them
           (--no-position-extension refuses instead).
"""
import argparse
import os
import sys
import warnings
from pathlib import Path

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import ConfigError, OneLineParser, run_tool, start_up_stops_in_one_line
from megatron.quiet import quiet_deepspeed

with start_up_stops_in_one_line("convert_checkpoint.py"):  # Ctrl-C during the seconds of imports: one line
    quiet_deepspeed()  # before DeepSpeed is first imported (megatron.checkpoint imports it)
    from megatron import hf_convert
    from megatron.checkpoint import (PARTIAL, checkpoint_folder, chosen_tag, declared_positions, read_from,
                                    stored_config)
    from megatron.checkpoint_compat import attention_change
    from megatron.checkpoint_weights import bert_state_from_checkpoint
    from megatron.data.tokenizer import HFTokenizer, add_tokenizer_flags, check_fits
    from megatron.data.tokenizer_identity import checkpoint_tokenizer
    from megatron.flag_checks import check_no_empty_values
    from megatron.hf_io import torch_save, undone_on_failure
    from megatron.model.bert import BertConfig
    from megatron.paths import save_into_weights_folder, where_in


def refuse_output_in_checkpoint(args) -> None:
    """An --output in the --load folder would be lost with it: resumes and --keep-last remove iter_*
    folders (an export inside one goes with it, unsaid), and anything else there is a stranger among the
    checkpoint's files."""
    where = where_in(args.output, args.load)
    if where:
        raise ConfigError(f"--output {args.output} is {where} checkpoint folder --load {args.load} (resumes and "
                          "--keep-last remove its iter_* folders, and whatever lies in them)",
                          f"pick an --output outside {args.load}")


def to_hf(args) -> None:
    refuse_output_in_checkpoint(args)
    tag = chosen_tag(args.load, args.tag)
    stored = stored_config(args.load, tag)["model"]
    config = BertConfig(**{**stored, "max_position_embeddings": declared_positions(args.load, tag)})
    tokenizer = checkpoint_tokenizer(args, checkpoint_folder(args.load, tag))
    state = bert_state_from_checkpoint(args.load, tag)
    if isinstance(tokenizer, HFTokenizer):
        hf_convert.save_hf_folder(args.output, state, config, hf_tokenizer=tokenizer)
    else:
        hf_convert.save_hf_folder(args.output, state, config, tokenizer.file, tokenizer.lower_case)
    change = attention_change(args.load, vars(config), {**vars(config), "attention": "dense"},
                              user="the Hugging Face model")
    if change:  # once written (an error stays the only line): the weights carry over, BigBird's pattern does not
        warnings.warn(f"{change} (the export suits fine-tuning with dense attention)")
    if config.max_position_embeddings < stored["max_position_embeddings"]:  # once written, as the others
        warnings.warn(f"{args.load} stores max_position_embeddings {stored['max_position_embeddings']} (a "
                      "--model-preset's, stored before runs from scratch stored their length), which its rotary "
                      f"model never trained at: the export declares its --seq-length {config.seq_length}")
    untrained = hf_convert.untrained_warning(args.load, tag)
    if untrained:  # once written: an error stays the only line
        warnings.warn(f"{untrained}; the export carries them as they are (train from the checkpoint first, or "
                      "convert a Hugging Face folder that has them)")
    print(f"wrote {hf_convert.read_hf_config(args.output)['architectures'][0]} "
          f"({config.num_layers} layers, hidden {config.hidden_size}) of {read_from(args.load, tag)} to {args.output}")


def to_torch(args) -> None:
    refuse_output_in_checkpoint(args)
    if os.path.lexists(args.output):
        raise ConfigError(f"--output {args.output} exists", "choose another --output, or remove it")
    if args.output.endswith(("/", os.sep)):  # a folder's name: torch.save would write into a file named '.partial'
        raise ConfigError(f"--output {args.output} names a folder, and to-torch writes one file",
                          f"pass a file path, e.g. --output {os.path.join(args.output, 'bert.pt')}")
    tag = chosen_tag(args.load, args.tag)
    state = bert_state_from_checkpoint(args.load, tag)
    output = Path(args.output)
    with undone_on_failure(f"cannot write {output}", "--output", output, output.parent) as made:
        made.append(output.with_name(output.name + PARTIAL))  # no half-written file under the name asked for
        torch_save(state, made[-1])
        os.replace(made[-1], output)
    print(f"wrote {len(state)} fp32 tensors of {read_from(args.load, tag)} to {args.output} (torch.load gives the "
          "state dict of megatron.model.bert.BertModel)")


def check_from_hf(args, positions: int, rope: bool) -> None:
    """The flags against the folder (`positions`: its config's max_position_embeddings): --save outside
    it; no table shorter than the folder's (it would drop positions); no --seq-length beyond the
    checkpoint's positions (the stored length is the one the model was trained at, from which
    tools/extend_context.py scales rope: the folder's unless set), nor, for `rope` weights, a --seq-length
    or --max-position-embeddings beyond the folder's: they have no table a longer length was stretched
    into, so it would only misstate their training (to-hf declares it), and extend_context.py would scale
    the theta from the wrong length."""
    inside = save_into_weights_folder(args.save, args.hf_dir, "--hf-dir")
    if inside:
        raise ConfigError(inside, "choose another --save")
    hf_convert.refuse_save_with_checkpoint(args.save)
    for flag in ("--max-position-embeddings", "--seq-length", "--make-vocab-size-divisible-by"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value} must be >= 1", f"pass {flag} 1 or more, or drop it")
    declared = f"the {positions} positions {Path(args.hf_dir) / 'config.json'} declares"
    if args.max_position_embeddings is not None and args.max_position_embeddings < positions:
        raise ConfigError(f"--max-position-embeddings {args.max_position_embeddings} is below {declared}",
                          f"pass {positions} or more, or drop it")
    for flag, value in (("--seq-length", args.seq_length), ("--max-position-embeddings", args.max_position_embeddings)):
        if rope and value is not None and value > positions:  # no table to stretch: it would only misstate
            raise ConfigError(f"{flag} {value} is above {declared}, the length its rotary model was trained at (the "
                              "stored length, which tools/extend_context.py scales the rope theta from, and the "
                              "export declares)", f"drop {flag}; to train longer, pass --seq-length {value} to the "
                              f"run, or continue with tools/extend_context.py --from {args.hf_dir} --seq-length "
                              f"{value}")
    if args.seq_length is not None and args.seq_length > (args.max_position_embeddings or positions):
        limit = (f"--max-position-embeddings {args.max_position_embeddings}" if args.max_position_embeddings
                 else declared)
        raise ConfigError(f"--seq-length {args.seq_length} is above {limit} (the stored length is the one the "
                          "model was trained at)", f"drop --seq-length (the folder's {positions} is stored), or "
                          "raise --max-position-embeddings with it")


def from_hf(args) -> None:
    fields = hf_convert.bert_fields_from_hf(hf_convert.read_hf_config(args.hf_dir))
    if args.no_position_extension and fields.get("position_embedding_type") == "rope":
        raise ConfigError(f"--no-position-extension has no effect on {args.hf_dir}: its positions are rotary, with "
                          "no table to extend", "drop --no-position-extension")
    positions = fields.get("max_position_embeddings", BertConfig.max_position_embeddings)
    rope = fields.get("position_embedding_type") == "rope"
    check_from_hf(args, positions, rope)
    tokenizer = hf_convert.read_hf_tokenizer(args.hf_dir)  # before the weights: an unreadable one stops here
    for name in ("max_position_embeddings", "make_vocab_size_divisible_by"):
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    fields["seq_length"] = positions if args.seq_length is None else args.seq_length
    with warnings.catch_warnings(record=True) as held:  # said once written: an error stays the only line
        config = hf_convert.without_refused_dropout(BertConfig(**fields), args.hf_dir)
        if tokenizer is not None:  # before the weights are read: every tool would refuse the checkpoint
            check_fits(tokenizer, config.vocab_size, f"put the model's own tokenizer in {args.hf_dir} (one of at "
                       f"most {config.vocab_size} tokens, the rows of its embedding)")
        state, initialised = hf_convert.load_hf_weights(args.hf_dir, config,
                                                        extend_positions=not args.no_position_extension)
        hf_convert.save_weights_only_checkpoint(args.save, state, config, tokenizer, initialised)
    if tokenizer is None:
        warnings.warn(f"{args.hf_dir} holds no vocab.txt or tokenizer.json, so the checkpoint carries no tokenizer: "
                      "pass --vocab-file or --tokenizer-file to pretrain_bert.py, to-hf and fill_mask.py with it")
    for warning in held:
        warnings.warn(warning.message)
    positions = (f"rotary positions, trained at {config.seq_length} tokens" if rope else
                 f"{config.max_position_embeddings} positions")
    print(f"wrote a weights-only checkpoint ({config.layernorm_layout}-LayerNorm, {config.num_layers} layers, "
          f"{positions}) to {args.save}")


class OtherCommandsFlag(argparse.Action):
    """A flag of the other direction (to-hf --save, from-hf --output): one line naming this command's own,
    not argparse's "the following arguments are required" about the flag the user meant to give."""

    def __init__(self, option_strings, dest, says: str):
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS)
        self.says = says

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} {self.says}")


# command -> {the other command's flag: what it is there; what this command takes instead}
OTHER_COMMANDS_FLAGS = {
    "to-hf": {"--save": "is from-hf's (the checkpoint it writes); to-hf writes the Hugging Face folder to --output DIR",
              "--hf-dir": "is from-hf's (the Hugging Face folder it reads); to-hf writes the Hugging Face folder to "
                          "--output DIR"},
    "from-hf": {"--output": "is to-hf's (the Hugging Face folder it writes); from-hf writes the checkpoint to "
                            "--save DIR",
                "--load": "is to-hf's (the checkpoint it reads); from-hf reads the Hugging Face folder from "
                          "--hf-dir DIR"}}


PATH_FLAGS = {"load": "--load", "output": "--output", "hf_dir": "--hf-dir", "save": "--save", "tag": "--tag",
              "vocab_file": "--vocab-file", "tokenizer_file": "--tokenizer-file"}  # '' is none of them (an unset $DIR)


def main(argv=None) -> None:
    parser = OneLineParser(prog="convert_checkpoint.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("to-hf", help="this trainer's checkpoint -> Hugging Face folder")
    export.add_argument("--load", required=True, help="checkpoint directory (written by --save)")
    export.add_argument("--tag", help="checkpoint tag, e.g. iter_0001000 or its iteration 1000 "
                        "(default: the one in 'latest')")
    add_tokenizer_flags(export, "the vocab.txt the model was trained with (default: the one the checkpoint "
                        "carries; needed for one that carries none)")
    export.add_argument("--output", required=True, help="Hugging Face folder to create (must not exist)")
    export.set_defaults(run=to_hf)
    plain = commands.add_parser("to-torch", help="this trainer's checkpoint -> one PyTorch state-dict file")
    plain.add_argument("--load", required=True, help="checkpoint directory (written by --save)")
    plain.add_argument("--tag", help="checkpoint tag, e.g. iter_0001000 or its iteration 1000 "
                       "(default: the one in 'latest')")
    plain.add_argument("--output", required=True, help="file to write (must not exist), e.g. bert.pt")
    plain.set_defaults(run=to_torch)
    load = commands.add_parser("from-hf", help="Hugging Face folder -> weights-only checkpoint")
    load.add_argument("--hf-dir", required=True,
                      help="folder with config.json and model.safetensors / pytorch_model.bin")
    load.add_argument("--save", required=True, help="checkpoint directory to create")
    load.add_argument("--max-position-embeddings", type=int,
                      help="target positions, at least the HF config's (default: the HF config's)")
    load.add_argument("--seq-length", type=int, help="the length the model was trained at, stored in the config "
                      "(default: the HF config's max_position_embeddings; at most the positions)")
    load.add_argument("--make-vocab-size-divisible-by", type=int, help="vocab padding multiple (default 128)")
    load.add_argument("--no-position-extension", action="store_true",
                      help="refuse a --max-position-embeddings above the checkpoint's instead of repeating positions")
    load.set_defaults(run=from_hf)
    for command, parser_of in (("to-hf", export), ("from-hf", load)):
        for flag, says in OTHER_COMMANDS_FLAGS[command].items():
            parser_of.add_argument(flag, action=OtherCommandsFlag, says=says)
    args = parser.parse_args(argv)
    check_no_empty_values(args, {dest: flag for dest, flag in PATH_FLAGS.items() if dest in vars(args)})
    args.run(args)


if __name__ == "__main__":
    sys.exit(run_tool("convert_checkpoint.py", main, one_line_warnings=True))
