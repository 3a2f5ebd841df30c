"""WordPiece tokenizers over a vocab.txt, and tools/build_vocab.py training one."""
import argparse
import importlib.util
import io
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordPiece
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer, Whitespace

from megatron.data.tokenizer import BertWordPiece, HFTokenizer, build_tokenizer, case_warning, read_vocab
from megatron.data.tokenizer_identity import (check_data_vocab, data_identity_path, unchecked_added_tokens_warning,
                                              write_data_identity)
from megatron.data.vocab_builder import train_vocab, write_vocab
from megatron.errors import ConfigError, DataError

ROOT = Path(__file__).resolve().parents[1]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "Paris", "paris",
         "un", "##believ", "##able", ".", ",", "!", "é", "cafe"]


def load_tool(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return path


def test_lower_case_wordpiece_ids_come_from_the_vocab(vocab_file):
    tokenizer = build_tokenizer("BertWordPieceLowerCase", vocab_file)
    ids = tokenizer.tokenize("The cat sat on the MAT, unbelievable! Paris café")
    assert tokenizer.convert_ids_to_tokens(ids) == ["the", "cat", "sat", "on", "the", "mat", ",", "un", "##believ",
                                                    "##able", "!", "paris", "cafe"]
    assert (tokenizer.pad, tokenizer.cls, tokenizer.sep, tokenizer.mask, tokenizer.eod) == (0, 2, 3, 4, 3)
    assert tokenizer.vocab_size == len(VOCAB)


def test_cased_keeps_case_and_accents(vocab_file):
    tokenizer = build_tokenizer("BertWordPieceCase", vocab_file)
    assert tokenizer.convert_ids_to_tokens(tokenizer.tokenize("Paris the THE café")) == ["Paris", "the", "[UNK]", "[UNK]"]


def test_batch_equals_single_and_survives_pickling(vocab_file):
    tokenizer = build_tokenizer("BertWordPieceLowerCase", vocab_file)
    texts = ["the cat", "", "unbelievable mat."]
    assert tokenizer.tokenize_batch(texts) == [tokenizer.tokenize(t) for t in texts]
    clone = pickle.loads(pickle.dumps(tokenizer))
    assert clone.tokenize(texts[2]) == tokenizer.tokenize(texts[2]) and clone.lower_case


def test_special_tokens_are_required(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\nthe\n")
    with pytest.raises(DataError, match=r"lacks the special tokens \[CLS\] \[SEP\] \[MASK\]"):
        BertWordPiece(path)


def test_bad_tokenizer_settings_are_one_line_errors(tmp_path, vocab_file):
    with pytest.raises(ConfigError, match="unknown --tokenizer-type GPT2BPETokenizer"):
        build_tokenizer("GPT2BPETokenizer", vocab_file)
    with pytest.raises(DataError, match="does not exist.*--vocab-file"):
        build_tokenizer("BertWordPieceLowerCase", tmp_path / "missing.txt")
    Tokenizer(WordPiece({token: i for i, token in enumerate(VOCAB)}, unk_token="[UNK]")).save(str(tmp_path / "t.json"))
    with pytest.raises(DataError, match="t.json is a Hugging Face tokenizer.json, not a vocab.txt; pass it with "
                                        "--tokenizer-file"):
        build_tokenizer("BertWordPieceLowerCase", tmp_path / "t.json")


def write_corpus(path, lines):
    path.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    return path


def test_build_vocab_trains_a_loadable_vocab(tmp_path):
    corpus = write_corpus(tmp_path / "c.json", ["Sentence number %d talks about tokenization and vocabularies." % i
                                                 for i in range(200)])
    tokens = train_vocab(corpus, lower_case=True, vocab_size=200)
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(tokens) == len(set(tokens)) <= 200
    assert {"tokenization", "vocabularies", "sentence"} <= set(tokens)  # 200 times each: whole words
    write_vocab(tokens, tmp_path / "vocab.txt")
    tokenizer = build_tokenizer("BertWordPieceLowerCase", tmp_path / "vocab.txt")
    ids = tokenizer.tokenize("Tokenization talks about vocabularies.")
    assert tokenizer.convert_ids_to_tokens(ids) == ["tokenization", "talks", "about", "vocabularies", "."]


def test_build_vocab_cli_reports_bad_input_in_one_line(tmp_path):
    corpus = write_corpus(tmp_path / "c.json", ["fine", "fine"])
    corpus.write_text(corpus.read_text() + "{not json\n")
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "build_vocab.py"), "--input", str(corpus),
                             "--output", str(tmp_path / "v.txt")], capture_output=True, text=True, timeout=100)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "line 3" in result.stderr
    assert "fix or remove the record, or pass --skip-invalid" in result.stderr
    assert not list(tmp_path.glob("v.txt*"))
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "build_vocab.py"), "--input", str(corpus),
                             "--output", str(tmp_path / "v.txt"), "--skip-invalid"], capture_output=True, text=True,
                            timeout=100)
    assert result.returncode == 0 and "skipped 1 invalid record (the first: " in result.stdout, result
    assert "c.json line 3: invalid JSON" in result.stdout and "fine" in (tmp_path / "v.txt").read_text().split()
    size = len((tmp_path / "v.txt").read_text().splitlines())  # a corpus of one word: far below the default size
    assert f"wrote {size} tokens" in result.stdout and f"({30522 - size} fewer than --vocab-size 30522: no other pair " \
        "of pieces occurs --min-frequency 2 times in this corpus" in result.stdout, result.stdout
    # a vocab above --vocab-size said nothing of why (the alphabet is kept at any size)
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "build_vocab.py"), "--input", str(corpus),
                             "--output", str(tmp_path / "small.txt"), "--vocab-size", "6", "--skip-invalid"],
                            capture_output=True, text=True, timeout=100)
    assert result.returncode == 0 and "more than --vocab-size 6: WordPiece keeps every character" in result.stdout


def test_a_tilde_in_a_tools_path_is_the_home_folder(tmp_path):
    """`--output=~/v.txt` (bash expands no ~ after `=`) wrote into a folder named `~` in the current one."""
    from megatron.paths import expand_home

    corpus = write_corpus(tmp_path / "c.json", ["one two three four", "one two three five"])
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "build_vocab.py"), "--input", "~/c.json",
                             "--output=~/v.txt", "--vocab-size", "40"], capture_output=True, text=True, timeout=100,
                            cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path)})
    assert result.returncode == 0 and (tmp_path / "v.txt").is_file() and not (tmp_path / "~").exists(), result.stderr
    assert corpus.is_file()
    home = os.path.expanduser("~")
    assert expand_home(["--save=~/ck", "--load", "~/ck", "~", "--text", "~/x", "--text=~/y", "a~b"]) == [
        f"--save={home}/ck", "--load", f"{home}/ck", home, "--text", "~/x", "--text=~/y", "a~b"]


def bert_json(path: Path, lower_case: bool, pre_tokenizer=None) -> Path:
    """A tokenizer.json over VOCAB as Hugging Face writes BERT's: strip_accents null (as lowercase)."""
    rust = Tokenizer(WordPiece({token: index for index, token in enumerate(VOCAB)}, unk_token="[UNK]"))
    rust.normalizer = BertNormalizer(lowercase=lower_case)
    rust.pre_tokenizer = pre_tokenizer or BertPreTokenizer()
    rust.save(str(path))
    return path


def test_data_of_another_case_or_text_pipeline_is_refused(tmp_path, vocab_file):
    """The data check compared the tokens only: data made with BertWordPieceCase trained under the default
    BertWordPieceLowerCase (or a tokenizer.json with another normalizer) without a word, and the checkpoint
    and export carried a tokenizer other than the data's."""
    prefix = str(tmp_path / "data")
    write_data_identity(BertWordPiece(vocab_file, lower_case=False), prefix)
    check_data_vocab(BertWordPiece(vocab_file, lower_case=False), [prefix])
    with pytest.raises(DataError) as error:
        check_data_vocab(BertWordPiece(vocab_file), [prefix])
    assert str(error.value) == (
        f"the data {prefix} was preprocessed with the BertWordPieceCase {vocab_file}, whose text pipeline differs "
        f"from the run's BertWordPieceLowerCase {vocab_file} (normalizer.strip_accents: false vs true, "
        "normalizer.lowercase: false vs true): the same tokens, split from text another way; pass --tokenizer-type "
        f"BertWordPieceCase --vocab-file {vocab_file} (what the data was made with), or rerun "
        "tools/preprocess_data.py with the run's tokenizer")
    lower, cased = bert_json(tmp_path / "lower.json", True), bert_json(tmp_path / "cased.json", False)
    write_data_identity(HFTokenizer(lower), prefix)
    check_data_vocab(BertWordPiece(vocab_file), [prefix])  # BERT's tokenizer.json is the lower-cased vocab.txt
    with pytest.raises(DataError, match=r"HFTokenizer \S*lower.json, whose text pipeline differs from the run's "
                       r"HFTokenizer \S*cased.json \(normalizer.strip_accents: true vs false, normalizer.lowercase: "
                       r"true vs false\).*; pass --tokenizer-file \S*lower.json \(what the data was made with\)"):
        check_data_vocab(HFTokenizer(cased), [prefix])
    with pytest.raises(DataError, match=r'\(pre_tokenizer: "BertPreTokenizer" vs "Whitespace"\)'):
        check_data_vocab(HFTokenizer(bert_json(tmp_path / "split.json", True, Whitespace())), [prefix])


def test_data_of_the_same_tokens_split_another_way_is_refused(tmp_path):
    """Equal tokens, other merges (a BPE) or scores (a Unigram): another split of the same text. The
    merges compare the same in either way tokenizers versions write them ("a b" or ["a", "b"])."""
    from tokenizers import models, pre_tokenizers, trainers

    texts = ["the cat sat on the mat with a hat", "a bat and a rat ate the oat cake", "that hat is that cat's"] * 20
    special = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    prefix = str(tmp_path / "data")
    for model, trainer in ((models.BPE(unk_token="[UNK]"), trainers.BpeTrainer(vocab_size=60, special_tokens=special)),
                           (models.Unigram(), trainers.UnigramTrainer(vocab_size=60, special_tokens=special,
                                                                      unk_token="[UNK]"))):
        rust = Tokenizer(model)
        rust.pre_tokenizer = pre_tokenizers.Whitespace()
        rust.train_from_iterator(texts, trainer)
        made = json.loads(rust.to_str())
        other = json.loads(rust.to_str())
        if made["model"]["type"] == "BPE":
            other["model"]["merges"] = other["model"]["merges"][::-1]
            written = {**made, "model": {**made["model"], "merges": [" ".join(pair) if isinstance(pair, list) else pair
                                                                     for pair in made["model"]["merges"]]}}
            (tmp_path / "written.json").write_text(json.dumps(written))  # the other way of writing merges
        else:
            other["model"]["vocab"] = [[token, -score] for token, score in other["model"]["vocab"]]
        (tmp_path / "made.json").write_text(json.dumps(made))
        (tmp_path / "other.json").write_text(json.dumps(other))
        write_data_identity(HFTokenizer(tmp_path / "made.json"), prefix)
        check_data_vocab(HFTokenizer(tmp_path / "made.json"), [prefix])
        if made["model"]["type"] == "BPE":
            check_data_vocab(HFTokenizer(tmp_path / "written.json"), [prefix])
        setting = "merges" if made["model"]["type"] == "BPE" else "scores"
        with pytest.raises(DataError, match=rf"whose text pipeline differs from the run's HFTokenizer \S*other.json "
                                            rf"\(model.{setting}: \"sha256:\w+\" vs \"sha256:\w+\"\)"):
            check_data_vocab(HFTokenizer(tmp_path / "other.json"), [prefix])


def test_data_of_the_same_tokens_with_other_added_token_matching_is_refused(tmp_path):
    """Two tokenizer.json files of one vocab and pipeline whose added token matches text another way
    (single_word; or special, encoded as its characters, vs matched as one id) split a text into other
    ids: the data check took them for one tokenizer. A record written before added tokens were recorded
    is not refused for them."""
    from tokenizers import AddedToken

    prefix = str(tmp_path / "data")

    def added(name, token):
        rust = Tokenizer.from_file(str(bert_json(tmp_path / f"{name}.json", True)))
        rust.add_tokens([token])
        rust.save(str(tmp_path / f"{name}.json"))
        tokenizer = HFTokenizer(tmp_path / f"{name}.json")
        tokenizer.read_specials_as_text()  # as preprocessing reads text
        return tokenizer

    loose = added("loose", AddedToken("cat", single_word=False))
    whole = added("whole", AddedToken("cat", single_word=True))
    assert loose.tokenize("cats") != whole.tokenize("cats")
    write_data_identity(loose, prefix)
    check_data_vocab(loose, [prefix])
    with pytest.raises(DataError, match=r"differs from the run's HFTokenizer \S*whole.json "
                                        r"\(added_tokens.0.single_word: false vs true\)"):
        check_data_vocab(whole, [prefix])
    matched, special = added("matched", AddedToken("<tag>")), added("special", AddedToken("<tag>", special=True))
    assert matched.tokenize("a <tag>") != special.tokenize("a <tag>")
    write_data_identity(matched, prefix)
    with pytest.raises(DataError, match=r"\(added_tokens \(matched in text as one id; a special one is encoded as "
                                        r"its characters\): \[\"<tag>\"\] vs \[\]\)"):
        check_data_vocab(special, [prefix])
    assert unchecked_added_tokens_warning([prefix], matched) is None
    record = json.loads(data_identity_path(prefix).read_text())
    assert not any(path.startswith("added_tokens") for path in record["text_pipeline"])  # older versions' part by part
    del record["added_tokens"]  # comparison of the text pipeline refused the extra part
    data_identity_path(prefix).write_text(json.dumps(record))
    check_data_vocab(special, [prefix])
    assert unchecked_added_tokens_warning([prefix], special) is None  # it matches no token in text
    warning = unchecked_added_tokens_warning([prefix], matched)  # passed unchecked: said so
    assert f"the vocab record of the data {prefix} was written before records held the added tokens" in warning
    assert '["<tag>"] (matched as one id each) is not checked' in warning


def test_records_without_the_text_pipeline_or_with_another_versions_fields_still_work(tmp_path, vocab_file):
    """A record written before records held the text pipeline: a WordPiece one's case is its type, a
    tokenizer.json's pipeline is unknown (no refusal). A setting only one tokenizers version writes is no
    difference."""
    prefix = str(tmp_path / "data")

    def write(tokenizer, change=lambda pipeline: pipeline.clear()):  # cleared: an older record, without it
        write_data_identity(tokenizer, prefix)
        record = json.loads(data_identity_path(prefix).read_text())
        change(record["text_pipeline"])
        data_identity_path(prefix).write_text(json.dumps({key: value for key, value in record.items() if value}))

    write(BertWordPiece(vocab_file, lower_case=False))
    check_data_vocab(BertWordPiece(vocab_file, lower_case=False), [prefix])
    with pytest.raises(DataError, match="BertWordPieceCase .* differs from the run's BertWordPieceLowerCase"):
        check_data_vocab(BertWordPiece(vocab_file), [prefix])
    write(HFTokenizer(bert_json(tmp_path / "lower.json", True)))
    check_data_vocab(HFTokenizer(bert_json(tmp_path / "cased.json", False)), [prefix])
    write(BertWordPiece(vocab_file), lambda pipeline: pipeline.update({"normalizer.new_setting": 1}))
    check_data_vocab(BertWordPiece(vocab_file), [prefix])
    write(BertWordPiece(vocab_file), lambda pipeline: pipeline.pop("model.max_input_chars_per_word"))
    check_data_vocab(BertWordPiece(vocab_file), [prefix])


def test_a_vocab_file_folder_is_named_by_what_it_holds(tmp_path):
    """A ModernBERT folder given as --vocab-file holds tokenizer.json, no vocab.txt: the fix names
    --tokenizer-file, not a vocab.txt that is not there."""
    from megatron.data.tokenizer import read_vocab
    from megatron.errors import DataError

    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(DataError, match=f"holding tokenizer.json, not vocab.txt; pass --tokenizer-file "
                                        f"{tmp_path / 'tokenizer.json'} instead of --vocab-file"):
        read_vocab(tmp_path)
    (tmp_path / "vocab.txt").write_text("[PAD]\n")
    with pytest.raises(DataError, match="is a directory; pass the vocab.txt inside it"):
        read_vocab(tmp_path)


def test_the_trainer_and_the_tools_share_one_definition_of_the_tokenizer_flags(capsys):
    """pretrain_bert.py's --vocab-file / --tokenizer-file / --tokenizer-type take the tools' names (the --vocab
    alias) and choices, and keep their destinations (the keys of a run's config.json); an unknown type is
    argparse's one line."""
    import argparse

    from megatron.arguments import build_parser
    from megatron.data.tokenizer import TYPE_NAMES, add_tokenizer_flags

    def flags(parser) -> dict:
        return {action.dest: (action.option_strings, action.choices) for action in parser._actions
                if action.dest in ("vocab_file", "tokenizer_file", "tokenizer_type")}

    tools = argparse.ArgumentParser()
    add_tokenizer_flags(tools, "a vocab")
    assert flags(build_parser()) == flags(tools) == {"vocab_file": (["--vocab-file", "--vocab"], None),
                                                     "tokenizer_file": (["--tokenizer-file"], None),
                                                     "tokenizer_type": (["--tokenizer-type"], TYPE_NAMES)}
    assert build_parser().parse_args(["--vocab", "v.txt"]).vocab_file == "v.txt"
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["--tokenizer-type", "BertWordPieceUpper"])
    [line] = capsys.readouterr().err.splitlines()
    assert stopped.value.code == 2 and line.startswith(
        "pretrain_bert.py: error: argument --tokenizer-type: invalid choice: 'BertWordPieceUpper'")


@pytest.mark.parametrize("lines, problem", [
    (VOCAB[:8] + ["", ""] + VOCAB[8:], "lines 9, 10 are blank: 2 ids with one token, the empty one; delete all but "
                                       "one of them, or, for a model trained with this vocab, put a placeholder "
                                       "token of its own there (ids are line numbers)"),
    (VOCAB[:8] + ["cat"] + VOCAB[8:], "holds 'cat' twice, on lines 7 and 9: one of its ids is never written, "
                                      "and the later ids fall out of step with its tokens; delete line 9, or, "),
    ([f"{token} " for token in VOCAB], f"line 1 holds '[PAD] ', with spaces or tabs at its ends ({len(VOCAB)} of "
                                       f"its {len(VOCAB)} tokens do), which WordPiece never writes; remove them"),
    (VOCAB[:3] + ["[SEP]\t"] + VOCAB[4:], "line 4 holds '[SEP]\\t', with spaces or tabs at its ends (1 of"),
])
def test_vocab_lines_that_cannot_be_ids_are_named(tmp_path, lines, problem):
    """The line number is the id: blank lines, a token twice or a special token padded with spaces (which
    WordPiece never writes: a vocab saved with trailing spaces lacked even [PAD]) is named by its line."""
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=re.escape(f"vocab file {path} {problem}")):
        BertWordPiece(path)


def test_one_blank_line_and_whitespace_tokens_keep_their_ids(tmp_path):
    """Published vocabs hold a blank line or a token of spaces (ids WordPiece never writes, kept so the
    later ids stay where the model has them): they load, every other token at its line's id."""
    lines = VOCAB[:8] + [""] + VOCAB[8:] + [" ", "\tcafe"]
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(lines) + "\n")
    tokenizer = BertWordPiece(path)
    assert tokenizer.vocab_size == len(lines)
    assert [tokenizer.vocab[token] for token in VOCAB[8:]] == list(range(9, len(VOCAB) + 1))


def test_the_sed_line_named_for_padded_tokens_gives_the_vocab(tmp_path, vocab_file):
    padded = tmp_path / "padded.txt"
    padded.write_text("".join(f" {token}\t \n" for token in VOCAB))
    with pytest.raises(DataError) as raised:
        BertWordPiece(padded)
    sed = re.search(r"e\.g\. (sed .*)$", str(raised.value)).group(1)
    subprocess.run(sed, shell=True, check=True)
    assert BertWordPiece(padded).identity == BertWordPiece(vocab_file).identity


def test_a_byte_order_mark_and_line_ends_leave_the_ids_as_the_lines_say(tmp_path, vocab_file):
    """A UTF-8 BOM (Windows editors) is no part of [PAD]; CRLF ends are line ends; U+2028 and NEL inside a
    token are not (transformers' readlines() keeps them, so the ids stay its ids)."""
    reference = BertWordPiece(vocab_file)
    bom = tmp_path / "bom.txt"
    bom.write_bytes(b"\xef\xbb\xbf" + vocab_file.read_bytes().replace(b"\n", b"\r\n"))
    assert BertWordPiece(bom).identity == reference.identity and BertWordPiece(bom).pad == 0
    odd = tmp_path / "odd.txt"
    odd.write_text("\n".join([*VOCAB, "a\u2028b", "c\x85d", "last"]), encoding="utf-8")
    assert read_vocab(odd)["last"] == len(VOCAB) + 2


def test_a_hugging_face_vocab_json_is_named_as_such(tmp_path):
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps({token: index for index, token in enumerate(VOCAB)}))
    with pytest.raises(DataError, match=re.escape(
            f"vocab file {path} is a JSON map of token to id (a Hugging Face vocab.json), not a vocab.txt; pass the "
            "tokenizer.json of that model (in its Hugging Face folder, beside the vocab.json) with --tokenizer-file")):
        build_tokenizer(None, path)


CASED = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "The", "the", "Cat", "cat", "##s", "."]
LOWER = [token for token in CASED if token.lower() == token or token.startswith("[")]


@pytest.mark.parametrize("tokens, flag_type, expected", [
    (CASED, None, "holds 2 tokens with capitals (The, Cat, ...), which the default BertWordPieceLowerCase never "
                  "writes (it lower-cases the text): it was built cased; pass --tokenizer-type BertWordPieceCase"),
    (CASED, "BertWordPieceLowerCase", "which --tokenizer-type BertWordPieceLowerCase never writes"),
    (CASED, "BertWordPieceCase", None),
    (LOWER, "BertWordPieceCase",
     "holds no token with a capital, while --tokenizer-type BertWordPieceCase keeps the text's case: each "
     "capitalised word becomes [UNK]; drop --tokenizer-type BertWordPieceCase"),
    (LOWER, None, None),
    (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "1", "2", "##3"], "BertWordPieceCase", None),  # no letters
])
def test_a_vocab_whose_case_the_type_contradicts_is_named(tmp_path, tokens, flag_type, expected):
    """A cased vocab lower-cased never writes its capitalised tokens; a lower-cased one kept cased writes
    [UNK] for every capitalised word (6% of an English corpus's tokens)."""
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(tokens) + "\n")
    warning = case_warning(build_tokenizer(flag_type, path), flag_type)
    assert warning == expected if expected is None else expected in warning and warning.startswith(
        f"the vocab {path} ")


def test_preprocessing_and_fill_masks_tokenizer_name_a_case_mismatch(tmp_path):
    """Where the flags name the vocab: preprocess_data.py (one line before the data), and the tools that read
    a checkpoint carrying no tokenizer (fill_mask.py, convert_checkpoint.py to-hf). The trainer's: in
    tests/test_vocab_identity.py."""
    from megatron.data.preprocess import PreprocessOptions, preprocess
    from megatron.data.tokenizer_identity import checkpoint_tokenizer

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(CASED) + "\n")
    write_corpus(tmp_path / "corpus.json", ["The cats."])
    log = io.StringIO()
    preprocess(PreprocessOptions(input=str(tmp_path / "corpus.json"), output_prefix=str(tmp_path / "out"),
                                 vocab_file=str(vocab), log_interval=0, split_sentences=True), log=log)
    assert [line for line in log.getvalue().splitlines() if line.startswith("warning:")] == [
        f"warning: {case_warning(BertWordPiece(vocab), None)}"]
    (tmp_path / "ckpt").mkdir()
    args = argparse.Namespace(vocab_file=str(vocab), tokenizer_file=None, tokenizer_type=None)
    with pytest.warns(UserWarning, match="which the default BertWordPieceLowerCase never writes"):
        checkpoint_tokenizer(args, tmp_path / "ckpt")
