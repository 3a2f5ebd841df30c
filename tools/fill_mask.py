"""Fill [MASK] in a sentence with a trained checkpoint: the quickest look at what a run learned.

    python tools/fill_mask.py --load runs/default/checkpoints --text "the function returns a [MASK] of the values"
    python tools/fill_mask.py --load runs/default/checkpoints --text-file chapter.txt   # or - for stdin

Loads the checkpoint (any pipeline / sequence-parallel degree / ZeRO stage) into one process and
prints the top-k tokens for every [MASK], with their probabilities; a long text (a --text-file: one
argument holds at most 128 KiB) is shown as a window of context around each [MASK], and one longer than the
model's sequence is read so: each [MASK] is predicted from the sequence's worth of tokens around it. The
tokenizer is the one the checkpoint carries (a flag naming another vocab is refused); one that carries none
uses --vocab-file / --tokenizer-file, by default (a run trained before checkpoints carried one) the embedded
corpus' vocab.
"""
import argparse
import re
import sys
import unicodedata
from pathlib import Path

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import ConfigError, OneLineParser, run_tool, start_up_stops_in_one_line
from megatron.paths import DEFAULT_DATA_DIR, in_repository, python_command
from megatron.quiet import quiet_deepspeed

with start_up_stops_in_one_line("fill_mask.py"):  # Ctrl-C during the seconds of imports: one line
    quiet_deepspeed()  # before DeepSpeed is first imported (megatron.checkpoint imports it)
    import torch

    from megatron.checkpoint import (LATEST, checkpoint_folder, chosen_tag, read_from, refuse_log_dir, run_state,
                                     stored_config)
    from megatron.checkpoint_weights import bert_state_from_checkpoint
    from megatron.data.batch import BertBatch
    from megatron.data.tokenizer import SPECIAL_NAMES, HFTokenizer, add_tokenizer_flags, check_fits
    from megatron.data.tokenizer_identity import checkpoint_tokenizer
    from megatron.hf_convert import untrained_warning
    from megatron.model.bert import BertConfig, BertModel

MASK = "[MASK]"
SHOWN_WHOLE = 200  # characters: a longer text is shown as CONTEXT characters on each side of each mask
CONTEXT = 60
DEFAULT_VOCAB = in_repository(f"{DEFAULT_DATA_DIR}/vocab.txt")  # the trainer's default data's, whatever the folder


def masked_tokens(tokenizer, text: str, source: str) -> list:
    """The text's token ids with the mask id for each mask written in it. A Hugging Face tokenizer encodes
    the text with its mask token in place, as transformers does (its spacing rules, e.g. lstrip, apply)."""
    mask_token = tokenizer.convert_ids_to_tokens([tokenizer.mask])[0]
    markers = mask_markers(tokenizer)
    refuse_other_mask_spelling(text, markers, mask_token, source)
    pieces = re.split("|".join(map(re.escape, markers)), text)
    if len(pieces) == 1:
        raise ConfigError(f"{source} {'holds no ' + ' or '.join(markers) if text.strip() else 'is empty'}",
                          f"put {MASK} where a word should be predicted")
    body = tokenizer.tokenize(mask_token.join(pieces)) if isinstance(tokenizer, HFTokenizer) else []
    if body.count(tokenizer.mask) != len(pieces) - 1:  # WordPiece (no added tokens): piece by piece
        body = [token for piece in pieces[:-1] for token in (*tokenizer.tokenize(piece), tokenizer.mask)]
        body += tokenizer.tokenize(pieces[-1])
    return body


def as_sample(tokenizer, body: list, seq_length: int) -> tuple:
    """[CLS] body [SEP], padded to the sequence -> (BertBatch of one sample, mask positions)."""
    ids = [tokenizer.cls, *body, tokenizer.sep]
    tokens = torch.full((1, seq_length), tokenizer.pad)
    tokens[0, :len(ids)] = torch.tensor(ids)
    padding = torch.arange(seq_length)[None] >= len(ids)
    masked = tokens == tokenizer.mask
    batch = BertBatch.unpacked(tokens, torch.zeros_like(tokens), padding, tokens, masked,
                               torch.zeros(1, dtype=torch.long))
    return batch, masked[0].nonzero().flatten().tolist()


def windows(body: list, mask_id: int, room: int) -> list:
    """(start, the masks predicted from body[start:start + room]) covering every mask: the whole body when it
    fits, else a window of `room` tokens around each mask (centred where the text allows), so a text longer
    than the model's sequence is read with the context nearest to each mask."""
    masks = [index for index, token in enumerate(body) if token == mask_id]
    if len(body) <= room:
        return [(0, masks)]
    return [(min(max(0, mask - room // 2), len(body) - room), [mask]) for mask in masks]


def text_label(text: str) -> str:
    """--text as messages name it: whole when short, else its start (not 100 KB echoed; the header of
    its predictions gives its size)."""
    if len(text) <= SHOWN_WHOLE:
        return f"--text {text!r}"
    return f"--text {text[:CONTEXT]!r}..."


def escaped(text: str) -> str:
    """`text` with its control characters (an ANSI escape, NUL, a carriage return) written as Python
    escapes ('\\x1b'): echoed raw, they would recolour or rewrite the user's terminal. Newlines and tabs
    stay."""
    return "".join(repr(char)[1:-1] if unicodedata.category(char) == "Cc" and char not in "\n\t" else char
                   for char in text)


def mask_markers(tokenizer) -> list[str]:
    """What the text may write a mask as: [MASK] and the tokenizer's own mask token."""
    return sorted({MASK, tokenizer.convert_ids_to_tokens([tokenizer.mask])[0]})


def refuse_other_mask_spelling(text: str, markers: list, mask_token: str, source: str) -> None:
    """A mask written as another tokenizer spells it (<mask> for a WordPiece one, [mask]): the tokenizer
    reads it as text, so it was no mask ('holds no [MASK]', or beside a [MASK] silently not predicted)."""
    spellings = re.findall("|".join(map(re.escape, SPECIAL_NAMES["mask"])), text, flags=re.IGNORECASE)
    other = next((spelling for spelling in spellings if spelling not in markers), None)
    if other is not None:
        raise ConfigError(f"{source} writes the mask as {other}, which this tokenizer reads as text (its mask "
                          f"token is {mask_token})", f"write {' or '.join(markers)} where a word should be predicted")


@torch.no_grad()
def fill_mask(model: BertModel, tokenizer, text: str, top_k: int, source: str | None = None) -> list:
    """-> per [MASK]: [(token, probability)] best first."""
    seq_length = model.config.seq_length
    body = masked_tokens(tokenizer, text, source or text_label(text))
    predicted = []
    for start, masks in windows(body, tokenizer.mask, seq_length - 2):  # [CLS] and [SEP] take two
        batch, positions = as_sample(tokenizer, body[start:start + seq_length - 2], seq_length)
        mlm_logits, _ = model(*batch.model_inputs())
        rows = [positions.index(mask - start + 1) for mask in masks]  # +1: [CLS]
        probabilities = torch.softmax(mlm_logits[rows, :tokenizer.vocab_size].float(), dim=-1)
        best = probabilities.topk(top_k, dim=-1)
        predicted += [list(zip(guesses(tokenizer, ids), values.tolist())) for values, ids in zip(*best)]
    return predicted


def guesses(tokenizer, ids) -> list[str]:
    """The tokens `ids` as text: a Hugging Face tokenizer's decoder turns byte-level pieces (Ġhave) into
    what they stand for (' have', shown stripped; whitespace alone as its repr, '\\n'); WordPiece
    tokens stay as they are (##ing: a word's continuation)."""
    if not isinstance(tokenizer, HFTokenizer):
        return [escaped(token) for token in tokenizer.convert_ids_to_tokens(ids)]
    texts = [tokenizer.decode_one(index) for index in ids]
    return [escaped(text.strip()) or repr(text) for text in texts]


def contexts(text: str, markers: list) -> list[str]:
    """Each mask with CONTEXT characters on each side, on one line ('...returns a [MASK] of the...')."""
    shown = []
    for found in re.finditer("|".join(map(re.escape, markers)), text):
        start, end = max(0, found.start() - CONTEXT), found.end() + CONTEXT
        window = escaped(" ".join(text[start:end].split()))
        shown.append(("..." if start > 0 else "") + window + ("..." if end < len(text) else ""))
    return shown


def print_predictions(label: str, text: str, masks: list, markers: list) -> None:
    """A short text whole, then a line per mask; a long one by its name and size, each mask with its context.
    The text's trailing line ends and blanks are not shown (`echo ... | fill_mask.py --text-file -` ends in a
    newline, which printed an empty line before the predictions; a Windows file's \\r showed as '\\r')."""
    if len(text) <= SHOWN_WHOLE:
        print(escaped(text.rstrip()))
        windows = [""] * len(masks)
    else:
        print(f"{label} ({len(text)} characters, {len(masks)} mask{'' if len(masks) == 1 else 's'})")
        windows = [f" {window}" for window in contexts(text, markers)]
    for number, (predictions, window) in enumerate(zip(masks, windows), start=1):
        print(f"  [MASK] {number}:{window}{' ->' if window else ''} "
              + ", ".join(f"{token} {p:.2g}" for token, p in predictions))


def read_text_file(path: str) -> str:
    """A --text-file's text (`-`: stdin), in UTF-8; a missing or unreadable file, or other bytes, is one line."""
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(f"--text-file {path} cannot be read ({error.strerror or error})",
                          "pass a readable text file, or - for stdin") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"--text-file {path} is not valid UTF-8 (byte {data[error.start]:#04x} at byte offset "
                          f"{error.start})", "save the text as UTF-8 (iconv -f latin1 -t utf-8, say)") from None


def check_utf8(text: str) -> None:
    """--text as Python decodes argv: a byte that is not UTF-8 (a Latin-1 terminal's 'é') becomes a lone
    surrogate, which the tokenizer cannot take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code = ord(text[error.start])
        if 0xDC80 <= code <= 0xDCFF:  # the byte as given (b'caf\xe9', not 'caf\udce9')
            shown, what = repr(text.encode("utf-8", "surrogateescape"))[1:], f"byte {code - 0xDC00:#04x}"
        else:
            shown, what = ascii(text), f"lone surrogate U+{code:04X}"
        raise ConfigError(f"--text {shown} is not valid UTF-8 ({what} at character {error.start + 1})",
                          "pass the text in UTF-8 (set the terminal or the script file to UTF-8)") from None


def load_model(load_dir: str, tag: str | None = None) -> BertModel:
    """The checkpoint's model (`tag`, default `latest`'s) in one process."""
    tag = chosen_tag(load_dir, tag)
    model = BertModel(BertConfig(**stored_config(load_dir, tag)["model"]))  # the saved attention, at SP = 1
    model.load_state_dict(bert_state_from_checkpoint(load_dir, tag))
    return model.eval()


def main(argv=None) -> None:
    parser = OneLineParser(prog="fill_mask.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", required=True, help="checkpoint directory (written by --save)")
    parser.add_argument("--tag", help="checkpoint tag, e.g. iter_0001000 or its iteration 1000 "
                        "(default: the one in 'latest')")
    parser.add_argument("--text", action="append", default=[],
                        help=f"a sentence with one or more {MASK}; repeat the flag for several")
    parser.add_argument("--text-file", action="append", default=[],
                        help=f"a UTF-8 file holding one text with {MASK}s (- reads stdin): for a text longer than "
                             "an argument may be (128 KiB); repeatable")
    add_tokenizer_flags(parser, "vocab.txt of the run (default: the one the checkpoint carries, else "
                        f"{DEFAULT_VOCAB})")
    parser.add_argument("--top-k", type=int, default=5, help="predictions shown per [MASK] (default 5)")
    args = parser.parse_args(argv)
    if args.top_k < 1:
        raise ConfigError(f"--top-k {args.top_k} must be >= 1", "pass --top-k 5, say")
    if not args.text and not args.text_file:
        raise ConfigError("fill_mask.py needs a text", f"pass --text 'a sentence with a {MASK}' or --text-file PATH")
    if args.text_file.count("-") > 1:  # the second read of stdin gets nothing: 'is empty' blamed the text
        raise ConfigError(f"--text-file - is given {args.text_file.count('-')} times: stdin is read once",
                          "pass --text-file - once, and the other texts as files or --text")
    for text in args.text:
        check_utf8(text)
    texts = [(text_label(text), text) for text in args.text]
    texts += [(f"--text-file {path}", read_text_file(path)) for path in args.text_file]
    if (Path(args.load) / "config.json").is_file() and not (Path(args.load) / LATEST).exists():
        refuse_log_dir(args.load)  # a run's --log-dir holds a config.json too: named as such, with its --save
        raise ConfigError(f"--load {args.load} is a Hugging Face model folder, not a checkpoint of this trainer",
                          f"convert it first: {python_command()} "
                          f"{in_repository('tools/convert_checkpoint.py')} from-hf "
                          f"--hf-dir {args.load} "
                          "--save DIR, then pass --load DIR")
    tag = chosen_tag(args.load, args.tag)
    # the embedded corpus' vocab, where it exists, for a trained checkpoint saved before checkpoints carried
    # their tokenizer; a converted one (weights-only) was never trained on it
    default = Path(DEFAULT_VOCAB).is_file() and not run_state(args.load, tag).get("weights_only")
    tokenizer = checkpoint_tokenizer(args, checkpoint_folder(args.load, tag), DEFAULT_VOCAB if default else None)
    if args.top_k > tokenizer.vocab_size:
        raise ConfigError(f"--top-k {args.top_k} exceeds the {tokenizer.vocab_size} tokens of the vocab",
                          f"pass --top-k at most {tokenizer.vocab_size}")
    model = load_model(args.load, tag)
    check_fits(tokenizer, model.config.vocab_size)
    results = [(label, text, fill_mask(model, tokenizer, text, args.top_k, label))
               for label, text in texts]  # all checked, then printed
    untrained = untrained_warning(args.load, tag, "lm_head.")
    if untrained:
        print(f"warning: {untrained}; these predictions are random (train from the checkpoint first, or convert a "
              "Hugging Face folder with its masked-LM head)", file=sys.stderr)
    print(f"predictions of {read_from(args.load, tag)}")
    for label, text, masks in results:
        print_predictions(label, text, masks, mask_markers(tokenizer))


if __name__ == "__main__":
    sys.exit(run_tool("fill_mask.py", main, one_line_warnings=True))
