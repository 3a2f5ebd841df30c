"""The vocab's identity (sha256 of its tokens in id order): what data and checkpoints carry, and what
the run, a resume, fill-mask and to-hf compare (the entry points' one-line refusals are rows of
tests/test_bad_inputs.py)."""
import argparse
import json
import re

import pytest

from megatron.data.default_dataset import prepare_default_dataset
from megatron.data.tokenizer import BertWordPiece, HFTokenizer
from megatron.data.tokenizer_identity import (CARRIED, carried_tokenizer, carry, check_data_vocab, choose_tokenizer,
                                              data_identity_path, write_data_identity)
from megatron.errors import ConfigError, DataError
from megatron.hf_modernbert import wordpiece_tokenizer_json

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s", "."]


def write(path, tokens):
    path.write_text("\n".join(tokens) + "\n")
    return path


def run_tokenizer(args):
    """run_data.run_tokenizer of the flags `args`, starting where they name (no requeue)."""
    from megatron import run_data, start_plan

    return run_data.run_tokenizer(args, start_plan.StartPlan.given(args))


def test_same_size_is_not_same_vocab(tmp_path):
    original = BertWordPiece(write(tmp_path / "a.txt", VOCAB))
    shuffled = BertWordPiece(write(tmp_path / "b.txt", VOCAB[:5] + VOCAB[5:][::-1]))
    copy = BertWordPiece(write(tmp_path / "c.txt", VOCAB))
    assert shuffled.vocab_size == original.vocab_size and shuffled.identity != original.identity
    assert copy.identity == original.identity  # the tokens decide, not the path
    (tmp_path / "tokenizer.json").write_text(json.dumps(wordpiece_tokenizer_json(VOCAB, True)))
    assert HFTokenizer(tmp_path / "tokenizer.json").identity == original.identity  # nor the file format
    record = original.record()
    assert record["vocab_sha256"] == original.identity and record["file"] == str(tmp_path / "a.txt")
    assert record["special_tokens"] == {"cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]", "pad": "[PAD]"}


@pytest.mark.parametrize("kind", ["wordpiece", "hf"])
def test_a_checkpoint_folder_carries_its_tokenizer(tmp_path, kind):
    if kind == "hf":
        (tmp_path / "source.json").write_text(json.dumps(wordpiece_tokenizer_json(VOCAB, False)))
        tokenizer = HFTokenizer(tmp_path / "source.json")
    else:
        tokenizer = BertWordPiece(write(tmp_path / "source.txt", VOCAB), lower_case=False)
    folder = tmp_path / "iter_0000001"
    folder.mkdir()
    assert carried_tokenizer(folder) is None  # a checkpoint saved before checkpoints carried one
    carry(tokenizer, folder)
    carried = carried_tokenizer(folder)
    assert type(carried) is type(tokenizer) and carried.identity == tokenizer.identity
    assert carried.type_name == tokenizer.type_name and carried.file != tokenizer.file  # the copy in the folder
    assert (carried.cls, carried.sep, carried.mask, carried.pad) == (2, 3, 4, 0)
    assert carried.tokenize("The cats") == tokenizer.tokenize("The cats")
    # the run's flags: none -> the carried one; the same vocab -> accepted; another -> one line naming both files
    assert choose_tokenizer(None, carried, "ckpt") is carried
    # the same tokens named by a flag: the checkpoint's own (its case: the flag's type defaults to lowercase)
    assert choose_tokenizer(tokenizer, carried, "ckpt") is carried
    other = BertWordPiece(write(tmp_path / "other.txt", VOCAB[:5] + VOCAB[5:][::-1]))
    with pytest.raises(DataError, match=f"the vocab {tmp_path}/other.txt differs from {folder}/.*, the one checkpoint "
                                        "ckpt was trained with"):
        choose_tokenizer(other, carried, "ckpt")
    with pytest.raises(ConfigError, match="--tokenizer-type BertWordPieceLowerCase differs from"):
        choose_tokenizer(None, carried, "ckpt", "BertWordPieceLowerCase")
    # the same tokens from text split another way: a flag's tokenizer.json is not replaced silently by the
    # carried vocab.txt or tokenizer.json (one of the same case is the same pipeline); an HF folder's is
    # when the flags' --tokenizer-type overrides it (same_pipeline=False)
    (tmp_path / "lower.json").write_text(json.dumps(wordpiece_tokenizer_json(VOCAB, True)))
    (tmp_path / "cased.json").write_text(json.dumps(wordpiece_tokenizer_json(VOCAB, False)))
    with pytest.raises(DataError, match=f"the tokenizer {tmp_path}/lower.json splits text into the tokens of "
                                        f"{folder}/.*, which ckpt carries, another way "
                                        r"\(normalizer.strip_accents: false vs true, "
                                        r"normalizer.lowercase: false vs true\)"):
        choose_tokenizer(HFTokenizer(tmp_path / "lower.json"), carried, "ckpt")
    assert choose_tokenizer(HFTokenizer(tmp_path / "cased.json"), carried, "ckpt") is carried
    assert choose_tokenizer(HFTokenizer(tmp_path / "lower.json"), carried, "ckpt", same_pipeline=False) is carried
    # a vocab.txt with --tokenizer-type: its case is the type's, held to the carried pipeline whatever file that is
    vocab = write(tmp_path / "flag.txt", VOCAB)
    assert choose_tokenizer(BertWordPiece(vocab, lower_case=False), carried, "ckpt", "BertWordPieceCase") is carried
    with pytest.raises(DataError, match=f"the tokenizer {vocab} splits text into the tokens of"):
        choose_tokenizer(BertWordPiece(vocab), carried, "ckpt", "BertWordPieceLowerCase")
    copied = folder / ("tokenizer.json" if kind == "hf" else "vocab.txt")
    copied.write_text(copied.read_text().replace("mat", "rug"))
    with pytest.raises(DataError, match=f"its {copied.name} is not the tokenizer {CARRIED} records"):
        carried_tokenizer(folder)


def test_a_checkpoint_whose_vocab_copy_is_damaged_names_the_vocab_it_was_trained_with(tmp_path):
    """A line of the carried vocab.txt deleted: the fix was to build a vocab (tools/build_vocab.py), which
    cannot fit the trained weights. It names the one the checkpoint was trained with, which stands in where
    the flags pass it, as for a lost copy."""
    from megatron.data.tokenizer import naming_flags

    tokenizer = BertWordPiece(write(tmp_path / "source.txt", VOCAB))
    folder = tmp_path / "iter_0000001"
    folder.mkdir()
    carry(tokenizer, folder)
    damaged = write(folder / "vocab.txt", VOCAB[1:])
    with pytest.raises(DataError) as refused:
        carried_tokenizer(folder)
    assert str(refused.value) == (
        f"checkpoint {folder} names tokenizer {tokenizer.type_name} in {CARRIED} but its vocab.txt cannot be used "
        f"(vocab file {damaged} lacks the special tokens [PAD]); restore the checkpoint folder, or pass the tokenizer "
        f"it was trained with ({naming_flags(tokenizer.type_name, tokenizer.file)}, sha256 {tokenizer.identity[:12]})")
    with pytest.warns(UserWarning, match=f"cannot be used .*; using {re.escape(str(tokenizer.file))}, the tokenizer"):
        assert carried_tokenizer(folder, tokenizer).identity == tokenizer.identity


@pytest.mark.parametrize("kind", ["wordpiece", "hf"])
def test_a_checkpoint_that_lost_its_tokenizer_file_takes_the_flags_file_if_it_is_the_recorded_one(tmp_path, kind):
    """The carried copy deleted: a --tokenizer-file / --vocab-file was disregarded without a word ('restore
    the checkpoint folder'). Now the flags' file stands in, in one warning line, when its tokens and text
    pipeline are the record's (built as recorded: a vocab.txt keeps the checkpoint's case); another vocab,
    the same tokens split another way, or no flag are refused with a fix naming the recorded file."""
    from argparse import Namespace

    from megatron.data.tokenizer import naming_flags
    from megatron.data.tokenizer_identity import CARRIED_FILES, checkpoint_tokenizer

    if kind == "hf":
        source = tmp_path / "source.json"
        source.write_text(json.dumps(wordpiece_tokenizer_json(VOCAB, False)))
        tokenizer, copy = HFTokenizer(source), tmp_path / "copy" / "tokenizer.json"
    else:
        tokenizer, copy = BertWordPiece(write(tmp_path / "source.txt", VOCAB), False), tmp_path / "copy" / "vocab.txt"
    copy.parent.mkdir()
    copy.write_bytes(tokenizer.file_bytes)
    folder = tmp_path / "iter_0000001"
    folder.mkdir()
    carry(tokenizer, folder)
    (folder / CARRIED_FILES[tokenizer.type_name]).unlink()
    lacks = f"checkpoint {folder} names tokenizer {tokenizer.type_name} in {CARRIED} but lacks its {copy.name}"
    fix = (f"restore the checkpoint folder, or pass the tokenizer it was trained with "
           f"({naming_flags(tokenizer.type_name, tokenizer.file)}, sha256 {tokenizer.identity[:12]})")
    other = BertWordPiece(write(tmp_path / "other.txt", VOCAB[:5] + VOCAB[5:][::-1]))
    (tmp_path / "lower.json").write_text(json.dumps(wordpiece_tokenizer_json(VOCAB, True)))

    def flags(vocab_file=None, tokenizer_file=None) -> Namespace:  # a vocab.txt flag: lowercase by default
        return Namespace(tokenizer_type=None, vocab_file=vocab_file and str(vocab_file),
                         tokenizer_file=tokenizer_file and str(tokenizer_file))
    for given, problem in [(flags(), lacks),
                           (flags(other.file), f"{lacks}, and {other.file} is another vocab (sha256 "
                                               f"{other.identity[:12]})"),
                           (flags(tokenizer_file=tmp_path / "lower.json"), f"{lacks}, and {tmp_path / 'lower.json'} "
                                                                           "splits text into its tokens another way")]:
        with pytest.raises(DataError) as error:
            checkpoint_tokenizer(given, folder)
        assert str(error.value).startswith(problem) and str(error.value).endswith(fix), str(error.value)
    stands_in = f"{lacks}; using {copy}, the tokenizer its record names (sha256 {tokenizer.identity[:12]}, the same "
    with pytest.warns(UserWarning, match="^" + re.escape(stands_in + "text pipeline)")):
        standing_in = checkpoint_tokenizer(flags(tokenizer_file=copy) if kind == "hf" else flags(copy), folder)
    assert (standing_in.type_name, standing_in.identity, standing_in.file) == (tokenizer.type_name,
                                                                               tokenizer.identity, str(copy))
    assert standing_in.tokenize("The cats") == tokenizer.tokenize("The cats")  # cased, as trained


@pytest.mark.parametrize("kind", ["wordpiece", "hf"])
def test_a_checkpoint_that_lost_its_tokenizer_record_never_falls_back_to_another_vocab(tmp_path, kind):
    """The carried copy kept, its tokenizer_identity.json gone: the checkpoint was read as one that carries no
    tokenizer, so fill_mask.py silently used the default data's vocab (and to-hf asked for a tokenizer the folder
    holds). The record holds the copy's case and special tokens: without it the copy is refused alone, in one
    line naming the missing file and the flag that passes the copy; a flag of the copy's tokens is used, another
    vocab refused. Every reader goes through carried_tokenizer (the trainer's --load too)."""
    from argparse import Namespace

    from megatron.data.tokenizer_identity import CARRIED_FILES, checkpoint_tokenizer

    if kind == "hf":
        (tmp_path / "source.json").write_text(json.dumps(wordpiece_tokenizer_json(VOCAB, True)))
        tokenizer = HFTokenizer(tmp_path / "source.json")
    else:
        tokenizer = BertWordPiece(write(tmp_path / "source.txt", VOCAB))
    folder = tmp_path / "iter_0000001"
    folder.mkdir()
    carry(tokenizer, folder)
    (folder / CARRIED).unlink()
    copy = folder / CARRIED_FILES[tokenizer.type_name]
    flag = f"--tokenizer-file {copy}" if kind == "hf" else (f"--vocab-file {copy} with the --tokenizer-type it was "
                                                            "trained with")
    lost = (f"checkpoint {folder} holds {copy.name} but not {CARRIED}, the record of the tokenizer it trained with"
            f"{{}}; restore {CARRIED} into it, or pass {flag}")
    default = write(tmp_path / "default.txt", VOCAB)  # fill_mask.py's default vocab: never taken silently
    other = BertWordPiece(write(tmp_path / "other.txt", VOCAB[:5] + VOCAB[5:][::-1]))
    none = Namespace(tokenizer_type=None, vocab_file=None, tokenizer_file=None)
    another = lost.format(f", and {other.file} is another vocab (sha256 {other.identity[:12]} vs "
                          f"{tokenizer.identity[:12]})")
    for given, problem in [(none, lost.format("")), (Namespace(**{**vars(none), "vocab_file": str(other.file)}),
                                                    another)]:
        with pytest.raises(DataError) as error:
            checkpoint_tokenizer(given, folder, default)
        assert str(error.value) == problem
    named = Namespace(**{**vars(none), "tokenizer_file" if kind == "hf" else "vocab_file": str(copy)})
    assert checkpoint_tokenizer(named, folder, default).file == str(copy)


def test_a_run_from_a_checkpoint_that_lost_its_tokenizer_file_takes_the_flags_one(tmp_path, capsys):
    """pretrain_bert.py --load (and extend_context.py --from a checkpoint): the same stand-in, in one
    `warning:` line of the first rank."""
    from megatron import hf_convert
    from megatron.arguments import build_parser
    from megatron.model.bert import BertConfig, BertModel

    tokenizer = BertWordPiece(write(tmp_path / "vocab.txt", VOCAB))
    config = BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_layers=1, num_attention_heads=2, seq_length=16,
                        max_position_embeddings=16)
    hf_convert.save_weights_only_checkpoint(tmp_path / "ck", BertModel(config).state_dict(), config, tokenizer)
    (tmp_path / "ck" / "iter_0000000" / "vocab.txt").unlink()
    capsys.readouterr()
    args = build_parser().parse_args(["--load", str(tmp_path / "ck"), "--vocab-file", str(tmp_path / "vocab.txt")])
    assert run_tokenizer(args).identity == tokenizer.identity
    assert capsys.readouterr().err.splitlines() == [
        f"warning: checkpoint {tmp_path / 'ck' / 'iter_0000000'} names tokenizer BertWordPieceLowerCase in {CARRIED} "
        f"but lacks its vocab.txt; using {tmp_path / 'vocab.txt'}, the tokenizer its record names (sha256 "
        f"{tokenizer.identity[:12]}, the same text pipeline)"]


def test_a_tokenizer_type_flag_overrides_the_hf_folders_tokenizer(tmp_path):
    """--init-from-hf with --tokenizer-type and --tokenizer-file: the flags' tokenizer is the run's even
    where it splits the folder's tokens another way (an explicit choice); without the type, it is refused."""
    from megatron.arguments import build_parser

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "tokenizer.json").write_text(json.dumps(wordpiece_tokenizer_json(VOCAB, True)))
    (tmp_path / "cased.json").write_text(json.dumps(wordpiece_tokenizer_json(VOCAB, False)))
    flags = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
             "--init-from-hf", str(tmp_path / "hf"), "--tokenizer-file", str(tmp_path / "cased.json")]
    chosen = run_tokenizer(build_parser().parse_args([*flags, "--tokenizer-type", "HFTokenizer"]))
    assert chosen.file == str(tmp_path / "cased.json")
    with pytest.raises(DataError, match="splits text into the tokens of .*hf/tokenizer.json, which .*hf carries"):
        run_tokenizer(build_parser().parse_args(flags))


def test_a_tokenizer_type_alone_is_the_hf_folders_case_or_refused_as_another_family(tmp_path):
    """--init-from-hf with --tokenizer-type and no tokenizer file: a WordPiece case is the folder vocab.txt's
    (its tokenizer_config may not say it), as a --vocab-file's type is; the other family (HFTokenizer over a
    vocab.txt, WordPiece over a tokenizer.json) was disregarded without a word, where a resume refuses it."""
    from megatron.arguments import build_parser

    (tmp_path / "bert").mkdir()
    write(tmp_path / "bert" / "vocab.txt", VOCAB)
    (tmp_path / "modern").mkdir()
    (tmp_path / "modern" / "tokenizer.json").write_text(json.dumps(wordpiece_tokenizer_json(VOCAB, True)))

    def folder_tokenizer(folder, flag_type):
        return run_tokenizer(build_parser().parse_args(["--init-from-hf", str(tmp_path / folder),
                                                        "--tokenizer-type", flag_type]))

    assert folder_tokenizer("bert", "BertWordPieceCase").type_name == "BertWordPieceCase"
    assert folder_tokenizer("modern", "HFTokenizer").file == str(tmp_path / "modern" / "tokenizer.json")
    for folder, flag_type, carried in (("bert", "HFTokenizer", "BertWordPieceLowerCase"),
                                       ("modern", "BertWordPieceCase", "HFTokenizer")):
        with pytest.raises(ConfigError) as caught:
            folder_tokenizer(folder, flag_type)
        assert str(caught.value) == (f"--tokenizer-type {flag_type} differs from {carried}, which the Hugging Face "
                                     f"folder {tmp_path / folder} was trained with; drop --tokenizer-type (the "
                                     "folder carries its tokenizer)")


def test_a_vocab_size_flag_below_the_tokenizers_is_named_as_the_source(tmp_path):
    """training.check_vocab_room: --vocab-size 500 with a 1000-token tokenizer told to pass 'the --vocab-file
    the model was trained with', though the flag set the size; without the flag, check_fits's line."""
    from megatron import training

    tokenizer = BertWordPiece(write(tmp_path / "vocab.txt", VOCAB))
    with pytest.raises(ConfigError) as caught:
        training.check_vocab_room(argparse.Namespace(vocab_size=8), tokenizer, 8)
    assert str(caught.value) == (f"--vocab-size 8 is below the 12 tokens of the tokenizer {tmp_path}/vocab.txt; "
                                 "raise --vocab-size to 12 or more, or drop it (the tokenizer's size is the default)")
    with pytest.raises(ConfigError, match="has 12 tokens, the model's vocab_size is 8; pass the --vocab-file"):
        training.check_vocab_room(argparse.Namespace(vocab_size=None), tokenizer, 8)
    training.check_vocab_room(argparse.Namespace(vocab_size=16), tokenizer, 16)


def test_data_records_its_vocab(tmp_path):
    tokenizer = BertWordPiece(write(tmp_path / "vocab.txt", VOCAB))
    shuffled = BertWordPiece(write(tmp_path / "shuffled.txt", VOCAB[:5] + VOCAB[5:][::-1]))
    prefixes = [str(tmp_path / "a_text_sentence"), str(tmp_path / "b_text_sentence")]
    check_data_vocab(shuffled, prefixes)  # data made before the record existed: size checks only
    write_data_identity(tokenizer, prefixes[1])
    check_data_vocab(tokenizer, prefixes)
    with pytest.raises(DataError, match=f"the data {prefixes[1]} was preprocessed with the vocab {tmp_path}/vocab.txt, "
                                        f"whose tokens differ from the run's {tmp_path}/shuffled.txt"):
        check_data_vocab(shuffled, prefixes)


def test_the_default_dataset_gains_the_record_it_was_built_without(tmp_path):
    dataset = prepare_default_dataset(tmp_path, workers=1, max_bytes=60_000, vocab_size=600)
    record = data_identity_path(dataset.data_prefix)
    assert json.loads(record.read_text())["vocab_sha256"] == BertWordPiece(dataset.vocab_file).identity
    record.unlink()
    prepare_default_dataset(tmp_path, workers=1, max_bytes=60_000, vocab_size=600)
    assert json.loads(record.read_text())["vocab_sha256"] == BertWordPiece(dataset.vocab_file).identity


def test_a_cased_checkpoint_stays_cased_when_a_flag_names_its_vocab(tmp_path):
    """--vocab-file without --tokenizer-type builds the lowercase default; the checkpoint's cased
    tokenizer must win, or every later checkpoint, fill-mask and export would lowercase. And the
    carried copy outlives the file it was read from (--keep-last removes the checkpoint resumed from)."""
    cased = BertWordPiece(write(tmp_path / "vocab.txt", VOCAB), lower_case=False)
    (tmp_path / "ckpt").mkdir()
    carry(cased, tmp_path / "ckpt")
    carried = carried_tokenizer(tmp_path / "ckpt")
    chosen = choose_tokenizer(BertWordPiece(tmp_path / "vocab.txt"), carried, "ckpt")
    assert chosen.type_name == "BertWordPieceCase" and chosen.tokenize("The") != BertWordPiece(
        tmp_path / "vocab.txt").tokenize("The")
    (tmp_path / "next").mkdir()
    (tmp_path / "ckpt" / "vocab.txt").unlink()
    carry(carried, tmp_path / "next")
    assert carried_tokenizer(tmp_path / "next").identity == cased.identity


def test_a_flags_tokenizer_naming_other_special_tokens_is_refused_at_every_entry_point(tmp_path, capsys):
    """The carried tokenizer.json again, in a folder whose tokenizer_config.json names other special tokens
    ([CLS] as the mask, [MASK] as cls): the same tokens and pipeline, so a resume, fill_mask.py, to-hf and an
    --init-from-hf run used the checkpoint's special tokens without a word. Now one line names both files
    and the tokens that differ; the checkpoint's own tokenizer.json (or one of the same specials) passes."""
    import sys
    from argparse import Namespace
    from pathlib import Path

    from megatron import hf_convert
    from megatron.arguments import build_parser
    from megatron.data.tokenizer_identity import checkpoint_tokenizer
    from megatron.model.bert import BertConfig, BertModel

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import convert_checkpoint
    import fill_mask

    (tmp_path / "tokenizer.json").write_text(json.dumps(wordpiece_tokenizer_json(VOCAB, True)))
    tokenizer = HFTokenizer(tmp_path / "tokenizer.json")
    config = BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_layers=1, num_attention_heads=2, seq_length=16,
                        max_position_embeddings=16)
    hf_convert.save_weights_only_checkpoint(tmp_path / "ck", BertModel(config).state_dict(), config, tokenizer)
    folder = tmp_path / "ck" / "iter_0000000"
    other = tmp_path / "other"
    other.mkdir()
    (other / "tokenizer.json").write_bytes(tokenizer.file_bytes)
    (other / "tokenizer_config.json").write_text(json.dumps({"mask_token": "[CLS]", "cls_token": "[MASK]"}))
    differ = "(cls: '[MASK]', not '[CLS]', mask: '[CLS]', not '[MASK]')"
    refused = (f"the tokenizer {other / 'tokenizer.json'} names other special tokens than {{carried}}, which "
               f"{{holder}} carries {differ}; drop the tokenizer flags")

    def refuses(call, carried=folder / "tokenizer.json", holder=folder):
        with pytest.raises(DataError) as caught:
            call()
        assert str(caught.value).startswith(refused.format(carried=carried, holder=holder)), str(caught.value)

    flags = Namespace(tokenizer_type=None, vocab_file=None, tokenizer_file=str(other))
    refuses(lambda: checkpoint_tokenizer(flags, folder))
    assert checkpoint_tokenizer(Namespace(**{**vars(flags), "tokenizer_file": str(tmp_path)}), folder).ids == (
        tokenizer.ids)  # the same specials: the carried one
    load = ["--load", str(tmp_path / "ck"), "--tokenizer-file", str(other)]
    refuses(lambda: fill_mask.main([*load, "--text", "a [MASK]"]))
    refuses(lambda: convert_checkpoint.main(["to-hf", *load, "--output", str(tmp_path / "hf")]))
    assert not (tmp_path / "hf").exists()
    refuses(lambda: run_tokenizer(build_parser().parse_args(load)), holder=tmp_path / "ck")
    (tmp_path / "init").mkdir()
    (tmp_path / "init" / "tokenizer.json").write_bytes(tokenizer.file_bytes)
    for typed in ([], ["--tokenizer-type", "HFTokenizer"]):  # a type overrides the folder's pipeline, not its specials
        refuses(lambda: run_tokenizer(build_parser().parse_args([
            "--init-from-hf", str(tmp_path / "init"), "--tokenizer-file", str(other), *typed])),
            carried=tmp_path / "init" / "tokenizer.json", holder=tmp_path / "init")
    # a checkpoint that lost its copy: the flags' file stands in only with the recorded special tokens
    (folder / "tokenizer.json").unlink()
    with pytest.raises(DataError, match=re.escape(f"lacks its tokenizer.json, and {other / 'tokenizer.json'} names "
                                                  f"other special tokens {differ}; restore the checkpoint folder")):
        checkpoint_tokenizer(flags, folder)


def test_the_run_names_data_without_its_vocab_record_and_a_flags_case_mismatch(tmp_path, capsys):
    """A dataset copied as .bin/.idx alone passes the vocab check unchecked, and a vocab of the same size would
    train on ids of other tokens: one `warning:` line names the record to copy. A --tokenizer-type that
    contradicts the vocab's case: another (the one preprocessing printed too)."""
    from megatron import run_data, start_plan
    from megatron.arguments import build_parser
    from megatron.data.indexed_dataset import make_builder

    vocab = write(tmp_path / "vocab.txt", VOCAB)
    prefixes = [str(tmp_path / name) for name in ("recorded", "copied")]
    for prefix in prefixes:
        builder = make_builder(prefix, "mmap", len(VOCAB))
        builder.add_document([[5, 6, 7]])
        builder.finalize()
    write_data_identity(BertWordPiece(vocab, lower_case=False), prefixes[0])
    capsys.readouterr()
    args = build_parser().parse_args(["--data-path", "1", prefixes[0], "1", prefixes[1], "--vocab-file", str(vocab),
                                      "--tokenizer-type", "BertWordPieceCase"])
    run_data.data_paths(args, start_plan.StartPlan.given(args))
    assert capsys.readouterr().err.splitlines() == [
        f"warning: the data {prefixes[1]} lacks copied.vocab_identity.json, which tools/preprocess_data.py writes "
        f"beside the .bin/.idx: the tokenizer it was preprocessed with cannot be checked against the run's {vocab}; "
        "copy that file beside the .bin/.idx (it is part of the dataset), or preprocess again with this tokenizer",
        f"warning: the vocab {vocab} holds no token with a capital, while --tokenizer-type BertWordPieceCase keeps "
        "the text's case: each capitalised word becomes [UNK]; drop --tokenizer-type BertWordPieceCase (the default "
        "BertWordPieceLowerCase lower-cases the text, as the vocab was built)"]
    for prefix in prefixes:
        write_data_identity(BertWordPiece(vocab), prefix)
    args.tokenizer_type = None
    run_data.data_paths(args, start_plan.StartPlan.given(args))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("kind", ["wordpiece", "hf"])
def test_a_ranks_start_builds_its_tokenizer_once(tmp_path, monkeypatch, kind):
    """At a multi-rank start the nodes' comparison (same_settings.content_identities) built the tokenizer, and the
    run (run_tokenizer) built it again: ~0.4 s per rank for a BPE tokenizer.json. It is built once now, and again
    only where its file changed since (the same size, within one clock tick: its bytes decide)."""
    from megatron.arguments import build_parser
    from megatron.data import tokenizer
    from megatron.parallel import same_settings

    built, real = [], tokenizer.build_tokenizer
    monkeypatch.setattr(tokenizer, "build_tokenizer",
                        lambda *given, **named: built.append(given) or real(*given, **named))
    if kind == "hf":
        path = tmp_path / "tokenizer.json"
        path.write_text(json.dumps(wordpiece_tokenizer_json(VOCAB, True)))
        args = build_parser().parse_args(["--tokenizer-file", str(path)])
    else:
        path = write(tmp_path / "vocab.txt", VOCAB)
        args = build_parser().parse_args(["--vocab-file", str(path)])
    identity = same_settings.content_identities(same_settings.launch_settings(args, {}))
    first = run_tokenizer(args)
    assert len(built) == 1 and first.identity == identity[same_settings.CONTENT + ("tokenizer_file" if kind == "hf"
                                                                                   else "vocab_file")]["vocab_sha256"]
    if kind == "hf":
        path.write_text(json.dumps(wordpiece_tokenizer_json(VOCAB[:5] + VOCAB[5:][::-1], True)))
    else:
        write(path, VOCAB[:5] + VOCAB[5:][::-1])  # the same size
    second = run_tokenizer(args)
    assert len(built) == 2 and second.identity != first.identity
