"""tools/fill_mask.py: the predictions it prints are the model's own for the [MASK] positions."""
import importlib.util
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bert_fixtures import small_config, small_model
from megatron.data.tokenizer import build_tokenizer
from megatron.errors import ConfigError
from megatron.hf_convert import save_weights_only_checkpoint
from megatron.paths import python_command
from test_hf_convert import write_vocab_file

TOOL = Path(__file__).resolve().parents[1] / "tools" / "fill_mask.py"


def run_tool(*args):
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=120)


def test_prints_the_models_top_predictions(tmp_path):
    vocab_file = write_vocab_file(tmp_path / "vocab.txt")
    config = small_config("ring", seq_length=16, max_position_embeddings=16)
    model = small_model(config, seed=3)
    with torch.no_grad():  # a decisive LM bias, so that the top tokens are not a tie
        model.lm_head.bias.copy_(torch.linspace(0, 8, config.padded_vocab_size))
    save_weights_only_checkpoint(tmp_path / "ckpt", model.state_dict(), config)
    sys.path.insert(0, str(TOOL.parent))
    from fill_mask import fill_mask, load_model

    from megatron.data.tokenizer import build_tokenizer

    tokenizer = build_tokenizer("BertWordPieceLowerCase", vocab_file)
    text = "[MASK] b [MASK]"
    expected = fill_mask(load_model(str(tmp_path / "ckpt")), tokenizer, text, top_k=3)
    result = run_tool("--load", str(tmp_path / "ckpt"), "--tag", "iter_0000000", "--vocab-file", str(vocab_file),
                      "--text", text, "--top-k", "3")  # --tag: one checkpoint of a --save directory, as to-hf
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # first, which checkpoint was read: `latest` moves on while a run saves into --load
    assert lines[lines.index(text) - 1] == f"predictions of {tmp_path / 'ckpt' / 'iter_0000000'} (iteration 0)"
    lines = lines[lines.index(text):]  # (DeepSpeed may print its accelerator line first)
    assert len(lines) == 3
    for number, predictions in enumerate(expected, start=1):
        assert lines[number] == f"  [MASK] {number}: " + ", ".join(f"{t} {p:.2g}" for t, p in predictions)
    # the same model in-process, by hand: the top token of the first [MASK] (position 1 after [CLS])
    ids = [tokenizer.cls, tokenizer.mask, *tokenizer.tokenize(" b "), tokenizer.mask, tokenizer.sep]
    tokens = torch.tensor(ids + [tokenizer.pad] * (16 - len(ids)))[None]
    segment_ids = (torch.arange(16) < len(ids)).long()[None]
    hidden = model.eval().encode(tokens, torch.zeros_like(tokens), torch.arange(16)[None] * segment_ids, segment_ids)
    logits = model.lm_head(hidden[0, 1], model.embeddings.word_embeddings.weight)[:tokenizer.vocab_size]
    assert expected[0][0][0] == tokenizer.convert_ids_to_tokens([int(logits.argmax())])[0]


def test_text_without_mask_is_a_one_line_error(tmp_path):
    vocab_file = write_vocab_file(tmp_path / "vocab.txt")
    config = small_config("ring", seq_length=16, max_position_embeddings=16)
    save_weights_only_checkpoint(tmp_path / "ckpt", small_model(config).state_dict(), config)
    result = run_tool("--load", str(tmp_path / "ckpt"), "--vocab-file", str(vocab_file), "--text", "no mask here")
    assert result.returncode == 2
    assert result.stderr.strip() == ("fill_mask.py: error: --text 'no mask here' holds no [MASK]; "
                                     "put [MASK] where a word should be predicted")


def test_a_converted_checkpoint_without_a_tokenizer_asks_for_one(tmp_path, monkeypatch):
    """A from-hf checkpoint of a folder without a tokenizer never saw the embedded corpus: its vocab is no
    default for it, even where it exists (in-process)."""
    spec = importlib.util.spec_from_file_location("fill_mask", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    config = small_config("ring", seq_length=16, max_position_embeddings=16)
    save_weights_only_checkpoint(tmp_path / "ckpt", small_model(config).state_dict(), config)
    monkeypatch.setattr(tool, "DEFAULT_VOCAB", str(write_vocab_file(tmp_path / "vocab.txt")))
    with pytest.raises(ConfigError, match=r"iter_0000000 carries no tokenizer; pass the --vocab-file"):
        tool.main(["--load", str(tmp_path / "ckpt"), "--text", "a [MASK]"])


def test_top_k_beyond_the_vocab_and_a_later_text_without_mask_print_nothing(tmp_path, capsys):
    """--top-k above the vocab size was torch's `selected index k out of range` traceback; a second
    --text without [MASK] came after the first one's predictions were printed (in-process)."""
    spec = importlib.util.spec_from_file_location("fill_mask", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    vocab_file = write_vocab_file(tmp_path / "vocab.txt")
    vocab_size = len(vocab_file.read_text().splitlines())
    config = small_config("ring", seq_length=16, max_position_embeddings=16)
    save_weights_only_checkpoint(tmp_path / "ckpt", small_model(config).state_dict(), config)
    load = ["--load", str(tmp_path / "ckpt"), "--vocab-file", str(vocab_file)]
    with pytest.raises(ConfigError, match=rf"--top-k {vocab_size + 1} exceeds the {vocab_size} tokens of the vocab"):
        tool.main([*load, "--text", "a [MASK]", "--top-k", str(vocab_size + 1)])
    with pytest.raises(ConfigError, match="--text 'no mask' holds no"):
        tool.main([*load, "--text", "a [MASK]", "--text", "no mask"])
    assert capsys.readouterr().out == ""


def test_stdin_given_twice_and_the_latest_file_as_a_tag_are_named_as_such(tmp_path, monkeypatch):
    """--text-file - twice read stdin twice, and the second read's nothing was called '--text-file - is empty';
    --tag latest (the pointer file) was 'checkpoint folder .../latest does not exist' (in-process; to-hf and
    to-torch choose their tag alike: checkpoint.chosen_tag)."""
    spec = importlib.util.spec_from_file_location("fill_mask", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    config = small_config("ring", seq_length=16, max_position_embeddings=16)
    save_weights_only_checkpoint(tmp_path / "ckpt", small_model(config).state_dict(), config)
    load = ["--load", str(tmp_path / "ckpt"), "--vocab-file", str(write_vocab_file(tmp_path / "vocab.txt"))]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a [MASK] b\n")))
    with pytest.raises(ConfigError, match=re.escape("--text-file - is given 2 times: stdin is read once; pass "
                                                    "--text-file - once, and the other texts as files or --text")):
        tool.main([*load, "--text-file", "-", "--text-file", "-"])
    with pytest.raises(ConfigError, match=re.escape(
            f"--tag latest names the pointer file of {tmp_path / 'ckpt'}, not a checkpoint folder; leave --tag out "
            "to read the checkpoint 'latest' names, or pass --tag iter_N (or N) (the newest: iter_0000000)")):
        tool.main([*load, "--tag", "latest", "--text", "a [MASK]"])


def test_byte_level_guesses_are_shown_decoded(tmp_path):
    """A byte-level BPE's pieces are shown as the text they stand for (was: Ġthe), as transformers'
    fill-mask pipeline decodes them; whitespace alone as its repr, on the one line."""
    from test_hf_tokenizer import train_bpe

    from megatron.data.tokenizer import HFTokenizer

    sys.path.insert(0, str(TOOL.parent))
    from fill_mask import fill_mask

    bpe = train_bpe(["the cat sat on the mat\n", "the dog", "café 你"] * 20, ["[UNK]", "[MASK]", "[SEP]", "[PAD]", "[CLS]"],
                    300)
    bpe.save(str(tmp_path / "tokenizer.json"))
    tokenizer = HFTokenizer(tmp_path / "tokenizer.json")
    model = small_model(small_config("ring", seq_length=16, vocab_size=tokenizer.vocab_size)).eval()
    with torch.no_grad():  # the model's top five: these tokens, in this order; the last two each one byte of é
        for bias, token in zip((30, 20, 10, 9, 8), ("Ġthe", "at", "Ċ", "Ã", "©")):
            model.lm_head.bias[tokenizer.tokens.index(token)] = bias
    assert [guess for guess, _ in fill_mask(model, tokenizer, "a [MASK]", 5)[0]] == ["the", "at", "'\\n'", "\\xc3",
                                                                                    "\\xa9"]


def test_a_hugging_face_folder_asks_for_the_conversion(tmp_path):
    """--load of a Hugging Face folder was "missing 'latest'" (in-process)."""
    sys.path.insert(0, str(TOOL.parent))
    import fill_mask

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=f"--load {tmp_path} is a Hugging Face model folder, not a checkpoint of "
                                          f"this trainer; convert it first: {re.escape(python_command())} tools/convert_checkpoint.py from-hf "
                                          f"--hf-dir {tmp_path} --save DIR, then pass --load DIR"):
        fill_mask.main(["--load", str(tmp_path), "--text", "a [MASK]"])


def test_text_that_is_not_utf8_is_a_one_line_error(tmp_path):
    """A Latin-1 'é' in argv reaches Python as a lone surrogate, which the tokenizer refused with a
    TypeError traceback; the check comes before the checkpoint is read."""
    result = subprocess.run([sys.executable, str(TOOL), "--load", str(tmp_path / "none"), "--text",
                             "caf\udce9 returns a [MASK]."], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        r"fill_mask.py: error: --text 'caf\xe9 returns a [MASK].' is not valid UTF-8 (byte 0xe9 at character 4); "
        "pass the text in UTF-8 (set the terminal or the script file to UTF-8)")


def test_a_mask_spelled_as_another_tokenizer_spells_it_names_the_spelling_to_use(tmp_path):
    """<mask> in the text of a WordPiece (or a [MASK]) tokenizer was text: alone, 'holds no [MASK]' without a
    word on why; beside a [MASK], silently not predicted. Each is now one line naming the spelling given and
    the one to use; [MASK] stays accepted for a <mask> tokenizer, as the tool's own spelling (in-process)."""
    from test_hf_tokenizer import FEW_TEXTS, train_bpe

    from megatron.data.tokenizer import BertWordPiece, HFTokenizer

    sys.path.insert(0, str(TOOL.parent))
    from fill_mask import masked_tokens, text_label

    wordpiece = BertWordPiece(write_vocab_file(tmp_path / "vocab.txt"))
    roberta = train_bpe(FEW_TEXTS, ["<unk>", "<mask>", "</s>", "<pad>", "<s>"], 300)
    roberta.save(str(tmp_path / "roberta.json"))
    roberta = HFTokenizer(tmp_path / "roberta.json")
    modern = train_bpe(FEW_TEXTS, ["[UNK]", "[MASK]", "[SEP]", "[PAD]", "[CLS]"], 300)
    modern.save(str(tmp_path / "modern.json"))
    modern = HFTokenizer(tmp_path / "modern.json")
    for tokenizer, text, spelling, use in ((wordpiece, "a <mask> b", "<mask>", "[MASK]"),
                                           (wordpiece, "[MASK] b <mask>", "<mask>", "[MASK]"),
                                           (modern, "the <mask> sat", "<mask>", "[MASK]"),
                                           (roberta, "the [mask] sat", "[mask]", "<mask> or [MASK]")):
        mask_token = tokenizer.convert_ids_to_tokens([tokenizer.mask])[0]
        with pytest.raises(ConfigError) as caught:
            masked_tokens(tokenizer, text, text_label(text))
        assert str(caught.value) == (f"--text {text!r} writes the mask as {spelling}, which this tokenizer reads as "
                                     f"text (its mask token is {mask_token}); write {use} where a word should be "
                                     "predicted")
    def masks(text):
        tokens = masked_tokens(roberta, text, text_label(text))
        return [index for index, token in enumerate(tokens) if token == roberta.mask]

    assert len(masks("the <mask> sat")) == 1
    assert masks("the [MASK] sat") == masks("the <mask> sat")


def load_tool():
    spec = importlib.util.spec_from_file_location("fill_mask", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_a_long_text_comes_from_a_file_or_stdin_and_shows_each_mask_in_context(tmp_path, capsys, monkeypatch):
    """One argument holds at most 128 KiB (longer --text fails in the shell, E2BIG), and the whole text was
    echoed before the predictions: --text-file (or - for stdin) reads it, and each [MASK] is shown with
    CONTEXT characters of its text on each side."""
    tool = load_tool()
    vocab_file = write_vocab_file(tmp_path / "vocab.txt")
    config = small_config("ring", seq_length=256, max_position_embeddings=256)
    save_weights_only_checkpoint(tmp_path / "ckpt", small_model(config, seed=3).state_dict(), config)
    words = [f"tok{i % 40}" for i in range(120)]
    words[10], words[100] = "[MASK]", "[MASK]"
    text = " ".join(words)  # ~700 characters, 120 tokens
    (tmp_path / "long.txt").write_text(text)
    load = ["--load", str(tmp_path / "ckpt"), "--vocab-file", str(vocab_file), "--top-k", "2"]
    tokenizer = build_tokenizer("BertWordPieceLowerCase", vocab_file)
    expected = tool.fill_mask(tool.load_model(str(tmp_path / "ckpt")), tokenizer, text, 2)
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    tool.main([*load, "--text-file", str(tmp_path / "long.txt"), "--text-file", "-"])
    out = capsys.readouterr().out
    read, *lines = out.splitlines()
    assert read == f"predictions of {tmp_path / 'ckpt' / 'iter_0000000'} (iteration 0)"
    assert len(lines) == 6 and text not in out
    for header, label in ((lines[0], f"--text-file {tmp_path / 'long.txt'}"), (lines[3], "--text-file -")):
        assert header == f"{label} ({len(text)} characters, 2 masks)"
    guesses = [", ".join(f"{token} {p:.2g}" for token, p in predictions) for predictions in expected]
    assert lines[1] == f"  [MASK] 1: {text[:text.index('[MASK]') + 6 + tool.CONTEXT]}... -> {guesses[0]}"
    second = text.rindex("[MASK]")
    assert lines[2] == f"  [MASK] 2: ...{text[second - tool.CONTEXT:second + 6 + tool.CONTEXT]}... -> {guesses[1]}"
    assert lines[4:] == lines[1:3]
    # a short --text stays as it was: the text, then its predictions
    tool.main([*load, "--text", "tok1 [MASK] tok2"])
    assert capsys.readouterr().out.splitlines()[1] == "tok1 [MASK] tok2"


def test_a_text_file_that_is_missing_or_not_utf8_is_one_line(tmp_path):
    tool = load_tool()
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 [MASK]".encode("latin-1"))
    for path, message in ((tmp_path / "none.txt", rf"--text-file {tmp_path / 'none.txt'} cannot be read \(No such "
                                                   r"file or directory\); pass a readable text file, or - for stdin"),
                          (tmp_path / "latin1.txt", rf"--text-file {tmp_path / 'latin1.txt'} is not valid UTF-8 \(byte "
                                                     r"0xe9 at byte offset 3\); save the text as UTF-8")):
        with pytest.raises(ConfigError, match=f"^{message}"):
            tool.main(["--load", str(tmp_path / "ckpt"), "--text-file", str(path)])
    with pytest.raises(ConfigError, match=r"^fill_mask.py needs a text; pass --text"):
        tool.main(["--load", str(tmp_path / "ckpt")])


def test_a_text_longer_than_the_sequence_is_read_in_a_window_around_each_mask(tmp_path, capsys):
    """A --text-file longer than the model's sequence was refused (`is 602 tokens ..., the model's sequence is
    64; shorten the text`), though --text-file is the way to pass long texts: each mask is predicted from the
    sequence's worth of tokens around it (the text's start or end where the mask is near one)."""
    tool = load_tool()
    vocab_file = write_vocab_file(tmp_path / "vocab.txt")
    config = small_config("ring", seq_length=32, max_position_embeddings=32)
    model = small_model(config, seed=3).eval()
    tokenizer = build_tokenizer("BertWordPieceLowerCase", vocab_file)
    words = [f"tok{i % 40}" for i in range(100)]  # one token each
    words[10], words[50], words[90] = "[MASK]", "[MASK]", "[MASK]"
    predicted = tool.fill_mask(model, tokenizer, " ".join(words), 3)
    # 30 tokens between [CLS] and [SEP]: the first 30, 15 on each side of the middle mask, the last 30
    for got, start in zip(predicted, (0, 35, 70)):
        assert [got] == tool.fill_mask(model, tokenizer, " ".join(words[start:start + 30]), 3)
    assert len(predicted) == 3
    with pytest.raises(ConfigError, match="is empty; put"):
        tool.fill_mask(model, tokenizer, "", 3, source="--text-file empty.txt")
    tool.print_predictions("--text-file one.txt", "x " * 200 + "[MASK]", predicted[:1], ["[MASK]"])
    assert capsys.readouterr().out.startswith("--text-file one.txt (406 characters, 1 mask)\n")


def test_control_characters_of_the_text_are_echoed_escaped_and_a_long_texts_size_once(capsys):
    """The echo of --text wrote its ANSI escapes and other control characters raw, so the text recoloured the
    terminal; they are shown as Python escapes (newlines and tabs stay). A long --text's header gave its size
    twice ('...'... (30007 characters) (30007 characters, 1 mask)): once."""
    tool = load_tool()
    text = "the \x01 function\x1b[31m returns\r [MASK]"
    tool.print_predictions(tool.text_label(text), text, [[("a", 0.5)]], ["[MASK]"])
    echoed = capsys.readouterr().out.splitlines()[0]
    assert echoed == "the \\x01 function\\x1b[31m returns\\r [MASK]"
    assert tool.escaped("a\tb\nc\x00") == "a\tb\nc\\x00"
    long = "word\x1b[0m " * 100 + "[MASK]"
    tool.print_predictions(tool.text_label(long), long, [[("a", 0.5)]], ["[MASK]"])
    header, line = capsys.readouterr().out.splitlines()
    assert header == f"--text {long[:tool.CONTEXT]!r}... ({len(long)} characters, 1 mask)"
    assert "\x1b" not in line and "word\\x1b[0m [MASK]" in line


def test_a_text_files_trailing_line_end_is_not_echoed(capsys):
    """`echo "... [MASK] ..." | fill_mask.py --text-file -`: the text's newline was echoed, an empty line between
    the text and its predictions (and a Windows file's \\r before it as '\\r')."""
    tool = load_tool()
    for text in ("python is a [MASK] language.\n", "python is a [MASK] language.\r\n"):
        tool.print_predictions("--text-file -", text, [[("a", 0.5)]], ["[MASK]"])
        assert capsys.readouterr().out.splitlines() == ["python is a [MASK] language.", "  [MASK] 1: a 0.5"]
