"""Megatron-style command-line flags of pretrain_bert.py: model, attention, parallel layout, training, data, run.

Every model / parallel / optimizer flag defaults to None ("not given") so that megatron.config can let
the DeepSpeed JSON (or a preset, a Hugging Face folder) fill what the command line leaves out; their real
defaults live in BertConfig / TrainConfig. The flags nothing else sets have argparse defaults, stated in
their help: the schedule's shape (--lr-decay-style, --lr-warmup-fraction), --seed, the data flags (--split,
--data-impl, --mask-prob, --default-data-dir) and the run's (evaluation and log intervals, --log-dir, timeouts).
"""
import argparse
import sys
import time

from megatron.data.tokenizer import add_tokenizer_flags
from megatron.errors import ConfigError, OneLineParser
from megatron.flag_habits import TRAINER_HABITS
from megatron.model.args import MODEL_PRESETS
from megatron.model.fields import dest_to_field, flag_of, info
from megatron.parallel.launch_env import (PRINTER_WAIT, launcher_rank, note_rank_0_state, outlive_rank_0,
                                          prints_for_its_node)
from megatron.paths import DEFAULT_DATA_DIR, DEFAULT_LOG_DIR, in_repository
from megatron.schedule import DECAY_STYLES, DEFAULT_WARMUP_FRACTION, WSD_DECAY_STYLES

# flags that megatron.config reads by their destination's name but that set no field: the preset (its
# fields), the global batch size (DeepSpeed's train_batch_size). The fields' flags: fields.dest_to_field.
NOT_FIELD_FLAGS = ("model_preset", "global_batch_size")


class AliasOf(argparse.Action):
    """A flag that stands for another's value (--swiglu: --mlp-type swiglu). It notes the value the
    other flag had given before it, so that config_flags refuses the two with different values, in
    either order, rather than letting the last one win."""

    def __init__(self, option_strings, dest, const, help=None):
        super().__init__(option_strings, dest, nargs=0, const=const, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        aliases = getattr(namespace, "aliases", None) or {}
        before = getattr(namespace, self.dest, None)
        if self.dest in aliases and before == self.const:  # the alias again: keep what came before it
            before = aliases[self.dest][2]
        namespace.aliases = {**aliases, self.dest: (option_string, self.const, before)}
        setattr(namespace, self.dest, self.const)


class Switch(argparse.Action):
    """One of two opposite flags of one setting (--add-bias-linear / --disable-bias-linear): it notes the
    flag given, so that config_flags refuses both together, in either order, rather than letting the last
    one win silently."""

    def __init__(self, option_strings, dest, const, help=None):
        super().__init__(option_strings, dest, nargs=0, const=const, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        switches = getattr(namespace, "switches", None) or {}
        namespace.switches = {**switches, self.dest: {**switches.get(self.dest, {}), self.const: option_string}}
        setattr(namespace, self.dest, self.const)


def add_model_and_parallel_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    model = parser.add_argument_group("model")
    model.add_argument("--num-layers", type=int, help="transformer layers (default 12)")
    model.add_argument("--hidden-size", type=int, help="hidden size h (default 768)")
    model.add_argument("--num-attention-heads", type=int, help="attention heads (default 12)")
    model.add_argument("--ffn-hidden-size", type=int, help="MLP inner size (default 4h)")
    model.add_argument("--seq-length", type=int, help="tokens per sample (default 512, or less where the weights the "
                       "run starts from reach less; a resume: the checkpoint's, another one given is a warning)")
    model.add_argument("--max-position-embeddings", type=int, help="position table size (default 512); with rope, no "
                       "table: the trained length the Hugging Face export declares (default --seq-length)")
    model.add_argument("--vocab-size", type=int, help="vocab size before padding (default: from the vocab file)")
    model.add_argument("--make-vocab-size-divisible-by", type=int, help="pad the vocab to a multiple (default 128)")
    model.add_argument("--hidden-dropout", type=float, help="dropout after embeddings, attention, MLP (default 0.1)")
    model.add_argument("--attention-dropout", type=float, help="dropout on attention probabilities (default 0.1, but 0 "
                       "for ring, hybrid, bigbird and models with local layers, which refuse it)")
    model.add_argument("--init-method-std", type=float, help="init std (default 0.02)")
    model.add_argument("--layernorm-epsilon", type=float, help="LayerNorm epsilon (default 1e-5)")
    model.add_argument("--layernorm-layout", choices=["pre", "post"],
                       help="pre: Megatron x + f(LN(x)), exports as HF MegatronBert (default); post: original BERT "
                            "LN(x + f(x)), HF Bert")
    model.add_argument("--bert-no-binary-head", dest="add_binary_head", action="store_const", const=False,
                       help="drop the sentence-order head and its loss")
    model.add_argument("--no-embedding-layernorm", dest="embedding_layernorm", action=Switch, const=False,
                       help="no LayerNorm after the embeddings (the default with --layernorm-layout pre: "
                            "Megatron's layout, HF MegatronBert)")
    model.add_argument("--embedding-layernorm", dest="embedding_layernorm", action=Switch, const=True,
                       help="a LayerNorm after the embeddings (the default with --layernorm-layout post, as HF "
                            "Bert; with pre it has no Hugging Face equivalent and is refused on export)")
    model.add_argument("--type-vocab-size", type=int, help="token types (default 2: sentence A and B); 0: no "
                       "token-type embedding (ModernBERT)")

    modern = parser.add_argument_group(
        "modern encoder layers (classic Megatron BERT when none is given; a preset sets them all)")
    modern.add_argument("--model-preset", choices=sorted(MODEL_PRESETS),
                        help="the model fields of a published architecture (modernbert-base: 22 layers, hidden "
                             "768, 12 heads, ffn 1152; modernbert-large: 28 x 1024 x 16, ffn 2624; both: rope "
                             "160000 / local 10000, window 128 with a global layer every 3rd, GeGLU, no biases, "
                             "LayerNorm eps 1e-5 after the embeddings, pre-LN, no attention norm in layer 0, no "
                             "token types, no sentence-order head, no dropout, the vocab padded to a multiple of 64; "
                             "its size is the vocab file's, as without a preset); any flag given overrides its "
                             "field; the JSON's sequence_parallel.model_preset may name the same preset, not another")
    modern.add_argument("--position-embedding-type", choices=["learned", "rope"],
                        help="learned: a table of --max-position-embeddings rows (default); rope: rotary q and k "
                             "from each token's position in its segment, no table")
    modern.add_argument("--rotary-base", type=float, help="rope theta of the global layers (default 10000; "
                        "ModernBERT 160000)")
    modern.add_argument("--local-rotary-base", type=float, help="rope theta of the local (sliding-window) layers "
                        "(default 10000)")
    modern.add_argument("--local-attention-window", type=int, help="even W: local layers let a query see the keys "
                        "within W/2 positions on each side, in its own segment (ModernBERT 128; default: none, every "
                        "layer global)")
    modern.add_argument("--global-attention-every", type=int, help="with --local-attention-window: layer i is global "
                        "when i %% N == 0, local otherwise (ModernBERT 3; default 1: every layer global)")
    modern.add_argument("--mlp-type", choices=["gelu", "geglu", "swiglu"],
                        help="gelu: h -> ffn -> h (default); geglu / swiglu: gated, h -> 2 x ffn, act(first half) x "
                             "second half, ffn -> h (ffn: --ffn-hidden-size, the width after gating)")
    modern.add_argument("--swiglu", dest="mlp_type", action=AliasOf, const="swiglu",
                        help="same as --mlp-type swiglu (Megatron's flag)")
    modern.add_argument("--disable-bias-linear", dest="add_bias_linear", action=Switch, const=False,
                        help="no biases in the linear layers of the layers and heads, nor in the norms (the LM "
                             "decoder keeps its bias)")
    modern.add_argument("--add-bias-linear", dest="add_bias_linear", action=Switch, const=True,
                        help="biases in the linear layers and norms (the default; overrides a preset)")
    modern.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"],
                        help="every norm of the model (default LayerNorm; eps: --layernorm-epsilon)")
    modern.add_argument("--no-first-layer-attention-norm", dest="first_layer_attention_norm", action=Switch,
                        const=False, help="layer 0 has no norm before its attention (ModernBERT; pre-LN only)")
    modern.add_argument("--first-layer-attention-norm", dest="first_layer_attention_norm", action=Switch,
                        const=True, help="layer 0 has a norm before its attention (the default; overrides a preset)")

    attn = parser.add_argument_group("attention (also from the JSON's sequence_parallel section)")
    attn.add_argument("--attention", help="variant: dense, ring, ulysses, hybrid, linformer, bigbird")
    attn.add_argument("--ulysses-size", type=int, help="hybrid: seq ranks per all-to-all group (adjacent ranks, "
                      "one node); the ring spans --sequence-parallel-size / this many groups (default: the largest "
                      "divisor of the SP size and the heads, at most 8)")
    attn.add_argument("--linformer-k", type=int, help="linformer: projected length k (default 256)")
    attn.add_argument("--linformer-share-heads", action="store_const", const=True,
                      help="linformer: one projection for all heads")
    attn.add_argument("--linformer-share-kv", action="store_const", const=True,
                      help="linformer: the same projection for keys and values")
    attn.add_argument("--bigbird", dest="attention", action=AliasOf, const="bigbird",
                      help="select bigbird attention (same as --attention bigbird)")
    attn.add_argument("--block-size", type=int, help="bigbird: block size B (default 64)")
    attn.add_argument("--bigbird-num-random-blocks", type=int, help="bigbird: random blocks per row (default 2)")
    attn.add_argument("--bigbird-num-window-blocks", type=int, help="bigbird: window blocks, odd (default 3)")

    par = parser.add_argument_group("parallelism and batch")
    par.add_argument("--sequence-parallel-size", type=int, help="ranks that split one sequence (default 1)")
    par.add_argument("--pipeline-model-parallel-size", type=int, help="pipeline stages (default 1)")
    par.add_argument("--micro-batch-size", type=int, help="samples per data-parallel rank per micro-step "
                     "(default: the JSON's train_micro_batch_size_per_gpu, else derived from the global batch, else 1)")
    par.add_argument("--global-batch-size", type=int, help="samples per optimizer step over all data-parallel ranks "
                     "(default: the JSON's train_batch_size, else micro x gradient_accumulation_steps x data-parallel "
                     "size)")

    memory = parser.add_argument_group("memory")
    memory.add_argument("--checkpoint-activations", action="store_true",
                        help="recompute transformer layers in backward (DeepSpeed activation checkpointing)")
    memory.add_argument("--checkpoint-num-layers", type=int,
                        help="with --checkpoint-activations (or the JSON's activation_checkpointing section): "
                             "transformer layers per checkpointed chunk (default 1)")
    speed = parser.add_argument_group("speed")
    speed.add_argument("--compile-mlp", action="store_true", default=None,
                       help="torch.compile each layer's MLP sublayer: fused bias-GELU and bias-dropout-add "
                            "(benchmarks/RESULTS.md: what it buys; the first steps pay the compile)")
    return parser


def config_flags(args: argparse.Namespace) -> dict:
    """The given flags as config field values (None where not given)."""
    dests = {**dest_to_field(), **{dest: dest for dest in NOT_FIELD_FLAGS}}
    values = {field: getattr(args, dest, None) for dest, field in dests.items()}
    for dest, (alias, const, before) in (getattr(args, "aliases", None) or {}).items():
        other = before if before not in (None, const) else getattr(args, dest)
        if other != const:
            flag = flag_of(dests[dest])
            raise ConfigError(f"{alias} and {flag} {other} contradict each other ({alias} is {flag} {const})",
                              "pass one of them")
    for dest, given in (getattr(args, "switches", None) or {}).items():
        if len(given) > 1:  # both of a pair: the last would win silently
            first, second = given.values()
            raise ConfigError(f"{first} and {second} contradict each other", "pass one of them")
    if getattr(args, "checkpoint_activations", False):
        values["activation_checkpoint_interval"] = args.checkpoint_num_layers or 1
    else:  # the chunks of the JSON's activation_checkpointing section, which turns recompute on too (config.resolve)
        values["checkpoint_num_layers"] = getattr(args, "checkpoint_num_layers", None)
    values["gradient_clipping"] = getattr(args, "clip_grad", None)  # DeepSpeed's key, which --clip-grad overrides
    return values


def flag_setting(field: str, value) -> str:
    """The command line that sets model field `field` to `value` ('--hidden-size 128',
    '--disable-bias-linear'), for errors about a field the user may have set by another route."""
    facts = info(field)
    setting = ((facts.on_flag if value else facts.off_flag) if isinstance(value, bool)
               else facts.flag and f"{facts.flag} {value}")
    if setting is None:
        raise ValueError(f"no flag sets {field} to {value!r}")  # e.g. add_binary_head True: the default, no flag
    return setting


def add_packing_args(group) -> None:
    """--pack-samples and --max-segment-length (also the JSON's sequence_parallel.pack_samples and
    .max_segment_length): in the trainer's data group and in tools/ds_config.py, which checks them."""
    group.add_argument("--pack-samples", action=Switch, const=True,
                       help="pack several segments ([CLS] A [SEP] B [SEP], each with its own positions from 0, "
                            "sentence-order label and masking) into each sample until the sequence is full, "
                            "each attending only to itself: most of a long sequence is real tokens, not padding")
    group.add_argument("--no-pack-samples", dest="pack_samples", action=Switch, const=False,
                       help="one segment per sample, padded (overrides the JSON's sequence_parallel.pack_samples)")
    group.add_argument("--max-segment-length", type=int,
                       help="with --pack-samples: tokens of the longest segment (default: the smaller of "
                            "--seq-length and --max-position-embeddings; with rope, --seq-length); --seq-length "
                            "may then exceed --max-position-embeddings")


def _decay_style(name: str) -> str:
    """--lr-decay-style: WSD in any case (Megatron's scripts write it upper-case)."""
    return "WSD" if name.lower() == "wsd" else name


def add_training_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    train = parser.add_argument_group("training")
    train.add_argument("--train-iters", type=int, help="optimizer steps to train (or --train-samples)")
    train.add_argument("--train-samples", type=int, help="samples to train on; steps = samples / global batch")
    # optimizer flags default to None ("not given"): given ones override the JSON's optimizer.params,
    # which override the defaults (ds_schema.OPTIMIZER_DEFAULTS)
    train.add_argument("--lr", type=float, help="peak learning rate (default: the JSON's optimizer.params.lr, "
                       "else 1e-4)")
    train.add_argument("--min-lr", type=float, help="learning rate at the end of a linear or cosine decay (default 0)")
    train.add_argument("--lr-decay-style", choices=DECAY_STYLES, default="linear", type=_decay_style,
                       help="decay after warm-up (default linear): linear / cosine to --min-lr over the decay, "
                            "constant, inverse-square-root, or WSD (warmup-stable-decay: constant, then the last "
                            "--lr-wsd-decay-iters steps annealed)")
    train.add_argument("--lr-warmup-fraction", type=float,
                       help=f"fraction of the steps with linear warm-up from 0 (default {DEFAULT_WARMUP_FRACTION} "
                            "unless --lr-warmup-iters)")
    train.add_argument("--lr-warmup-iters", type=int, help="steps of linear warm-up from 0 (or --lr-warmup-fraction)")
    train.add_argument("--lr-decay-iters", type=int,
                       help="the step at which the decay reaches --min-lr, held after it (default --train-iters)")
    train.add_argument("--lr-wsd-decay-iters", type=int,
                       help="WSD: steps of the final anneal, ending at --lr-decay-iters (or --train-iters)")
    train.add_argument("--lr-wsd-decay-style", choices=WSD_DECAY_STYLES,
                       help="WSD: the anneal's shape (default exponential; minus_sqrt is ModernBERT's 1-sqrt)")
    train.add_argument("--weight-decay", type=float,
                       help="AdamW weight decay of the weight matrices and embeddings; biases and norm weights get "
                       "none, as in Megatron (default: the JSON's, else 0.01)")
    train.add_argument("--adam-beta1", type=float, help="Adam beta1 (default: the JSON's betas[0], else 0.9)")
    train.add_argument("--adam-beta2", type=float, help="Adam beta2 (default: the JSON's betas[1], else 0.999)")
    train.add_argument("--adam-eps", type=float, help="Adam epsilon (default: the JSON's eps, else 1e-8)")
    train.add_argument("--clip-grad", type=float, help="gradient-norm clipping (default: the JSON's "
                       "gradient_clipping, else 1.0; 0 turns it off)")
    train.add_argument("--seed", type=int, default=1234,
                       help="seed of initialisation, masking, sampling (default 1234)")
    train.add_argument("--deterministic", action="store_true",
                       help="bit-exact reruns on GPU: deterministic kernels, no TF32, fixed cuBLAS workspace and "
                       "NCCL algorithm (slower; CPU runs are bit-exact without it)")

    data = parser.add_argument_group("data")
    data.add_argument("--data-path", nargs="+", help="PREFIX or W1 PREFIX1 W2 PREFIX2 ... of preprocessed "
                      ".bin/.idx data (default: the embedded sample corpus, built on first use)")
    data.add_argument("--split", default="969,30,1", help="train,valid,test document split (default 969,30,1)")
    add_tokenizer_flags(data, "WordPiece vocab.txt (default: the one a --load checkpoint carries, "
                        "else the embedded corpus' vocab)", "; default: the one a --load checkpoint carries")
    data.add_argument("--data-cache-path", metavar="DIR",
                      help="writable folder for the index maps (default: next to the data; needed when the data is "
                           "on a read-only mount; maps are named by the data's contents, so later runs reuse them)")
    data.add_argument("--data-impl", default="mmap", choices=["mmap", "cached", "lazy"],
                      help="indexed dataset format (default mmap)")
    data.add_argument("--mask-prob", type=float, default=0.15, help="fraction of tokens masked for MLM (default 0.15)")
    data.add_argument("--short-seq-prob", type=float, default=0.1,
                      help="share of samples whose target length is drawn shorter than the sequence, as Megatron's "
                           "BERT data does (default 0.1; 0: every sample fills the sequence)")
    data.add_argument("--whole-word-masking", action="store_true",
                      help="mask whole words: all pieces of a word are masked together (default: each piece "
                           "on its own); words by the tokenizer's own rule: WordPiece '##' continuations, the "
                           "word-start marker of a byte-level BPE (ModernBERT, RoBERTa) or a Metaspace "
                           "(SentencePiece) tokenizer (docs/data.md)")
    add_packing_args(data)
    data.add_argument("--num-workers", type=int,
                      help="DataLoader processes per rank that build the next micro-batches while a step runs "
                           "(default: 2 with CUDA, 0 without: on CPU they take cores from the step; 0 builds each "
                           "micro-batch in the rank when it is read); the batches are the same whatever the number")
    default_data = in_repository(DEFAULT_DATA_DIR)
    data.add_argument("--default-data-dir", default=default_data,
                      help="where the embedded corpus, vocab and preprocessed data are built (default: "
                           f"{default_data}, in this repository whatever the current folder; a read-only "
                           "checkout: give a folder this user can write)")

    run = parser.add_argument_group("checkpoints, evaluation, logging")
    run.add_argument("--save", help="checkpoint directory")
    run.add_argument("--load", help="checkpoint directory to resume from (its 'latest' tag); a weights-only "
                     "checkpoint (tools/convert_checkpoint.py from-hf) starts a new run from its weights; the --save "
                     "folder itself before its first checkpoint: start from scratch (a requeued job resumes)")
    run.add_argument("--finetune", action="store_true", help="with --load: start a new run from the checkpoint's "
                     "weights (iteration 0, a fresh optimizer, schedule and RNG; any layout), as for a weights-only "
                     "one")
    run.add_argument("--no-load-rng", action="store_true", help="with --load: go on without the checkpoint's RNG "
                     "states (e.g. a lost rng_rank*.pt); the run is then no longer bit-exact (one warning)")
    run.add_argument("--override-data-settings", action="store_true", help="with --load: resume on other data "
                     "settings than the checkpoint records (--data-path's text or weights, --split, --seed, "
                     "--short-seq-prob, the masking), one warning naming them; without it such a resume is refused (a "
                     "--save folder another run left)")
    run.add_argument("--init-from-hf", metavar="DIR", help="start from a Hugging Face Bert* / MegatronBert* / "
                     "ModernBert* folder; its config fills the model flags not given, heads it lacks are initialised; "
                     "with --load DIR: resumes DIR instead once it holds a checkpoint (one command for a job's "
                     "first run and its requeues)")
    run.add_argument("--no-position-extension", action="store_true", help="with --init-from-hf: refuse a "
                     "--max-position-embeddings above the folder's instead of repeating its learned positions")
    run.add_argument("--skip-nan-batches", action="store_true", help="skip the update of a step whose loss or "
                     "gradients are NaN/inf and go on; 5 such steps in a row still stop the run (default: stop at "
                     "the first, naming the last checkpoint whose loss was in range)")
    run.add_argument("--save-interval", type=int, help="steps between checkpoints (always saved at the end)")
    run.add_argument("--exit-duration-in-mins", type=float,
                     help="stop after the first step that ends this many minutes after start-up, saved (with "
                          "--save), exit 0: a job's time limit; the same command with --load resumes")
    run.add_argument("--launched-by", choices=("extend_context.py",), help="set by the tool whose command "
                     "launched this run: the lines on how to go on (a stop, a lost rank, a NaN) name that "
                     "command, which restates the layout and model flags --load alone does not take")
    run.add_argument("--keep-last", type=int, metavar="N", help="after each save, remove the --save folder's "
                     "older iter_* checkpoints beyond the newest N (never the one 'latest' names; default: keep all)")
    run.add_argument("--eval-interval", type=int, default=1000, help="steps between validation runs (default 1000)")
    run.add_argument("--eval-iters", type=int, default=10,
                     help="validation / test micro-steps per evaluation (default 10); 0: no evaluation, as in "
                          "Megatron-LM (no validation or test data is built or read)")
    run.add_argument("--log-interval", type=int, default=10, help="steps between log lines (default 10)")
    run.add_argument("--log-dir", default=DEFAULT_LOG_DIR,
                     help="metrics.jsonl and loss.png go here (default runs/bert, or the next free runs/bert-N "
                          "when runs/bert holds another run's logs)")
    run.add_argument("--tensorboard-dir", help="write TensorBoard scalars here (needs the tensorboard package)")
    run.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    run.add_argument("--rendezvous-timeout", type=float, default=300, metavar="SECONDS",
                     help="how long the ranks wait at start-up for all of them to reach MASTER_ADDR:MASTER_PORT "
                          "before failing with one line naming how many arrived (default 300)")
    run.add_argument("--distributed-timeout-minutes", type=float, default=10, metavar="MINUTES",
                     help="how long a collective waits for the other ranks before the run ends with one line "
                          "naming the phase and the last checkpoint: a frozen or hung rank then stops the run "
                          "instead of stalling it, and a stop signal is honoured once it ends (Megatron-LM's flag "
                          "and default, 10; fractions allowed). It must cover the slowest step: the first (kernel "
                          "builds) and a checkpoint save on a slow disk")
    return parser


def flags_given(parser: argparse.ArgumentParser, argv: list) -> list:
    """(the flag as written, its action) for each option `argv` names as argparse reads it: the name,
    --name=value, or an unambiguous prefix (allow_abbrev: --loa is --load). For tools that set some of
    the trainer's flags themselves and refuse them after `--` (the last flag would win silently)."""
    options, given = parser._option_string_actions, []
    for token in argv:
        name = token.split("=", 1)[0]
        matches = [name] if name in options else [option for option in options if option.startswith(name)]
        if token.startswith("--") and len(matches) == 1:
            given.append((name, options[matches[0]]))
    return given


class OncePerRunParser(OneLineParser):
    """An ArgumentParser whose usage, help and error lines are printed by global rank 0 and by each other
    node's first rank (prints_for_its_node), not by every rank: the launcher starts every rank with the same
    command line, so the ranks of a node fail alike (exit code 2) and one copy says it all, while a node whose
    ranks alone refuse (a path missing there) says why in its own output. The other ranks do not exit before
    rank 0 prints (outlive_rank_0)."""

    def _print_message(self, message, file=None):
        if message and prints_for_its_node():
            (file or sys.stderr).write(message)
            (file or sys.stderr).flush()

    def exit(self, status=0, message=None):
        if status and message and launcher_rank() == 0:  # the other nodes read it (deepspeed_command.py)
            note_rank_0_state(message.strip().splitlines()[-1])
        if status and launcher_rank() != 0:
            since = time.monotonic()
            if message:  # a node launched with other flags: the ranks waiting at rank 0's rendezvous end at once
                from megatron.parallel.device import post_refusal  # torch: imported already (build_parser)

                post_refusal(message.strip().splitlines()[-1], since + PRINTER_WAIT)
            outlive_rank_0(since)
        super().exit(status, message)


def build_parser() -> argparse.ArgumentParser:
    import deepspeed

    parser = OncePerRunParser(
        prog="pretrain_bert.py",
        description="Pretrain Megatron BERT (MLM + sentence order) with sequence-parallel attention under "
                    "DeepSpeed. Run it through the launcher: deepspeed --num_gpus N pretrain_bert.py ... "
                    "--deepspeed --deepspeed_config ds_configs/<file>.json. Flags given here override the JSON. "
                    "Megatron-LM's flags that differ here are named with their equivalent (docs/deepspeed.md).",
        habits=TRAINER_HABITS)
    add_model_and_parallel_args(parser)
    add_training_args(parser)
    # set by the launcher: deepspeed's --local_rank, torch.distributed.launch's (and Megatron-LM's) --local-rank
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return deepspeed.add_config_arguments(parser)


def check_trainer_flags(argv: list) -> None:
    """A launch script's check before its launch or dry run: the flags of its command, parsed by pretrain_bert.py's
    parser, so that an unknown or mistyped one fails once in the trainer's own line, not every node after
    the launch. Imports DeepSpeed for its config flags, as the trainer does (a few seconds). Then an empty
    value and the --save and --log-dir a live run holds (launchable): the same script started twice met the
    first one's rendezvous port first, whose line named a port. Exits 2 with the trainer's one line."""
    from megatron.errors import run_tool
    from megatron.paths import expand_home
    from megatron.quiet import quiet_deepspeed

    quiet_deepspeed()
    code = run_tool("pretrain_bert.py", lambda: launchable(build_parser().parse_args(expand_home(argv))))
    if code:
        sys.exit(code)


def launchable(args: argparse.Namespace) -> None:
    """check_trainer_flags' checks of the parsed flags, those the ranks make at start-up from the flags alone, so that
    a dry run refuses what the launch would: none given '' (`--save ""`, which the ranks read as no --save and
    blamed the script's --save-interval), values in range and flags that need another (flag_checks), the LR
    schedule against --train-iters; then no folder a live run holds. What depends on the node that runs the ranks
    (--num-workers against its CPUs, a node-local --data-cache-path) is left to them: the launch may be made from
    another machine (a login node reaching the hosts by ssh)."""
    from megatron.flag_checks import check_flag_combinations, check_flags, check_no_empty_values
    from megatron.schedule import Schedule

    check_no_empty_values(args)
    check_flags(argparse.Namespace(**{**vars(args), "num_workers": None, "data_cache_path": None}))
    check_flag_combinations(args)
    if args.train_iters:  # the schedule's steps (a --train-samples run's depend on the layout's global batch)
        Schedule.from_args(args, {"optimizer": {"params": {"lr": args.lr}}}, args.train_iters)  # the peak: unchecked
    folders_in_use(args)


def folders_in_use(args: argparse.Namespace) -> None:
    """A ConfigError when a live run holds the lock of --save or of a given --log-dir (the default one moves
    to runs/bert-N by itself), naming every such flag in the fix."""
    from megatron import locks

    folders = [(args.save, "--save", locks.LOCK)]
    if args.log_dir is not DEFAULT_LOG_DIR:
        folders.append((args.log_dir, "--log-dir", locks.LOG_LOCK))
    held = [(folder, flag, name) for folder, flag, name in folders
            if folder and locks.held_by_live_run(folder, flag, name)]
    if held:
        folder, flag, name = held[0]
        raise ConfigError(*locks.held_by_live_run(folder, flag, name, " and ".join(flag for _, flag, _ in held)))
