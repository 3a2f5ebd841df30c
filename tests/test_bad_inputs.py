"""The bad-input catalogue: every mistake a user can make at an entry point ends with one line
naming the problem and the fix, exit code 2, no traceback (unless --debug), nothing half-written.

Each row of CASES breaks one thing of a valid tiny setup (dataset, vocab, DeepSpeed JSON,
checkpoint, hostfile) built once per module, runs the real entry point in a subprocess and
names the phrases the last stderr line must hold. Adding a case is one row.
"""
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from megatron.data.default_dataset import prepare_default_dataset
from megatron.errors import ConfigError
from megatron.parallel.spawn import free_port
from test_corpus_formats import HUB_SPLITS, broken_corpus

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
        "--max-position-embeddings", "64", "--attention-dropout", "0", "--micro-batch-size", "2"]
# {placeholders}: tmp (this case's folder), data (prefix of the valid dataset), vocab, corpus, ckpt (a valid checkpoint)
PRETRAIN = [*TINY, "--data-path", "{data}", "--vocab-file", "{vocab}", "--train-iters", "1", "--eval-iters", "1",
            "--log-dir", "{tmp}/log"]
GOOD_JSON = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
             "zero_optimization": {"stage": 1}, "sequence_parallel": {"size": 1, "attention": "dense"}}


def ds_json(**changes) -> str:
    """GOOD_JSON as text with one or more keys set; `zero_optimization__stage=4` sets a nested key."""
    config = json.loads(json.dumps(GOOD_JSON))
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return json.dumps(config, indent=2)


@dataclass
class Case:
    id: str
    command: str  # a key of COMMANDS
    argv: list
    phrases: tuple  # all must be in the last stderr line
    files: dict = field(default_factory=dict)  # name -> text written into the case folder first
    setup: object = None  # callable(tmp, assets) that breaks something in the case folder
    needs_checkpoint: bool = False
    env: dict = field(default_factory=dict)  # extra environment (launch scripts)
    mid_run: bool = False  # found while training: the run log of the failed run stays (nothing else)


def pretrain(*argv, files=None, setup=None, phrases=(), needs_checkpoint=False, id="", mid_run=False):
    return Case(id, "pretrain", [*PRETRAIN, *argv], tuple(phrases), files or {}, setup, needs_checkpoint,
                mid_run=mid_run)


def copy_data(tmp: Path, assets: dict) -> Path:
    """A copy of the valid dataset in the case folder; returns its prefix."""
    prefix = tmp / "copy"
    for suffix in (".bin", ".idx"):
        shutil.copy(assets["data"] + suffix, str(prefix) + suffix)
    return prefix


def monitor_output_in(tmp: Path, output_path: Path) -> None:
    """ds.json with DeepSpeed's csv_monitor writing under `output_path`, made a file here."""
    output_path.write_text("a file, not a folder")
    (tmp / "ds.json").write_text(ds_json(csv_monitor={"enabled": True, "output_path": str(output_path),
                                                      "job_name": "job"}))


def truncate_bin(tmp, assets):
    prefix = copy_data(tmp, assets)
    with open(f"{prefix}.bin", "r+b") as file:
        file.truncate(os.path.getsize(f"{prefix}.bin") // 2)


def bad_idx_magic(tmp, assets):
    prefix = copy_data(tmp, assets)
    with open(f"{prefix}.idx", "r+b") as file:
        file.write(b"NOTANIDX\x00")


def vocab_without(token: str):
    def setup(tmp, assets):
        lines = Path(assets["vocab"]).read_text().splitlines()
        (tmp / "vocab.txt").write_text("\n".join(line for line in lines if line != token) + "\n")
    return setup


def corrupt_checkpoint(tmp: Path, assets: dict):
    """A copy of the valid checkpoint whose model states file is overwritten."""
    copy = shutil.copytree(assets["ckpt"], tmp / "ckpt")
    model_states = sorted(copy.glob("*/mp_rank_00_model_states.pt"))
    assert model_states, list(copy.rglob("*"))
    model_states[0].write_bytes(b"not a torch file")


def idx_from_another_dataset(tmp, assets):
    """The valid .bin with the .idx of a smaller dataset."""
    from megatron.data.indexed_dataset import make_builder

    prefix = copy_data(tmp, assets)
    builder = make_builder(str(tmp / "other"), "mmap", 2000)
    builder.add_document([[5, 6, 7], [8, 9]])
    builder.finalize()
    shutil.move(str(tmp / "other.idx"), f"{prefix}.idx")
    os.remove(tmp / "other.bin")


def vocab_of(lines: int):
    """A vocab of the first `lines` tokens of the valid one: the data holds ids beyond it."""
    def setup(tmp, assets):
        tokens = Path(assets["vocab"]).read_text().splitlines()[:lines]
        (tmp / "vocab.txt").write_text("\n".join(tokens) + "\n")
    return setup


def truncated_run_state(tmp: Path, assets: dict):
    copy = shutil.copytree(assets["ckpt"], tmp / "ckpt")
    for path in copy.glob("*/run_state.json"):
        path.write_text(path.read_text()[:25])


def hf_folder(tmp: Path, assets: dict, without=(), config_changes=None, nan=()) -> Path:
    """A Hugging Face MegatronBert folder of the TINY model (this trainer's export of fresh weights) in
    `tmp`/hf, without the tensors `without` (a damaged download), with a NaN in each of the tensors `nan`
    and with `config_changes` in config.json."""
    from megatron import hf_convert, hf_io
    from megatron.model.bert import BertConfig, BertModel

    vocab_size = len(Path(assets["vocab"]).read_text().splitlines())
    config = BertConfig(vocab_size=vocab_size, num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64,
                        max_position_embeddings=512)  # as published BERTs (the run passes 512 too)
    hf_convert.save_hf_folder(tmp / "hf", BertModel(config).state_dict(), config, assets["vocab"], lower_case=True)
    weights = tmp / "hf" / "model.safetensors"
    tensors = hf_io.read_safetensors(weights)
    assert set(without) <= set(tensors), sorted(tensors)
    for name in nan:
        tensors[name][0] = float("nan")
    hf_io.write_safetensors(weights, {name: t for name, t in tensors.items() if name not in without})
    if config_changes:
        path = tmp / "hf" / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config_changes}))
    return tmp / "hf"


MISSING_KEY = "bert.encoder.layer.1.attention.self.key.weight"
# the env:// variables a launcher sets: None unsets them (a process started by hand)
NO_LAUNCHER = {name: None for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}


CASES = [
    # ---- DeepSpeed JSON
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_syntax_error",
             files={"ds.json": '{\n  "train_micro_batch_size_per_gpu": 2,\n  "zero_optimization": {"stage": 1,}\n}'},
             phrases=("ds.json:3:", "invalid JSON", "fix the JSON syntax")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_not_an_object", files={"ds.json": "[1, 2]"},
             phrases=("not an object", "wrap the settings in { }")),
    pretrain("--deepspeed_config", "{tmp}/missing.json", id="json_missing",
             phrases=("missing.json does not exist", "--deepspeed_config")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_unknown_attention",
             files={"ds.json": ds_json(sequence_parallel__attention="flash")},
             phrases=("unknown attention variant 'flash'", "ring", "ulysses")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_unknown_section_key",
             files={"ds.json": ds_json(sequence_parallel__sise=2)},
             phrases=("unknown key sequence_parallel.sise", "size")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_sp_size_not_int",
             files={"ds.json": ds_json(sequence_parallel__size="2")},
             phrases=('sequence_parallel.size = "2" is not an integer', "set sequence_parallel.size to an integer")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_monitor_without_its_package",
             files={"ds.json": ds_json(comet={"enabled": True})},
             phrases=("ds.json enables comet, and the comet_ml package is not installed", "pip install comet_ml",
                      "or set comet.enabled to false")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_monitor_output_path_is_a_file",
             setup=lambda tmp, assets: monitor_output_in(tmp, tmp / "a_file"),
             phrases=("csv_monitor.output_path ", "a_file is a file, not a directory",
                      "set csv_monitor.output_path to a folder this user can write")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_micro_batch_not_int",
             files={"ds.json": ds_json(train_micro_batch_size_per_gpu=2.5)},
             phrases=("train_micro_batch_size_per_gpu = 2.5 is not an integer", "set train_micro_batch_size_per_gpu")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_zero_stage_not_int",
             files={"ds.json": ds_json(zero_optimization__stage="1")},
             phrases=('zero_optimization.stage = "1" is not an integer', "set zero_optimization.stage")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_zero_section_not_object",
             files={"ds.json": ds_json(zero_optimization=1)},
             phrases=("zero_optimization", "JSON object")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_linformer_bool_not_bool",
             files={"ds.json": ds_json(sequence_parallel__linformer={"share_kv": "yes"})},
             phrases=('sequence_parallel.linformer.share_kv = "yes" is not a boolean', "true or false")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_clipping_not_number",
             files={"ds.json": ds_json(gradient_clipping="1.0")},
             phrases=('gradient_clipping = "1.0" is not a number', "set gradient_clipping to a number")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", "--micro-batch-size", "4", id="json_inconsistent_batch",
             files={"ds.json": ds_json(train_batch_size=6)},
             phrases=("train_batch_size 6 is not a multiple of --micro-batch-size 4", "make train_batch_size 4 (micro "
                      "x the JSON's gradient_accumulation_steps 1 x data-parallel size), or a multiple of 4 with")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_sp_size_not_dividing_world",
             files={"ds.json": ds_json(sequence_parallel__size=2)},
             phrases=("sequence_parallel.size 2 x pipeline 1 does not divide the world size 1",
                      "; launch 2 processes (or a multiple) with deepspeed --num_gpus 2 pretrain_bert.py ",
                      ", or pass --sequence-parallel-size 1 to run on 1 process")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_deepspeed_rejects_zero_key",
             files={"ds.json": ds_json(zero_optimization__stage_3_typo=1)},
             phrases=("zero_optimization.stage_3_typo", "remove")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_deepspeed_rejects_zero_stage",
             files={"ds.json": ds_json(zero_optimization__stage=4)},
             phrases=("zero_optimization.stage 4 is not a ZeRO stage", "set zero_optimization.stage to 0, 1, 2 or 3")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_deepspeed_rejects_fp16_with_bf16",
             files={"ds.json": ds_json(fp16={"enabled": True}, bf16={"enabled": True})},
             phrases=("fp16.enabled and bf16.enabled are both true", "pick one")),
    Case("json_zero2_with_pipeline", "launch2",
         [*PRETRAIN, "--deepspeed_config", "{tmp}/ds.json", "--pipeline-model-parallel-size", "2"],
         ("zero_optimization.stage 2 cannot be combined with pipeline", "use zero_optimization.stage 0 or 1"),
         files={"ds.json": ds_json(zero_optimization__stage=2)}),
    Case("flag_pipeline_deeper_than_the_layers", "launch2",  # a stage of only the heads
         [*PRETRAIN, "--deepspeed_config", "{tmp}/ds.json", "--pipeline-model-parallel-size", "2", "--num-layers", "1"],
         ("--pipeline-model-parallel-size 2 is more pipeline stages than the 1 transformer layer:",
          "pass --pipeline-model-parallel-size 1, or pass --num-layers 2 or more"),
         files={"ds.json": ds_json(zero_optimization__stage=1)}),
    # ---- flags
    Case("flag_seq_not_divisible_by_sp", "launch2", [*PRETRAIN, "--sequence-parallel-size", "2", "--attention", "linformer",
                                                     "--seq-length", "63", "--max-position-embeddings", "64"],
         ("seq_length 63 is not divisible by the sequence-parallel size 2",
          "multiple of --sequence-parallel-size")),
    pretrain("--hidden-size", "66", id="flag_heads_not_dividing_hidden",
             phrases=("hidden_size 66 is not divisible by num_attention_heads 4", "divides the hidden size")),
    Case("flag_ulysses_heads_not_divisible_by_sp", "ds_config",
         ["validate", "{tmp}/ds.json", "--world-size", "2", "--attention-dropout", "0", "--num-attention-heads", "3",
          "--hidden-size", "66"], ("num_attention_heads (3)", "use sequence_parallel.attention ring, or ",
                                   "a head count that is a multiple of 2"),
         files={"ds.json": ds_json(sequence_parallel={"size": 2, "attention": "ulysses"})}),
    pretrain("--attention", "bigbird", "--block-size", "24", id="flag_block_size_not_dividing_seq",
             phrases=("seq_length 64 is not divisible by bigbird block size 24", "another --block-size")),
    pretrain("--attention", "linformer", "--linformer-k", "128", id="flag_linformer_k_exceeds_seq",
             phrases=("linformer_k 128 exceeds seq_length 64", "--linformer-k")),
    pretrain("--seq-length", "128", id="flag_seq_longer_than_positions",
             phrases=("seq_length 128", "--max-position-embeddings")),
    pretrain("--pack-samples", "--attention", "linformer", "--linformer-k", "32", id="flag_pack_with_linformer",
             phrases=("--pack-samples", "linformer", "use ring, ulysses, bigbird or dense", "drop --pack-samples")),
    pretrain("--pack-samples", "--max-segment-length", "128", id="flag_pack_segment_longer_than_seq",
             phrases=("max_segment_length 128 exceeds seq_length 64", "lower --max-segment-length")),
    pretrain("--pack-samples", "--seq-length", "128", "--max-segment-length", "128",
             id="flag_pack_segment_past_positions",
             phrases=("max_segment_length 128 exceeds max_position_embeddings 64", "--max-position-embeddings")),
    pretrain("--max-segment-length", "32", id="flag_segment_length_without_packing",
             phrases=("max_segment_length 32", "add --pack-samples")),
    pretrain("--attention", "ring", "--attention-dropout", "0.1", id="flag_ring_attention_dropout",
             phrases=("attention_dropout 0.1 is not supported by ring attention", "--attention-dropout 0")),
    pretrain("--train-iters", "0", id="flag_no_run_length", phrases=("run length", "--train-iters N")),
    pretrain("--split", "a,b", id="flag_bad_split", phrases=("--split 'a,b'", "--split 949,50,1")),
    # ---- data
    pretrain("--data-path", "{tmp}/no/such/prefix", id="data_missing_prefix",
             phrases=("no/such/prefix", "does not exist", "--data-path")),
    pretrain("--data-path", "{data}.bin", id="data_path_with_bin_suffix",
             phrases=(".bin.idx does not exist", "drop the .bin/.idx suffix: --data-path", "sample_text_sentence")),
    # the data folder given: `data.idx does not exist` named a file that cannot be there
    pretrain("--data-path", "{tmp}/data", id="data_path_is_the_data_folder",
             setup=lambda tmp, assets: [(tmp / "data").mkdir()] + [
                 shutil.copy(assets["data"] + suffix, f"{tmp}/data/c_text_sentence{suffix}") for suffix in (".bin", ".idx")],
             phrases=("--data-path", "data is a folder, not a dataset prefix", "data/c_text_sentence")),
    pretrain("--data-path", "{tmp}/c", id="data_path_only_a_killed_preprocess_partial",
             setup=lambda tmp, assets: (tmp / "c.bin.partial").write_bytes(b"\0" * 64),
             phrases=("c.bin.partial is the output of a preprocess_data.py that was killed", "run that preprocess again")),
    # Megatron-LM's and NeMo's comma list: `dataset file a,b.idx does not exist` named no fix
    pretrain("--data-path", "{data},{tmp}/copy", id="data_path_is_a_comma_list", setup=copy_data,
             phrases=("is a comma list, read as one path", "pass the prefixes as separate values, each after its "
                      "weight", "--data-path 1 ", "sample_text_sentence 1 ", "/copy")),
    pretrain("--data-path", "{tmp}/corpus", id="data_path_is_the_output_prefix",  # not PREFIX_text_sentence
             setup=lambda tmp, assets: [shutil.copy(assets["data"] + suffix, f"{tmp}/corpus_text_sentence{suffix}")
                                        for suffix in (".bin", ".idx")],
             phrases=("corpus.idx does not exist", "pass the dataset preprocess_data.py wrote for --output-prefix",
                      "--data-path", "corpus_text_sentence")),
    pretrain("--data-path", "{tmp}/copy", setup=truncate_bin, id="data_truncated_bin",
             phrases=("copy.bin", "rerun tools/preprocess_data.py")),
    pretrain("--data-path", "{tmp}/copy", setup=bad_idx_magic, id="data_bad_idx_magic",
             phrases=("copy.idx", "bad magic", "rerun tools/preprocess_data.py")),
    pretrain("--vocab-file", "{tmp}/vocab.txt", setup=vocab_without("[MASK]"), id="data_vocab_without_mask",
             phrases=("lacks the special tokens [MASK]", "tools/build_vocab.py")),
    pretrain("--vocab-file", "{tmp}/vocab.txt", id="data_vocab_not_utf8", files={"vocab.txt": ""},
             setup=lambda tmp, assets: (tmp / "vocab.txt").write_bytes(b"[PAD]\n[UNK]\ncaf\xe9\n"),
             phrases=("vocab.txt is not UTF-8 text (line 3: byte 0xe9)", "one token per line")),
    # a vocab's line number is its id: a token twice, a blank line; a Hugging Face vocab.json is a JSON object
    Case("data_vocab_token_twice", "preprocess", ["--input", "{corpus}", "--vocab-file", "{tmp}/vocab.txt",
                                                  "--output-prefix", "{tmp}/corpus"],
         ("holds '[MASK]' twice, on lines 5 and", "delete line", "placeholder token"),
         setup=lambda tmp, assets: (tmp / "vocab.txt").write_text(Path(assets["vocab"]).read_text() + "[MASK]\n")),
    pretrain("--vocab-file", "{tmp}/vocab.txt", id="data_vocab_blank_lines",
             setup=lambda tmp, assets: (tmp / "vocab.txt").write_text(
                 Path(assets["vocab"]).read_text().replace("\n", "\n\n", 2)),
             phrases=("vocab.txt lines 2, 4 are blank", "delete all but one of them")),
    Case("data_vocab_is_a_hf_vocab_json", "preprocess", ["--input", "{corpus}", "--vocab-file", "{tmp}/vocab.json",
                                                         "--output-prefix", "{tmp}/corpus"],
         ("vocab.json is a JSON map of token to id (a Hugging Face vocab.json), not a vocab.txt",
          "pass the tokenizer.json of that model", "--tokenizer-file"),
         files={"vocab.json": json.dumps({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "the": 5})}),
    Case("data_preprocess_vocab_is_a_directory", "preprocess", ["--input", "{corpus}", "--vocab-file", "{tmp}",
                                                                "--output-prefix", "{tmp}/corpus"],
         ("is a directory", "pass the vocab.txt inside it")),
    pretrain("--vocab-file", "{tmp}/none.txt", id="data_vocab_missing",
             phrases=("none.txt does not exist", "--vocab-file")),
    pretrain("--data-path", "1", "{data}", "2", id="data_path_weights_unpaired",
             phrases=("weight/prefix pairs", "--data-path W1 PREFIX1")),
    Case("data_empty_corpus", "preprocess", ["--input", "{tmp}/empty.json", "--vocab-file", "{vocab}",
                                             "--output-prefix", "{tmp}/out/corpus", "--split-sentences"],
         ("empty.json has no documents", "pass a corpus with text"), files={"empty.json": "", "out/.keep": ""}),
    Case("data_corpus_bad_json_line", "preprocess", ["--input", "{tmp}/bad.json", "--vocab-file", "{vocab}",
                                                     "--output-prefix", "{tmp}/out/corpus"],
         ("bad.json line 2: invalid JSON", "--skip-invalid"),
         files={"bad.json": '{"text": "One."}\n{"text": \n', "out/.keep": ""}),
    Case("data_corpus_one_json_array", "preprocess", ["--input", "{tmp}/array.json", "--vocab-file", "{vocab}",
                                                      "--output-prefix", "{tmp}/out/corpus", "--skip-invalid"],
         ("array.json is one JSON array, not JSON lines", "jq -c '.[]'"),
         files={"array.json": '[{"text": "One."}, {"text": "Two."}]\n', "out/.keep": ""}),
    Case("data_preprocess_vocab_missing", "preprocess", ["--input", "{corpus}", "--vocab-file", "{tmp}/none.txt",
                                                         "--output-prefix", "{tmp}/corpus"],
         ("none.txt does not exist", "--vocab-file")),
    Case("data_build_vocab_input_missing", "build_vocab", ["--input", "{tmp}/none.json", "--output", "{tmp}/vocab.txt"],
         ("none.json does not exist", "--input")),
    Case("data_build_vocab_too_small", "build_vocab", ["--input", "{corpus}", "--output", "{tmp}/vocab.txt",
                                                       "--vocab-size", "3"], ("--vocab-size 3", "larger --vocab-size")),
    Case("tool_ds_config_bad_assignment", "ds_config", ["set", "{tmp}/ds.json", "zero_optimization.stage"],
         ("'zero_optimization.stage' is not key.path=value", "sequence_parallel.size=4"),
         files={"ds.json": ds_json()}),
    Case("tool_ds_config_set_invalid_value", "ds_config", ["set", "{tmp}/ds.json", "sequence_parallel.size=3",
                                                           "--world-size", "2"],
         ("sequence_parallel.size 3", "does not divide the world size 2"), files={"ds.json": ds_json()}),
    # ---- hostfile, through the multi-node launch script
    Case("hostfile_bad_slots", "multinode", ["{tmp}/hostfile", "2"], ("hostfile", "line 2", "slots=<gpus>"),
         files={"hostfile": "worker-1 slots=2\nworker-2 slots=two\n"}),
    Case("hostfile_duplicate_host", "multinode", ["{tmp}/hostfile", "2"], ("worker-1", "twice", "once"),
         files={"hostfile": "worker-1 slots=2\nworker-1 slots=2\n"}),
    Case("hostfile_empty", "multinode", ["{tmp}/hostfile", "1"], ("no hosts", "slots=<gpus>"),
         files={"hostfile": "# nothing here\n\n"}),
    # named by the launch script the user ran, as its other errors are (check_hostfile.py --script-names SCRIPT)
    Case("hostfile_fewer_hosts_than_nodes", "multinode", ["{tmp}/hostfile", "3"],
         ("bert_distributed.sh: error: NUM_NODES 3 but hostfile ", "lists 2 hosts"),
         files={"hostfile": "worker-1 slots=2\nworker-2 slots=2\n"}),
    # ---- checkpoints
    pretrain("--load", "{tmp}/no_checkpoint", id="checkpoint_missing",
             phrases=("no checkpoint in", "no_checkpoint", "point --load at a directory written by --save")),
    # a resume takes the checkpoint's model where the flags leave it out; a flag that differs is refused
    pretrain("--load", "{ckpt}", "--hidden-size", "32", "--num-attention-heads", "4", id="checkpoint_wrong_hidden_size",
             needs_checkpoint=True, phrases=("--hidden-size 32 contradicts the checkpoint",
                                             "whose model has hidden_size 64", "drop --hidden-size 32")),
    # the data it records too (a --save folder another run left, which the launch scripts resume), unless overridden
    pretrain("--load", "{ckpt}", "--seed", "7", id="resume_on_other_data_settings", needs_checkpoint=True,
             phrases=("holds a checkpoint of a run with other data settings: resuming it with --seed 7 (the "
                      "checkpoint's: 1234", "pass --override-data-settings to resume it on these")),
    pretrain("--load", "{ckpt}", "--attention", "linformer", "--linformer-k", "16",
             id="resume_from_another_attention_variant", needs_checkpoint=True,
             phrases=("lacks layers.0.attention.core.key_projection",
                      "resume with attention dense, the checkpoint's, or pass --finetune and another --save")),
    # a resume that trains on (the checkpoint's run ended at --train-iters 1: its rerun reads no file)
    pretrain("--load", "{tmp}/ckpt", "--train-iters", "2", id="checkpoint_corrupt_file", needs_checkpoint=True,
             setup=corrupt_checkpoint,
             phrases=("mp_rank_00_model_states.pt cannot be read", "resume from an earlier complete checkpoint")),
    pretrain("--load", "{tmp}/ckpt", id="checkpoint_truncated_run_state", needs_checkpoint=True,
             setup=truncated_run_state, phrases=("run_state.json is not valid JSON", "truncated",
                                                 "resume from an earlier complete checkpoint")),
    # ---- an unwritable --save is found before the first step, not at the first save
    pretrain("--save", "{tmp}/afile", id="save_is_a_file", files={"afile": "x"},
             phrases=("--save", "afile is a file, not a directory", "pass a --save directory")),
    pretrain("--save", "{tmp}/link", id="save_is_a_link_to_a_missing_folder",
             setup=lambda tmp, assets: (tmp / "link").symlink_to(tmp / "scratch" / "ck"),
             phrases=("--save: ", "link is a link to", "scratch/ck, which does not exist", "create it (mkdir -p ")),
    pretrain("--save", "{tmp}/ck", "--tensorboard-dir", "{tmp}/tb", id="tensorboard_dir_is_a_link_to_a_missing_folder",
             setup=lambda tmp, assets: (tmp / "tb").symlink_to("/nonexistent-mount/tb"),
             phrases=("--tensorboard-dir: ", "tb is a link to /nonexistent-mount/tb, which does not exist",
                      "mkdir -p /nonexistent-mount/tb")),
    pretrain("--save", "{tmp}/afile/checkpoints", id="save_under_a_file", files={"afile": "x"},
             phrases=("lies under", "afile, which is a file", "pass a --save directory")),
    # ---- silent accepts that changed the meaning
    pretrain("--data-path", "{tmp}/copy", setup=idx_from_another_dataset, id="data_idx_from_another_dataset",
             phrases=("copy.idx describes", "come from different datasets", "rerun tools/preprocess_data.py")),
    # data without the record of its vocab (copy_data leaves it behind, as data made before it existed): found mid-run
    pretrain("--vocab-file", "{tmp}/vocab.txt", "--data-path", "{tmp}/copy", "--data-cache-path", "{tmp}/log/maps",
             id="data_token_ids_beyond_the_vocab",
             setup=lambda tmp, assets: (vocab_of(1000)(tmp, assets), copy_data(tmp, assets)),
             phrases=("the data holds token id", "beyond the 1000 tokens", "(or --tokenizer-file) the data was preprocessed with"),
             mid_run=True),
    pretrain("--seq-length", "3", id="flag_seq_length_too_short", phrases=("--seq-length 3 leaves no room",
                                                                            "--seq-length 5 or more")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_unknown_top_level_key",
             files={"ds.json": ds_json(trian_batch_size=2)},
             phrases=("unknown top-level key 'trian_batch_size'", "did you mean 'train_batch_size'")),
    Case("json_sections_wrapped_in_an_unknown_key", "ds_config", ["validate", "{tmp}/ds.json", "--world-size", "1"],
         ("unknown top-level key 'monitor_config': DeepSpeed would ignore it, and the 'tensorboard' in it",
          "move 'tensorboard' to the top level of the JSON and remove 'monitor_config'"),
         files={"ds.json": ds_json(monitor_config={"tensorboard": {"enabled": True, "output_path": "tb"}})}),
    Case("json_duplicate_key", "ds_config", ["validate", "{tmp}/ds.json", "--world-size", "1"],
         ("key 'stage' appears twice", "keep one 'stage'"),
         files={"ds.json": '{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1, "stage": 2}}'}),
    Case("json_enabled_not_boolean", "ds_config", ["validate", "{tmp}/ds.json", "--world-size", "1"],
         ('fp16.enabled = "false" is not a boolean', "true or false, without quotes"),
         files={"ds.json": ds_json(fp16={"enabled": "false"})}),
    Case("json_unknown_optimizer", "ds_config", ["validate", "{tmp}/ds.json", "--world-size", "1"],
         ('optimizer.type "Adamz" is not an optimizer DeepSpeed knows', "adamw"),
         files={"ds.json": ds_json(optimizer={"type": "Adamz", "params": {}})}),
    # Megatron-DeepSpeed's and DeepSpeed's class names are no optimizer.type: the type it builds them from is named
    Case("json_optimizer_class_name", "ds_config", ["validate", "{tmp}/ds.json", "--world-size", "1"],
         ('optimizer.type "FusedAdam" names a class', 'use "adam": DeepSpeed picks the class from it (FusedAdam on CUDA'),
         files={"ds.json": ds_json(optimizer={"type": "FusedAdam", "params": {}})}),
    Case("json_optimizer_cpu_class_name", "ds_config", ["validate", "{tmp}/ds.json", "--world-size", "1"],
         ('optimizer.type "DeepSpeedCPUAdagrad" names a class', 'use "adagrad"', "DeepSpeedCPUAdagrad under ZeRO"),
         files={"ds.json": ds_json(optimizer={"type": "DeepSpeedCPUAdagrad", "params": {}})}),
    Case("tool_ds_config_output_folder_missing", "ds_config", ["set", "{tmp}/ds.json", "sequence_parallel.size=1",
                                                                 "--output", "{tmp}/typo/ds.json"],
         ("typo/ds.json: its folder", "typo does not exist", "create the folder first (mkdir -p"),
         files={"ds.json": ds_json()}),
    Case("tool_ds_config_output_under_a_file", "ds_config", ["set", "{tmp}/ds.json", "sequence_parallel.size=1",
                                                               "--output", "{tmp}/afile/ds.json"],
         ("its folder", "afile is a file, not a directory", "pass a path inside a directory"),
         files={"ds.json": ds_json(), "afile": "x"}),
    # ---- errors print once, every rank exits non-zero (before and after the process group exists)
    Case("flag_log_interval_zero_two_ranks", "launch2", [*PRETRAIN, "--log-interval", "0"],
         ("--log-interval 0 must be >= 1", "pass --log-interval 1 or more")),
    # ---- tools
    Case("tool_build_vocab_output_is_a_directory", "build_vocab", ["--input", "{corpus}", "--output", "{tmp}/out"],
         ("--output", "out is a directory", "pass a file path"), files={"out/.keep": ""}),
    # an existing --output was replaced: the vocab its data needs, a dataset's .bin, the corpus itself
    Case("tool_build_vocab_output_exists", "build_vocab", ["--input", "{corpus}", "--output", "{tmp}/vocab.txt"],
         ("--output", "vocab.txt exists", "--overwrite"), files={"vocab.txt": "[PAD]\n"}),
    Case("tool_build_vocab_output_is_a_dataset_file", "build_vocab", ["--input", "{corpus}", "--output", "{tmp}/c.bin",
                                                                      "--overwrite"],
         ("--output", "c.bin is named as a dataset's .bin file", "pass a .txt path")),
    Case("tool_build_vocab_output_is_its_input", "build_vocab", ["--input", "{tmp}/c.json", "--output", "{tmp}/c.json",
                                                                 "--overwrite"],
         ("--output", "c.json is one of the --input files", "pass another --output"),
         files={"c.json": '{"text": "One two three."}\n'}),
    Case("tool_build_vocab_binary_corpus", "build_vocab", ["--input", "{tmp}/corpus.bin", "--output", "{tmp}/v.txt"],
         ("corpus.bin line 1: invalid JSON (UnicodeDecodeError", "fix or remove the record"),
         setup=lambda tmp, assets: (tmp / "corpus.bin").write_bytes(b'{"text": "caf\xe9"}\n\x00\xff\xfe')),
    Case("tool_preprocess_output_under_a_file", "preprocess", ["--input", "{corpus}", "--vocab-file", "{vocab}",
                                                                 "--output-prefix", "{tmp}/afile/corpus"],
         ("its folder", "afile is a file, not a directory", "inside a directory"), files={"afile": "x"}),
    # ---- launch scripts
    Case("script_run_dir_is_a_file", "multinode", ["{tmp}/hostfile", "1"], ("RUN_DIR", "is a file, not a directory"),
         files={"hostfile": "worker-1 slots=2\n", "run": "x"}),
    Case("hostfile_is_a_directory", "multinode", ["{tmp}/hosts", "1"], ("hostfile", "hosts is a directory"),
         files={"hosts/.keep": ""}),
    Case("script_node_rank_beyond_nodes", "multinode", ["{tmp}/hostfile", "2"],
         ("NODE_RANK 2 is beyond the 2 nodes", "0 to 1"), files={"hostfile": "worker-1 slots=2\nworker-2 slots=2\n"},
         env={"NODE_RANK": "2", "MASTER_ADDR": "127.0.0.1"}),
    Case("script_leading_zero_world_size", "multinode", ["{tmp}/hostfile", "1"],
         ("GLOBAL_BATCH 4 is not a multiple of MICRO_BATCH 2 x data-parallel size 4",),
         files={"hostfile": "worker-1 slots=8\n"}, env={"TAIL": "bert_distributed.sh 08 1 2 64 2 4 2 64 4"}),
    Case("hostfile_argument_empty", "multinode", ["", "2"], ("HOSTFILE is empty", "pass the hostfile's path")),
    Case("script_python_not_executable", "multinode", ["{tmp}/hostfile", "1"], ("PYTHON", "py is not an executable", "set PYTHON"),
         files={"hostfile": "worker-1 slots=2\n", "py": "x"}, env={"PYTHON": "{tmp}/py"}),
    Case("script_copy_elsewhere", "multinode", ["{tmp}/hostfile", "1"],
         ("bert_distributed.sh is not the bert_distributed.sh beside bert_multinode.sh", "pass bert_distributed.sh"),
         files={"hostfile": "worker-1 slots=2\n", "bert_distributed.sh": "echo an edited copy\n"},
         env={"TAIL": "{tmp}/bert_distributed.sh 2 1 2 64 2 4 2 64 4"}),
    Case("script_hostfile_given_directly", "distributed", ["2", "1", "2", "64", "2", "4", "2", "64", "4"], ("hostfile", "line 1", "slots=<gpus>"),
         files={"hostfile": "worker-1 slots=two\n"}, env={"HOSTFILE": "{tmp}/hostfile", "DRY_RUN": "1"}),
    Case("tool_make_corpus_unknown_package_in_new_folders", "make_corpus", ["--output", "{tmp}/new/deeper/c.json",
                                                                           "--packages", "nosuchpkg_xyz"],
         ("package nosuchpkg_xyz is not installed", "leave it out of --packages")),
    Case("tool_make_corpus_output_is_a_directory", "make_corpus", ["--output", "{tmp}/out"],
         ("--output", "out is a directory", "pass a file path"), files={"out/.keep": ""}),
    Case("tool_plot_run_log_dir_without_metrics", "plot", ["{tmp}/log"], ("log/metrics.jsonl does not exist",),
         files={"log/.keep": ""}),
    Case("checkpoint_convert_to_torch_output_exists", "convert", ["to-torch", "--load", "{tmp}/ckpt", "--output",
                                                                  "{tmp}/bert.pt"],
         ("--output", "bert.pt exists", "choose another --output"), files={"bert.pt": "x"}),
    Case("checkpoint_convert_load_is_a_file", "convert", ["to-hf", "--load", "{tmp}/afile", "--vocab-file", "{vocab}",
                                                          "--output", "{tmp}/hf"],
         ("afile is a file, not a checkpoint directory", "--load"), files={"afile": "x"}),
    Case("checkpoint_convert_hf_dir_is_a_file", "convert", ["from-hf", "--hf-dir", "{tmp}/afile", "--save",
                                                            "{tmp}/ckpt"],
         ("afile is a file, not a Hugging Face model folder", "config.json"), files={"afile": "x"}),
    Case("checkpoint_convert_missing", "convert", ["to-hf", "--load", "{tmp}/none", "--vocab-file", "{vocab}",
                                                   "--output", "{tmp}/hf"],
         ("no checkpoint in", "none", "point --load at a directory written by --save")),
    # one iter_* folder of a --save directory given to a read-only tool: its --tag, never an edit of `latest`
    # (which would roll the next resume of that run back); a --tag with a path would read another run's
    Case("checkpoint_to_hf_load_is_one_iter_folder", "convert", ["to-hf", "--load", "{tmp}/run/iter_0000002",
                                                                 "--output", "{tmp}/hf"],
         ("run/iter_0000002 is one checkpoint of the --save directory", "/run --tag iter_0000002"),
         files={"run/latest": "iter_0000002", "run/iter_0000002/run_state.json": "{}"}),
    Case("checkpoint_to_torch_load_is_one_iter_folder", "convert", ["to-torch", "--load", "{tmp}/run/iter_0000002",
                                                                    "--output", "{tmp}/bert.pt"],
         ("run/iter_0000002 is one checkpoint of the --save directory", "/run --tag iter_0000002"),
         files={"run/latest": "iter_0000002", "run/iter_0000002/run_state.json": "{}"}),
    # an export inside the checkpoint folder it reads: the next resume or --keep-last removes the iter_* folder with it
    *[Case(f"checkpoint_{command.replace('-', '_')}_output_inside_load", "convert",
           [command, "--load", "{tmp}/run", "--output", f"{{tmp}}/run/iter_0000002/{output}"],
           (f"/run/iter_0000002/{output} is inside the checkpoint folder --load ", "/run (resumes and --keep-last",
            "pick an --output outside "),
           files={"run/latest": "iter_0000002", "run/iter_0000002/run_state.json": "{}"})
      for command, output in (("to-hf", "hf"), ("to-torch", "bert.pt"))],
    Case("fill_mask_load_is_one_iter_folder", "fill_mask", ["--load", "{tmp}/run/iter_0000002", "--text", "a [MASK]"],
         ("run/iter_0000002 is one checkpoint of the --save directory", "; pass --load ", "/run --tag iter_0000002"),
         files={"run/latest": "iter_0000002", "run/iter_0000002/run_state.json": "{}"}),
    Case("checkpoint_to_hf_tag_with_a_path", "convert", ["to-hf", "--load", "{tmp}/run", "--tag",
                                                         "../other/iter_0000002", "--output", "{tmp}/hf"],
         ("--tag ../other/iter_0000002 is not the name of a checkpoint folder of", "pass the name of one of its "
          "iter_* folders"), files={"run/latest": "iter_0000002", "other/iter_0000002/run_state.json": "{}"}),
    Case("fill_mask_tag_dot_dot", "fill_mask", ["--load", "{tmp}/run", "--tag", "..", "--text", "a [MASK]"],
         ("--tag .. is not the name of a checkpoint folder of",), files={"run/latest": "iter_0000002"}),
    # an unfinished save (a killed one's .partial folder, its files half-written) is never read, nor exported
    *[Case(f"{name}_tag_of_an_unfinished_save", command, [*argv, "--load", "{tmp}/run", "--tag", "iter_0000004.partial",
                                                          *tail],
           ("--tag iter_0000004.partial is a save that did not finish (interrupted), never a checkpoint",
            "pass --tag of a complete iter_* folder of", "(the newest: iter_0000002)"),
           files={"run/latest": "iter_0000002", "run/iter_0000002/mp_rank_00_model_states.pt": "x",
                  "run/iter_0000004.partial/mp_rank_00_model_states.pt": "x"})
      for name, command, argv, tail in (("fill_mask", "fill_mask", [], ["--text", "a [MASK]"]),
                                        ("checkpoint_to_hf", "convert", ["to-hf"], ["--output", "{tmp}/hf"]))],
    # a run's --log-dir (its config.json is the resolved config) where a tool reads a checkpoint or a Hugging Face
    # folder: named as what it is, with the run's --save folder, not as a Hugging Face folder to fix or convert
    *[Case(f"{name}_of_a_log_dir", command, [*argv, "{tmp}/log", *tail],
           ("/log is the --log-dir of a run of this trainer (metrics.jsonl, config.json), not its checkpoint",
            "pass the run's --save folder (/runs/ck) with --load"),
           files={"log/config.json": json.dumps({"ds_config": {}, "model": {}, "micro_batch_size": 2}),
                  "log/metrics.jsonl": json.dumps({"kind": "start", "save": "/runs/ck"}) + "\n"})
      for name, command, argv, tail in (
          ("fill_mask_load", "fill_mask", ["--load"], ["--text", "a [MASK]"]),
          ("from_hf_hf_dir", "convert", ["from-hf", "--hf-dir"], ["--save", "{tmp}/ck"]),
          ("to_hf_load", "convert", ["to-hf", "--load"], ["--output", "{tmp}/hf"]),
          ("to_torch_load", "convert", ["to-torch", "--load"], ["--output", "{tmp}/bert.pt"]))],
    # a `latest` that is not text (a disk error, a binary file copied over it): the UnicodeDecodeError's traceback
    Case("fill_mask_latest_not_text", "fill_mask", ["--load", "{tmp}/run", "--text", "a [MASK]"],
         ("run/latest is not a checkpoint tag (it is not text)", "(the newest: iter_0000002)"),
         files={"run/iter_0000002/mp_rank_00_model_states.pt": "x"},
         setup=lambda tmp, assets: (tmp / "run" / "latest").write_bytes(b"\x00\xffgarbage")),
    # a --save folder whose first save was killed: not 'point --load at a directory written by --save'
    pretrain("--load", "{tmp}/run", id="load_of_only_an_unfinished_save",
             files={"run/iter_0000002.partial/mp_rank_00_model_states.pt": "x"},
             phrases=("no checkpoint in", "iter_0000002.partial is a save that did not finish (interrupted)",
                      "start without --load")),
    # ---- silent accepts: non-finite JSON, options the run would not read (more in CONFIG_MISTAKES, in-process)
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_nan_gradient_clipping",
             files={"ds.json": '{"train_micro_batch_size_per_gpu": 2, "gradient_clipping": NaN}'},
             phrases=("ds.json: gradient_clipping = NaN is not a finite number", "write a finite number")),
    pretrain("--deepspeed_config", "{tmp}/ds.json", id="json_optimizer_type_whose_params_differ",
             files={"ds.json": ds_json(optimizer={"type": "SGD", "params": {"lr": 0.1, "betas": [0.9, 0.99]}})},
             phrases=("optimizer.params.betas is not a parameter of optimizer.type SGD", "remove betas")),
    Case("tool_ds_config_set_infinity", "ds_config", ["set", "{tmp}/ds.json", "gradient_clipping=Infinity"],
         ("gradient_clipping = Infinity is not a finite number", "write a finite number for gradient_clipping"),
         files={"ds.json": ds_json()}),
    Case("hf_missing_encoder_tensor", "convert", ["from-hf", "--hf-dir", "{tmp}/hf", "--save", "{tmp}/ckpt"],
         ("lacks 1 tensor(s) of the model", MISSING_KEY, "copy or download the model folder again"),
         setup=lambda tmp, assets: hf_folder(tmp, assets, without=(MISSING_KEY,))),
    # a config.json edited to fewer layers than its weights hold: the rest were dropped with a warning
    Case("hf_config_fewer_layers_than_weights", "convert", ["from-hf", "--hf-dir", "{tmp}/hf", "--save", "{tmp}/ckpt"],
         ("config.json's num_hidden_layers 1 leaves out layers of its weights, which hold 2",
          "set num_hidden_layers to 2 in config.json"),
         setup=lambda tmp, assets: hf_folder(tmp, assets, config_changes={"num_hidden_layers": 1})),
    # ---- without the launcher: one process, and its errors one line (not `No module named 'mpi4py'`)
    Case("launch_none_option_of_another_variant", "pretrain", [*PRETRAIN, "--attention", "ring", "--linformer-k", "16"],
         ("--linformer-k is set but attention is 'ring'", "set attention 'linformer' or drop --linformer-k"),
         env=NO_LAUNCHER),
    Case("flag_unknown_two_ranks", "launch2", [*PRETRAIN, "--linformer-kk", "16"],
         ("pretrain_bert.py: error: unrecognized arguments: --linformer-kk 16",)),
]

def shuffled_vocab(tmp: Path, assets: dict) -> list:
    """{tmp}/vocab.txt: the valid vocab with its learned tokens in another order (same size, same specials)."""
    import random

    tokens = Path(assets["vocab"]).read_text().splitlines()
    learned = [token for token in tokens if not token.startswith("[")]
    random.Random(0).shuffle(learned)
    shuffled = [token if token.startswith("[") else learned.pop() for token in tokens]
    (tmp / "vocab.txt").write_text("\n".join(shuffled) + "\n")
    return shuffled


def tokenizer_json_of(tokens_of):
    """A setup writing {tmp}/tokenizer.json: a WordPiece tokenizer.json over `tokens_of(tmp, assets)`."""
    def setup(tmp, assets):
        from megatron.hf_modernbert import wordpiece_tokenizer_json

        (tmp / "tokenizer.json").write_text(json.dumps(wordpiece_tokenizer_json(tokens_of(tmp, assets), True)))
    return setup


def unigram_without_metaspace(tmp, assets):
    """{tmp}/tokenizer.json: a Unigram over the vocab's tokens, split at whitespace: no mark of a word's start."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokens = Path(assets["vocab"]).read_text().split()
    tokenizer = Tokenizer(models.Unigram([(token, 0.0) for token in tokens], unk_id=tokens.index("[UNK]")))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp / "tokenizer.json"))


CASES += [  # ---- derived files: data, index maps and vocab/tokenizer identity
    pretrain("--vocab-file", "{tmp}/vocab.txt", setup=shuffled_vocab, id="vocab_shuffled_vs_data",
             phrases=("the data", "sample_text_sentence was preprocessed with the vocab",
                      "whose tokens differ from the run's", "vocab.txt (sha256",
                      "rerun tools/preprocess_data.py with this one")),
    pretrain("--load", "{ckpt}", "--vocab-file", "{tmp}/vocab.txt", setup=shuffled_vocab, needs_checkpoint=True,
             id="vocab_shuffled_vs_checkpoint_at_resume",
             phrases=("the vocab", "vocab.txt differs from", "iter_0000001/vocab.txt, the one checkpoint",
                      "drop --vocab-file/--tokenizer-file (the checkpoint carries its tokenizer)")),
    Case("vocab_shuffled_fill_mask", "fill_mask", ["--load", "{ckpt}", "--vocab-file", "{tmp}/vocab.txt", "--text",
                                                   "a [MASK] b"], ("vocab.txt differs from", "the one checkpoint"),
         setup=shuffled_vocab, needs_checkpoint=True),
    Case("vocab_shuffled_to_hf", "convert", ["to-hf", "--load", "{ckpt}", "--vocab-file", "{tmp}/vocab.txt", "--output",
                                             "{tmp}/hf"], ("vocab.txt differs from", "the one checkpoint"),
         setup=shuffled_vocab, needs_checkpoint=True),
    Case("tokenizer_file_differs_from_checkpoint", "fill_mask", ["--load", "{ckpt}", "--tokenizer-file",
                                                                 "{tmp}/tokenizer.json", "--text", "a [MASK] b"],
         ("tokenizer.json differs from", "vocab.txt, the one checkpoint", "pass the one it was trained with"),
         setup=tokenizer_json_of(shuffled_vocab), needs_checkpoint=True),
    Case("tokenizer_type_differs_from_checkpoint", "convert", ["to-hf", "--load", "{ckpt}", "--tokenizer-type",
                                                               "BertWordPieceCase", "--output", "{tmp}/hf"],
         ("--tokenizer-type BertWordPieceCase differs from BertWordPieceLowerCase", "drop --tokenizer-type"),
         needs_checkpoint=True),
    Case("tokenizer_json_without_mask", "preprocess", ["--input", "{corpus}", "--tokenizer-file",
                                                       "{tmp}/tokenizer.json", "--output-prefix", "{tmp}/out/corpus"],
         ("tokenizer.json has no such token: no mask token ([MASK] or <mask>)", "tokenizer_config.json"),
         setup=tokenizer_json_of(lambda tmp, assets: [token for token in Path(assets["vocab"]).read_text().splitlines()
                                                      if token != "[MASK]"])),
    Case("tokenizer_file_not_a_tokenizer", "preprocess", ["--input", "{corpus}", "--tokenizer-file", "{vocab}",
                                                          "--output-prefix", "{tmp}/out/corpus"],
         ("vocab.txt is not a Hugging Face tokenizer.json", "a BERT vocab.txt is read with --vocab-file")),
    pretrain("--tokenizer-file", "{tmp}/tokenizer.json", setup=tokenizer_json_of(shuffled_vocab),
             id="tokenizer_file_and_vocab_file",
             phrases=("--tokenizer-type HFTokenizer reads --tokenizer-file, and --vocab-file is given",
                      "drop --vocab-file")),
    Case("tokenizer_without_word_rule_whole_word_masking", "pretrain",  # PRETRAIN without its --vocab-file
         [*(part for part in PRETRAIN if part not in ("--vocab-file", "{vocab}")), "--tokenizer-file",
          "{tmp}/tokenizer.json", "--whole-word-masking"],
         ("--whole-word-masking finds words by the tokenizer's own rule", "tokenizer.json (a Unigram "
          "model, pre-tokenizer Whitespace) has none", "drop --whole-word-masking"), setup=unigram_without_metaspace),
]
CASES += [  # ---- corpora as published (.jsonl.gz, .jsonl.zst, Parquet)
    Case("corpus_parquet_missing_column", "preprocess", ["--input", "{tmp}/corpus/wiki.parquet", "--json-keys", "body",
                                                         "--vocab-file", "{vocab}", "--output-prefix", "{tmp}/out/c"],
         ("wiki.parquet has no column 'body' (it has id, url, title, text, length)",
          "pass --json-keys with column names of the Parquet files"), setup=broken_corpus("parquet_missing_column")),
    Case("corpus_shard_not_parquet", "preprocess", ["--input", "{tmp}/corpus/shards", "--vocab-file", "{vocab}",
                                                    "--output-prefix", "{tmp}/out/c"],
         ("part-00001.parquet is uncompressed JSON text, though its name says Parquet", "name it *.jsonl, e.g. mv"),
         setup=broken_corpus("shard_not_parquet")),
    Case("corpus_parquet_null_text", "preprocess", ["--input", "{tmp}/corpus/wiki.parquet", "--vocab-file", "{vocab}",
                                                    "--output-prefix", "{tmp}/out/c", "--workers", "2"],
         ("wiki.parquet row 5: key 'text' is not a string", "--skip-invalid"), setup=broken_corpus("parquet_null_text")),
    Case("corpus_gzip_truncated", "preprocess", ["--input", "{tmp}/corpus/wiki.jsonl.gz", "--vocab-file", "{vocab}",
                                                 "--output-prefix", "{tmp}/out/c"],
         ("wiki.jsonl.gz is not a readable gzip file (Compressed file ended", "download or compress it again"),
         setup=broken_corpus("gzip_truncated")),
    Case("corpus_zstd_truncated", "preprocess", ["--input", "{tmp}/corpus/wiki.jsonl.zst", "--vocab-file", "{vocab}",
                                                 "--output-prefix", "{tmp}/out/c"],
         ("wiki.jsonl.zst is not a readable zstd file (truncated", "download or compress it again"),
         setup=broken_corpus("zstd_truncated")),
    Case("corpus_empty_glob", "preprocess", ["--input", "{tmp}/shards/*.parquet", "--vocab-file", "{vocab}",
                                             "--output-prefix", "{tmp}/out/c"],
         ("shards/*.parquet matches no files", "check the pattern")),
    Case("corpus_folder_without_shards", "preprocess", ["--input", "{tmp}/corpus/notes", "--vocab-file", "{vocab}",
                                                        "--output-prefix", "{tmp}/out/c"],
         ("notes holds no corpus shards (.json, .jsonl, .json.gz", "pass a folder, file or glob"),
         setup=broken_corpus("folder_without_shards")),
    Case("corpus_download_unfinished", "preprocess", ["--input", "{tmp}/corpus/hf", "--vocab-file", "{vocab}",
                                                      "--output-prefix", "{tmp}/out/c"],
         ("train-00001-of-00002.parquet.incomplete is a download that has not finished",
          "finish the download (run it again)"), setup=broken_corpus("download_unfinished")),
    Case("corpus_shard_missing", "preprocess", ["--input", "{tmp}/corpus/hf", "--vocab-file", "{vocab}",
                                                "--output-prefix", "{tmp}/out/c"],
         ("lacks", "train-00001-of-00003.parquet: 2 of its 3", "download the dataset again"),
         setup=broken_corpus("shard_missing")),
    Case("corpus_parquet_gzipped", "preprocess", ["--input", "{tmp}/corpus/w.parquet.gz", "--vocab-file", "{vocab}",
                                                  "--output-prefix", "{tmp}/out/c", "--skip-invalid"],
         ("w.parquet.gz is a gzip-compressed Parquet file", "decompress it (gunzip) and pass the .parquet file"),
         setup=broken_corpus("parquet_gzipped")),
    Case("corpus_hub_several_splits", "preprocess", ["--input", "{tmp}/corpus/hf", "--vocab-file", "{vocab}",
                                                    "--output-prefix", "{tmp}/out/c"],
         ("holds the splits train (2 shards), validation (1), test (1)", "pass the one to read as a quoted glob",
          "--input '", "hf/data/train-*'"), setup=broken_corpus("hub_splits")),
    Case("corpus_hub_splits_unquoted_glob", "preprocess", [  # `--input {tmp}/corpus/hf/data/*` as the shell expands it
        "--input", *(f"{{tmp}}/corpus/hf/data/{name}" for name in sorted(HUB_SPLITS)), "--vocab-file", "{vocab}",
        "--output-prefix", "{tmp}/out/c"],
         ("the 4 --input values hold the splits train (2 shards), validation (1), test (1)",
          "--input '", "hf/data/train-*'"), setup=broken_corpus("hub_splits")),
    Case("corpus_plain_text", "preprocess", ["--input", "{tmp}/corpus/wiki.txt", "--vocab-file", "{vocab}",
                                             "--output-prefix", "{tmp}/out/c", "--skip-invalid"],
         ("wiki.txt is plain text, not JSON lines", "jq -R -c '{\"text\": .}'"), setup=broken_corpus("plain_text")),
    Case("corpus_utf16", "preprocess", ["--input", "{tmp}/corpus/wiki.jsonl", "--vocab-file", "{vocab}",
                                        "--output-prefix", "{tmp}/out/c", "--skip-invalid"],
         ("wiki.jsonl is UTF-16 text, not UTF-8", "convert it, e.g. iconv -f UTF-16 -t UTF-8"),
         setup=broken_corpus("utf16_jsonl")),
    Case("corpus_utf16_build_vocab", "build_vocab", ["--input", "{tmp}/corpus/wiki.jsonl", "--output", "{tmp}/v.txt"],
         ("wiki.jsonl is UTF-16 text, not UTF-8", "convert it, e.g. iconv -f UTF-16 -t UTF-8"),
         setup=broken_corpus("utf16_jsonl")),
    Case("corpus_gzip_named_zstd", "preprocess", ["--input", "{tmp}/corpus/wiki.jsonl.zst", "--vocab-file", "{vocab}",
                                                  "--output-prefix", "{tmp}/out/c"],
         ("wiki.jsonl.zst is gzip-compressed, though its name says zstd", "name it *.jsonl.gz, e.g. mv"),
         setup=broken_corpus("gzip_named_zstd")),
    Case("corpus_input_stdin", "preprocess", ["--input", "-", "--vocab-file", "{vocab}", "--output-prefix",
                                              "{tmp}/out/c"],
         ("--input - is standard input, which is not read", "write it to a file and pass that")),
    Case("corpus_description_beside_shards", "preprocess", ["--input", "{tmp}/corpus/snap", "--vocab-file", "{vocab}",
                                                            "--output-prefix", "{tmp}/out/c"],
         ("stats.json is one JSON object without 'text'", "beside 1 Parquet shard",
          "pass the shards as a quoted glob, e.g. --input '", "snap/data/*.parquet'"),
         setup=broken_corpus("description_beside_parquet")),
    Case("corpus_json_keys_twice", "preprocess", ["--input", "{corpus}", "--json-keys", "text", "text", "--vocab-file",
                                                  "{vocab}", "--output-prefix", "{tmp}/out/c"],
         ("--json-keys text text names 'text' twice", "name each key once")),
    pretrain("--data-path", "{tmp}/copy", id="data_bin_of_a_larger_dataset",
             setup=lambda tmp, assets: Path(f"{copy_data(tmp, assets)}.bin").write_bytes(
                 Path(assets["data"] + ".bin").read_bytes() * 2),
             phrases=("copy.idx describes", "come from different datasets", "rerun tools/preprocess_data.py")),
]
CASES += [  # ---- resumes
    pretrain("--load", "{tmp}/ckpt", id="resume_latest_empty", needs_checkpoint=True,
             setup=lambda tmp, assets: (shutil.copytree(assets["ckpt"], tmp / "ckpt") / "latest").write_text("\n"),
             phrases=("the 'latest' file of", "is empty: it names no checkpoint", "write the tag of a complete iter_* "
                      "folder", "(the newest: iter_0000001)")),
    pretrain("--load", "{tmp}/ckpt", id="resume_latest_names_a_missing_tag", needs_checkpoint=True,
             setup=lambda tmp, assets: (shutil.copytree(assets["ckpt"], tmp / "ckpt") / "latest").write_text(
                 "iter_0000009"),
             phrases=("iter_0000009 named by", "does not exist", "write the tag of a complete iter_* folder")),
    pretrain("--load", "{tmp}/ckpt", id="resume_run_state_nan", needs_checkpoint=True,
             setup=lambda tmp, assets: (state := shutil.copytree(assets["ckpt"], tmp / "ckpt") / "iter_0000001" /
                                        "run_state.json").write_text(state.read_text().replace(
                                            '"consumed_samples": 2', '"consumed_samples": NaN')),
             phrases=("run_state.json: consumed_samples = NaN is not a finite number",
                      "resume from an earlier complete checkpoint")),
    pretrain("--load", "{tmp}/ckpt", id="resume_run_state_iteration_not_a_count", needs_checkpoint=True,
             setup=lambda tmp, assets: (state := shutil.copytree(assets["ckpt"], tmp / "ckpt") / "iter_0000001" /
                                        "run_state.json").write_text(state.read_text().replace(
                                            '"iteration": 1', '"iteration": "1"')),
             phrases=('run_state.json holds "1" as iteration, not a count', "resume from an earlier complete")),
    pretrain("--load", "{tmp}/ckpt", "--train-iters", "2", id="resume_rng_file_missing", needs_checkpoint=True,
             setup=lambda tmp, assets: (shutil.copytree(assets["ckpt"], tmp / "ckpt") / "iter_0000001" /
                                        "rng_rank0.pt").unlink(),
             phrases=("rng_rank0.pt is missing", "or pass --no-load-rng", "no longer bit-exact")),
    pretrain("--load", "{tmp}/ckpt", "--train-iters", "2", id="resume_rng_file_truncated", needs_checkpoint=True,
             setup=lambda tmp, assets: (rng := shutil.copytree(assets["ckpt"], tmp / "ckpt") / "iter_0000001" /
                                        "rng_rank0.pt").write_bytes(rng.read_bytes()[:200]),
             phrases=("rng_rank0.pt cannot be read", "or pass --no-load-rng")),
    pretrain("--load", "{ckpt}", "--num-attention-heads", "8", id="resume_other_head_count", needs_checkpoint=True,
             phrases=("--num-attention-heads 8 contradicts the checkpoint", "whose model has num_attention_heads 4",
                      "drop --num-attention-heads 8")),
    pretrain("--load", "{ckpt}", "--bert-no-binary-head", id="resume_without_the_binary_head", needs_checkpoint=True,
             phrases=("--bert-no-binary-head contradicts the checkpoint", "whose model has add_binary_head True",
                      "drop --bert-no-binary-head")),
    pretrain("--no-load-rng", id="resume_no_load_rng_without_load",
             phrases=("--no-load-rng is given without --load", "add --load DIR or drop --no-load-rng")),
    pretrain("--finetune", id="finetune_without_load", phrases=("--finetune is given without --load",
                                                                  "add --load DIR or drop --finetune")),
    pretrain("--finetune", "--load", "{ckpt}", "--no-load-rng", id="finetune_with_no_load_rng", needs_checkpoint=True,
             phrases=("--no-load-rng is given with --finetune", "drop --no-load-rng")),
]
CASES += [  # ---- signals and faults
    pretrain("--save", "{tmp}/ckpt", id="save_locked_by_a_live_run",  # this test process plays the live run
             setup=lambda tmp, assets: (tmp / "ckpt").mkdir() or (tmp / "ckpt" / ".lock").write_text(json.dumps(
                 {"host": os.uname().nodename, "pid": os.getpid(), "start": None})),
             phrases=("ckpt is in use by a live run", f"pid {os.getpid()} on this host", "choose another --save")),
    pretrain("--save", "{tmp}/ckpt", id="save_locked_on_another_host",
             setup=lambda tmp, assets: (tmp / "ckpt").mkdir() or (tmp / "ckpt" / ".lock").write_text(json.dumps(
                 {"host": "node-7", "pid": 4242, "start": "1"})),
             phrases=("locked by pid 4242 on host node-7, whose lock was touched", "ckpt/.lock once that run has ended")),
    pretrain(id="log_dir_locked_by_a_live_run",  # two runs on one --log-dir would interleave metrics.jsonl
             setup=lambda tmp, assets: (tmp / "log").mkdir() or (tmp / "log" / ".log.lock").write_text(json.dumps(
                 {"host": os.uname().nodename, "pid": os.getpid(), "start": None})),
             phrases=("--log-dir", "log is in use by a live run", f"pid {os.getpid()} on this host",
                      "choose another --log-dir")),
    Case("rendezvous_missing_rank", "pretrain", [*PRETRAIN, "--rendezvous-timeout", "2"],
         ("the rendezvous at 127.0.0.1:", "timed out after 2 s: 1 of 2 ranks arrived (rank 1 missing)",
          "may have stopped at start-up on their node", "look at that node's output first", "raise --rendezvous-timeout"),
         env={"WORLD_SIZE": "2"}),
    Case("rendezvous_rank_0_missing", "pretrain", [*PRETRAIN, "--rendezvous-timeout", "2"],
         ("rank 1 could not reach the rendezvous at 127.0.0.1:", "within 2 s", "rank 0 may have stopped at start-up "
          "on its node", "look at that node's output first", "raise --rendezvous-timeout"),
         env={"WORLD_SIZE": "2", "RANK": "1"}),
    pretrain("--rendezvous-timeout", "0", id="flag_rendezvous_timeout_zero",
             phrases=("--rendezvous-timeout 0.0 must be >= 1", "pass --rendezvous-timeout 1 or more")),
    pretrain("--distributed-timeout-minutes", "0", id="flag_distributed_timeout_zero",
             phrases=("--distributed-timeout-minutes 0.0 must be > 0", "pass a positive --distributed-timeout-minutes, "
                      "e.g. 10")),
]
# ---- a DS_ACCELERATOR naming a device this machine lacks (a cluster profile's, a GPU job script's): one line
# before any work, not DeepSpeed's traceback at its import (xpu) or when a rank binds its device (cuda)
NO_ACCELERATOR = "names a device this machine lacks"
CASES += [
    Case("accelerator_xpu_missing", "pretrain", PRETRAIN, ("DS_ACCELERATOR=xpu", NO_ACCELERATOR,
                                                           "unset DS_ACCELERATOR", "or set it to cpu"),
         env={"DS_ACCELERATOR": "xpu"}),
    Case("accelerator_cuda_missing", "pretrain", PRETRAIN, ("DS_ACCELERATOR=cuda", NO_ACCELERATOR),
         env={"DS_ACCELERATOR": "cuda"}),
    Case("accelerator_unknown", "pretrain", PRETRAIN, ("DS_ACCELERATOR=gpu is not an accelerator DeepSpeed knows",
                                                       "cpu, cuda, xpu"), env={"DS_ACCELERATOR": "gpu"}),
    Case("accelerator_cuda_missing_script", "distributed", ["2", "1", "2", "64", "2", "4", "2", "64", "4"],
         ("bert_distributed.sh: error: DS_ACCELERATOR=cuda", NO_ACCELERATOR), env={"DS_ACCELERATOR": "cuda"}),
    Case("accelerator_xpu_missing_fill_mask", "fill_mask", ["--load", "{tmp}/ck", "--text", "a [MASK]"],
         ("fill_mask.py: error: DS_ACCELERATOR=xpu", NO_ACCELERATOR), env={"DS_ACCELERATOR": "xpu"}),
    Case("accelerator_xpu_missing_convert", "convert", ["to-hf", "--load", "{tmp}/ck", "--output", "{tmp}/hf"],
         ("convert_checkpoint.py: error: DS_ACCELERATOR=xpu", NO_ACCELERATOR), env={"DS_ACCELERATOR": "xpu"}),
    # libgomp's `Invalid value for environment variable OMP_NUM_THREADS`, and the run went on
    Case("env_omp_num_threads_not_a_number", "pretrain", PRETRAIN, ("OMP_NUM_THREADS='abc' is not a number of threads",
                                                                   "unset OMP_NUM_THREADS"), env={"OMP_NUM_THREADS": "abc"}),
    Case("env_omp_num_threads_zero", "fill_mask", ["--text", "a [MASK]"], ("OMP_NUM_THREADS='0' is not a number",),
         env={"OMP_NUM_THREADS": "0"}),
    Case("accelerator_cuda_missing_extend", "extend", ["--from", "{tmp}", "--seq-length", "256", "--save",
                                                       "{tmp}/ck", "--dry-run"],
         ("extend_context.py: error: DS_ACCELERATOR=cuda", NO_ACCELERATOR), env={"DS_ACCELERATOR": "cuda"}),
]
# ---- tools/extend_context.py refuses in its own flag names before the launcher starts (more in-process
# in test_extend_context.py)
CASES += [
    Case("extend_num_gpus_zero", "extend", ["--from", "{tmp}", "--seq-length", "256", "--save", "{tmp}/ck",
                                            "--num-gpus", "0", "--dry-run"],
         ("--num-gpus 0 must be >= 1", "pass --num-gpus 1 or more")),
    Case("extend_from_is_a_file", "extend", ["--from", "{tmp}/model.safetensors", "--seq-length", "256", "--save",
                                             "{tmp}/ck", "--dry-run"],
         ("model.safetensors is a file", "pass the folder holding it"), files={"model.safetensors": "x"}),
    Case("extend_from_one_checkpoint_of_save", "extend", ["--from", "{tmp}/run/iter_0000002", "--seq-length", "256",
                                                          "--save", "{tmp}/ck", "--dry-run"],
         ("run/iter_0000002 is one checkpoint of the --save directory", "; point --from at",
          "into a folder of its own beside a 'latest' file holding iter_0000002"),
         files={"run/latest": "iter_0000002", "run/iter_0000002/run_state.json": "{}"}),
    Case("extend_ring_with_a_hybrid_json", "extend", ["--from", "{tmp}", "--seq-length", "256", "--save", "{tmp}/ck",
                                                      "--attention", "ring", "--deepspeed-config",
                                                      str(ROOT / "ds_configs" / "hybrid_sp4.json"), "--dry-run"],
         ("--attention ring contradicts the sequence_parallel.ulysses_size 2", "pass --attention hybrid "
          "--ulysses-size 2 to extend_context.py")),
    # ---- paths
    pretrain("--data-cache-path", "{tmp}/afile", files={"afile": "x"}, id="data_cache_path_is_a_file",
             phrases=("--data-cache-path", "afile is a file, not a directory", "pass a --data-cache-path directory")),
    pretrain("--data-cache-path", "{tmp}/afile/maps", files={"afile": "x"}, id="data_cache_path_below_a_file",
             phrases=("--data-cache-path", "maps lies under", "afile, which is a file", "pass a --data-cache-path")),
]
# ---- flags after -- that tools/extend_context.py sets itself (more in test_extend_context.py)
CASES += [
    Case("extend_trainer_flag_it_sets", "extend", ["--from", "{tmp}", "--seq-length", "256", "--save", "{tmp}/ck", "--",
                                                   "--seq-len", "128"],
         ("--seq-len (for --seq-length) after -- would override what extend_context.py sets",
          "pass --seq-length to extend_context.py (before --)")),
]
# ---- a damaged Hugging Face weights file (every kind in-process in test_hf_convert.py)


def truncated_pytorch_bin(tmp: Path, assets: dict) -> None:
    """{tmp}/hf with its weights as a pytorch_model.bin cut in half (an interrupted download)."""
    import torch

    from megatron import hf_io

    folder = hf_folder(tmp, assets)
    torch.save(hf_io.read_safetensors(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    data = (folder / "pytorch_model.bin").read_bytes()
    (folder / "pytorch_model.bin").write_bytes(data[:len(data) // 2])


CASES += [
    Case("hf_weights_truncated_bin", "convert", ["from-hf", "--hf-dir", "{tmp}/hf", "--save", "{tmp}/ck"],
         ("hf/pytorch_model.bin cannot be read: truncated or not a PyTorch file", "copy or download the model folder "
          "again"), setup=truncated_pytorch_bin),
]
# ---- log folders, checked on rank 0 at start-up while every rank waits for its answer
CASES += [
    Case("log_dir_is_a_file_two_ranks", "launch2", [*PRETRAIN, "--log-dir", "{tmp}/afile"],
         ("--log-dir", "afile is a file, not a directory", "pass a --log-dir directory"), files={"afile": "x"}),
]
SCRIPT_ARGS = ["2", "1", "2", "64", "2", "4", "2", "64", "4"]  # PROCS PP SP SEQ_LEN MICRO GLOBAL LAYERS HIDDEN HEADS
CASES += [
    # ---- launchfix: launch scripts refuse before anything is written (flags the positionals fix, RUN_DIR,
    # the hostfile as DeepSpeed reads it, ssh that DeepSpeed's launcher needs: a real launch stopping at the check)
    Case("script_flag_fixed_by_a_positional", "distributed", [*SCRIPT_ARGS, "--micro-batch-size=1"],
         ("--micro-batch-size after the positional arguments would override MICRO_BATCH = 2",
          "change the MICRO_BATCH argument"), env={"DRY_RUN": "1"}),
    # the JSON's checks name the script's arguments (its fix named --num-layers, which it refuses after them)
    Case("script_batch_named_by_its_arguments", "distributed", [*SCRIPT_ARGS[:4], "4", "6", *SCRIPT_ARGS[6:]],
         ("bert_distributed.sh: error: GLOBAL_BATCH 6 is not a multiple of MICRO_BATCH 4 x data-parallel size 1",
          "make GLOBAL_BATCH a multiple "
          "of 4, or MICRO_BATCH a divisor of 6"), env={"DRY_RUN": "1"}),
    # a dry run too: it passed a RUN_DIR the launch then refused
    *[Case(f"script_run_dir_not_writable{dry_run}", "distributed", SCRIPT_ARGS,
           ("RUN_DIR /proc/launchfix/run cannot be created or written", "set RUN_DIR to a directory this user can "
            "write"), env={"RUN_DIR": "/proc/launchfix/run", **({"DRY_RUN": "1"} if dry_run else {})})
      for dry_run in ("", "_dry_run")],
    Case("hostfile_byte_order_mark", "multinode", ["{tmp}/hostfile", "1"], ("starts with a byte-order mark",
                                                                            "save it as plain UTF-8"),
         setup=lambda tmp, assets: (tmp / "hostfile").write_bytes("\ufeffworker-1 slots=2\n".encode())),
    Case("script_hostfile_host_without_ssh", "distributed", SCRIPT_ARGS,
         ("cannot reach nosuchhost.invalid, the hostfile's first host, by passwordless ssh", "set up ssh keys",
          "NODE_RANK and MASTER_ADDR"), files={"hostfile": "nosuchhost.invalid slots=2\n"},
         env={"HOSTFILE": "{tmp}/hostfile"}),
    # a launch the trainer refuses at start-up: the RUN_DIR the script made for it (its JSON only) is removed
    Case("script_trainer_refusal_leaves_no_run_dir", "distributed", [*SCRIPT_ARGS, "--train-iters", "0"],
         ("--train-iters 0 is zero: no step to train",)),
]
CASES += [
    # ---- tokfix: data whose record names another text pipeline than the run's tokenizer (same tokens)
    pretrain("--tokenizer-type", "BertWordPieceCase", id="data_lowercased_run_cased",
             phrases=("sample_text_sentence was preprocessed with the BertWordPieceLowerCase",
                      "whose text pipeline differs from the run's BertWordPieceCase",
                      "normalizer.lowercase: true vs false",
                      "pass --tokenizer-type BertWordPieceLowerCase --vocab-file")),
]



def unigram_without_unk(tmp: Path, assets: dict):
    """{tmp}/tokenizer.json: a Unigram trained on English without an unknown token (unk_id null)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.train_from_iterator(["the cat sat on the mat", "a dog ran"] * 10, trainers.UnigramTrainer(
        vocab_size=40, special_tokens=["[PAD]", "[CLS]", "[SEP]", "[MASK]"]))
    tokenizer.save(str(tmp / "tokenizer.json"))


CASES += [  # ---- preprocess_data.py: tokenizers that cannot encode the text, flags it would not read
    Case("preprocess_tokenizer_without_unk_on_foreign_text", "preprocess", [
        "--input", "{tmp}/cjk.json", "--tokenizer-file", "{tmp}/tokenizer.json", "--output-prefix", "{tmp}/out/c",
        "--workers", "2"], ("cjk.json line 2: the tokenizer", "has no token for '你' (U+4F60) and fails on it",
                            "retrain it with an unknown token"),
         files={"cjk.json": '{"text": "the cat"}\n{"text": "the 你好 cat"}\n', "out/.keep": ""},
         setup=unigram_without_unk),
    Case("preprocess_workers_far_beyond_the_cpus", "preprocess", ["--input", "{corpus}", "--vocab-file", "{vocab}",
                                                                  "--output-prefix", "{tmp}/c", "--workers", "100000"],
         ("--workers 100000 is more than 4 x the", "pass --workers")),
    Case("preprocess_keep_newlines_without_split_sentences", "preprocess", [
        "--input", "{corpus}", "--vocab-file", "{vocab}", "--output-prefix", "{tmp}/c", "--keep-newlines"],
         ("--keep-newlines is read only with --split-sentences", "add --split-sentences, or drop --keep-newlines")),
    Case("preprocess_output_prefix_ending_in_bin", "preprocess", ["--input", "{corpus}", "--vocab-file", "{vocab}",
                                                                  "--output-prefix", "{tmp}/c.bin"],
         ("c.bin would write", "c.bin_text_document.bin/.idx", "pass --output-prefix", "c (it writes")),
]


COMMANDS = {
    "pretrain": [PYTHON, str(ROOT / "pretrain_bert.py")],
    "launch2": [str(Path(PYTHON).parent / "deepspeed"), "--num_gpus", "2", "--master_port", "{port}",
                str(ROOT / "pretrain_bert.py")],
    "ds_config": [PYTHON, str(ROOT / "tools" / "ds_config.py")],
    "preprocess": [PYTHON, str(ROOT / "tools" / "preprocess_data.py")],
    "build_vocab": [PYTHON, str(ROOT / "tools" / "build_vocab.py")],
    "convert": [PYTHON, str(ROOT / "tools" / "convert_checkpoint.py")],
    "make_corpus": [PYTHON, str(ROOT / "tools" / "make_sample_corpus.py")],
    "plot": [PYTHON, str(ROOT / "tools" / "plot_run.py")],
    "fill_mask": [PYTHON, str(ROOT / "tools" / "fill_mask.py")],
    "extend": [PYTHON, str(ROOT / "tools" / "extend_context.py")],
    "multinode": [str(ROOT / "examples_deepspeed" / "bert_multinode.sh"), "--dry-run"],
    "distributed": [str(ROOT / "examples_deepspeed" / "bert_distributed.sh")],
}
MULTINODE_TAIL = ["bert_distributed.sh", "2", "1", "2", "64", "2", "4", "2", "64", "4"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict:
    """A valid small dataset and vocab (~2 s to build); the checkpoint is made on first use."""
    directory = tmp_path_factory.mktemp("assets")
    dataset = prepare_default_dataset(directory, max_bytes=300_000, vocab_size=2000)
    return {"data": dataset.data_prefix, "vocab": str(dataset.vocab_file), "corpus": str(dataset.corpus),
            "dir": directory}


@pytest.fixture(scope="module")
def checkpoint(assets) -> str:
    """A 1-step checkpoint of the TINY model, saved by the trainer."""
    save = assets["dir"] / "ckpt"
    result = run_command("pretrain", [*PRETRAIN, "--save", str(save)], assets["dir"], assets)
    assert result.returncode == 0, result.stderr[-3000:]
    return str(save)


def run_command(command: str, argv: list, tmp: Path, assets: dict, extra=(), env=None) -> subprocess.CompletedProcess:
    """One rank by env:// (the launcher sets its own), on CPU; the launch scripts' RUN_DIR in `tmp`."""
    values = {"tmp": str(tmp), "port": str(free_port()), **{key: str(value) for key, value in assets.items()}}
    env = {name: value if value is None else value.format(**values) for name, value in (env or {}).items()}
    extra = env.pop("TAIL").split() if "TAIL" in env else extra
    line = [part.format(**values) for part in [*COMMANDS[command], *argv, *extra]]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "CUDA_VISIBLE_DEVICES": "", "RUN_DIR": str(tmp / "run"), **env}
    env = {name: value for name, value in env.items() if value is not None}  # None: unset
    return subprocess.run(line, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def snapshot(folder: Path) -> dict:
    """Every file with its size and modification time, every folder (a temporary file created and
    removed again changes only its folder's time), every link with its target."""
    return {str(path.relative_to(folder)): ("link", os.readlink(path)) if path.is_symlink() else "folder"
            if path.is_dir() else (path.stat().st_size, path.stat().st_mtime_ns) for path in folder.rglob("*")}


def run_case(case: Case, tmp: Path, assets: dict) -> tuple:
    """Breaks one thing in `tmp` and runs the entry point: (result, files before, files after)."""
    for name, text in case.files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    if case.setup:
        case.setup(tmp, assets)
    before = snapshot(tmp)
    result = run_command(case.command, case.argv, tmp, assets, MULTINODE_TAIL if case.command == "multinode" else (),
                         case.env)
    return result, before, snapshot(tmp)


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory, assets) -> dict:
    """case id -> future of run_case, for the cases this session selected, run a few at a time: each
    process spends seconds importing torch and DeepSpeed on one core, so two cores halve the time."""
    selected = [item.callspec.params["case"] for item in request.session.items
                if isinstance(getattr(item, "callspec", None) and item.callspec.params.get("case"), Case)]
    if any(case.needs_checkpoint for case in selected):
        assets = {**assets, "ckpt": request.getfixturevalue("checkpoint")}
    with ThreadPoolExecutor(min(4, os.cpu_count() or 2)) as pool:
        yield {case.id: pool.submit(run_case, case, tmp_path_factory.mktemp(case.id), assets) for case in selected}


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_line_and_leaves_nothing(case, outcomes):
    result, before, after = outcomes[case.id].result()
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert lines and all(phrase in lines[-1] for phrase in case.phrases), result.stderr[-3000:]
    assert "error" in lines[-1] and "Traceback" not in result.stderr, result.stderr[-3000:]
    # once, not once per rank (launch2: two ranks, each exits non-zero)
    assert sum(": error: " in line for line in lines) == 1, result.stderr[-3000:]
    if case.mid_run:
        after = {path: value for path, value in after.items() if path.split(os.sep)[0] != "log"}
    assert after == before  # nothing written, nothing half-written


def test_debug_shows_the_traceback(tmp_path, assets):
    result = run_command("pretrain", [*PRETRAIN, "--vocab-file", "{tmp}/none.txt", "--debug"], tmp_path, assets)
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "DataError: vocab file" in result.stderr, result.stderr[-3000:]


# Flag values that cannot mean what was asked: refused before the process group or DeepSpeed
# starts, so they are checked in this process (main() is stopped if it gets as far as pretrain).
FLAG_MISTAKES = {
    "mask_prob_zero": (["--mask-prob", "0"], ("--mask-prob 0.0 is outside (0, 1]", "--mask-prob 0.15")),
    "mask_prob_above_one": (["--mask-prob", "1.5"], ("--mask-prob 1.5 is outside (0, 1]",)),
    "short_seq_prob_negative": (["--short-seq-prob", "-0.1"], ("--short-seq-prob -0.1 is outside [0, 1]",
                                                              "--short-seq-prob 0.1 (0: none)")),
    "micro_batch_zero": (["--micro-batch-size", "0"], ("--micro-batch-size 0 must be >= 1",)),
    "global_batch_zero": (["--global-batch-size", "0"], ("--global-batch-size 0 must be >= 1",)),
    "warmup_fraction_above_one": (["--lr-warmup-fraction", "1.5"], ("--lr-warmup-fraction 1.5 is outside [0, 1]",)),
    "min_lr_above_lr": (["--lr", "1e-4", "--min-lr", "1e-3"], ("--min-lr 0.001 is above --lr 0.0001",
                                                              "--min-lr at most --lr")),
    "negative_lr": (["--lr=-1e-4"], ("--lr -0.0001 is negative", "positive peak learning rate")),
    "log_interval_zero": (["--log-interval", "0"], ("--log-interval 0 must be >= 1",)),
    "eval_interval_zero": (["--eval-interval", "0"], ("--eval-interval 0 must be >= 1",)),
    # 0 is Megatron-LM's "no evaluation", taken as such (test_training: a run with it)
    "eval_iters_negative": (["--eval-iters", "-1"], ("--eval-iters -1 must be >= 0", "or 0 for no evaluation")),
    "save_interval_zero": (["--save-interval", "0"], ("--save-interval 0 must be >= 1",)),
    "keep_last_zero": (["--keep-last", "0"], ("--keep-last 0 must be >= 1",)),
    # logs inside a checkpoint folder: --keep-last removed them mid-run, and the run ended naming files long gone
    "log_dir_inside_a_save_checkpoint": (["--save", "{tmp}/ck", "--keep-last", "1", "--log-dir",
                                          "{tmp}/ck/iter_0000006/logs"], (
        "--log-dir /nonexistent/ck/iter_0000006/logs is inside checkpoint iter_0000006 of --save /nonexistent/ck",
        "--keep-last removes that folder", "; choose a --log-dir outside the iter_* folders of /nonexistent/ck")),
    "tensorboard_dir_inside_a_load_checkpoint": (["--load", "{tmp}/ck", "--tensorboard-dir", "{tmp}/ck/iter_2/tb"], (
        "--tensorboard-dir /nonexistent/ck/iter_2/tb is inside checkpoint iter_2 of --load /nonexistent/ck",)),
    "num_workers_negative": (["--num-workers", "-1"], ("--num-workers -1 must be >= 0", "--num-workers 0")),
    "num_workers_beyond_the_cpus": (["--num-workers", "100000"], (  # forked them all: the rank hung for minutes
        "--num-workers 100000 is more than 4 x the", "os.cpu_count()", "pass --num-workers")),
    "negative_train_iters": (["--train-iters", "-5"], ("--train-iters -5 is negative", "the run length")),
    "train_iters_zero": (["--train-iters", "0"], ("--train-iters 0 is zero: no step to train", "N >= 1")),
    "negative_seed": (["--seed", "-1"], ("--seed -1 is outside [0, 2**32)",)),
    "weight_decay_negative": (["--weight-decay", "-5"], ("--weight-decay -5.0 is negative",)),
    "adam_beta1_above_one": (["--adam-beta1", "1.5"], ("--adam-beta1 1.5 is outside [0, 1)", "--adam-beta1 0.9")),
    "adam_beta2_one": (["--adam-beta2", "1"], ("--adam-beta2 1.0 is outside [0, 1)",)),
    "adam_eps_zero": (["--adam-eps", "0"], ("--adam-eps 0.0 must be > 0", "e.g. 1e-8")),
    "clip_grad_negative": (["--clip-grad", "-1"], ("--clip-grad -1.0 is negative", "0 turns clipping off")),
    "lr_nan": (["--lr", "nan"], ("--lr nan is not a finite number",)),
    "hidden_dropout_inf": (["--hidden-dropout", "inf"], ("--hidden-dropout inf is not a finite number",)),
    "rotary_base_inf": (["--rotary-base", "inf"], ("--rotary-base inf is not a finite number",)),
    "train_iters_and_train_samples": (["--train-samples", "100"], ("--train-iters 1 and --train-samples 100 both",
                                                                  "pass one of them")),
    "split_without_training": (["--split", "0,0,100"], ("--split '0,0,100' gives the training set no documents",
                                                        "--split 949,50,1")),
    "split_nan": (["--split", "98,nan,2"], ("--split '98,nan,2' is not up to three finite weights",)),
    "split_four_parts": (["--split", "90,5,4,1"], ("--split '90,5,4,1' is not up to three finite weights",)),
    "data_path_negative_weight": (["--data-path", "-1", "{data}", "2", "{data}"],
                                  ("--data-path weight -1 of /nonexistent/data is not a finite number >= 0",
                                   "--data-path W1 PREFIX1")),
    "data_path_weights_all_zero": (["--data-path", "0", "{data}", "0", "{data}"],
                                   ("--data-path weights 0, 0 are all 0", "a positive weight")),
    # '' (an unset shell variable): was read as no flag (an empty --vocab-file: "--data-path is given without
    # --vocab-file"; an empty --save blamed the --save-interval a launch script adds)
    "vocab_file_empty": (["--data-path", "{data}", "--vocab-file", ""], ("--vocab-file is given an empty value ('')",
                                                                         "leave it out")),
    "save_empty": (["--save", "", "--save-interval", "10"], ("--save is given an empty value ('')",)),
    "data_path_empty": (["--data-path", "0.5", "{data}", "0.5", ""], ("--data-path is given an empty value",)),
    # flags the run would not read
    "save_interval_without_save": (["--save-interval", "10"], ("--save-interval is given without --save",
                                                               "add --save DIR or drop --save-interval")),
    "keep_last_without_save": (["--keep-last", "2"], ("--keep-last is given without --save",)),
    "exit_duration_without_save": (["--exit-duration-in-mins", "30"], (
        "--exit-duration-in-mins is given without --save (its stop is saved for a resume)",)),
    "exit_duration_zero": (["--exit-duration-in-mins", "0"], ("--exit-duration-in-mins 0.0 must be > 0",)),
    "no_position_extension_without_hf": (["--no-position-extension"], (
        "--no-position-extension is given without --init-from-hf",)),
    "min_lr_with_constant_decay": (["--lr-decay-style", "constant", "--min-lr", "1e-5"], (
        "--min-lr 1e-05 is given with --lr-decay-style constant, which does not read it", "linear or cosine")),
    "warmup_fraction_and_iters": (["--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "5"], (
        "--lr-warmup-fraction 0.1 and --lr-warmup-iters 5 both set the warm-up", "pass one of them")),
    "warmup_iters_negative": (["--lr-warmup-iters", "-1"], ("--lr-warmup-iters -1 must be >= 0",)),
    "decay_iters_zero": (["--lr-decay-iters", "0"], ("--lr-decay-iters 0 must be >= 1",)),
    "decay_iters_with_constant_decay": (["--lr-decay-style", "constant", "--lr-decay-iters", "10"], (
        "--lr-decay-iters 10 is given with --lr-decay-style constant", "linear or cosine or inverse-square-root or WSD")),
    "wsd_decay_iters_with_cosine": (["--lr-decay-style", "cosine", "--lr-wsd-decay-iters", "10"], (
        "--lr-wsd-decay-iters 10 is given with --lr-decay-style cosine", "pass --lr-decay-style WSD")),
    "wsd_decay_style_without_wsd": (["--lr-wsd-decay-style", "minus_sqrt"], (
        "--lr-wsd-decay-style minus_sqrt is given with --lr-decay-style linear", "pass --lr-decay-style WSD")),
    "wsd_without_its_decay_iters": (["--lr-decay-style", "wsd"], (
        "--lr-decay-style WSD is given without --lr-wsd-decay-iters", "add --lr-wsd-decay-iters N")),
}


def test_a_data_cache_path_that_cannot_be_written_is_named_before_any_work(monkeypatch, capsys):
    """A read-only --data-cache-path was found when the first index map was written, and the fix said
    `pass --data-cache-path DIR, a folder every rank can write` to a user who had."""
    import errno

    import megatron.training as training
    from megatron import paths

    def read_only(folder):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(paths, "write_probe", read_only)
    monkeypatch.setattr(training, "pretrain", lambda args: pytest.fail("the flags were accepted"))
    placeholders = {"tmp": "/nonexistent", "data": "/nonexistent/data", "vocab": "/nonexistent/vocab.txt"}
    argv = [part.format(**placeholders) for part in [*PRETRAIN, "--data-cache-path", "/nonexistent/ro/cache"]]
    assert training.main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["pretrain_bert.py: error: --data-cache-path /nonexistent/ro/cache is not writable (Read-only file "
                     "system); pass a --data-cache-path directory this user can write"]


@pytest.mark.parametrize("mistake", FLAG_MISTAKES)
def test_flag_mistake_is_one_line_before_anything_starts(mistake, monkeypatch, capsys):
    import megatron.training as training

    argv, phrases = FLAG_MISTAKES[mistake]
    monkeypatch.setattr(training, "pretrain", lambda args: pytest.fail("the flags were accepted"))
    placeholders = {"tmp": "/nonexistent", "data": "/nonexistent/data", "vocab": "/nonexistent/vocab.txt"}
    assert training.main([part.format(**placeholders) for part in [*PRETRAIN, *argv]]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pretrain_bert.py: error: "), lines
    assert all(phrase in lines[0] for phrase in phrases), lines


def test_a_vocab_size_of_zero_is_refused_as_a_negative_one(monkeypatch):
    """--vocab-size 0 was taken for "not given" (`flags["vocab_size"] or ...`): the run trained at the vocab
    file's size without a word, where -5 was refused. Through the trainer's start-up checks (the vocab size is
    checked where the config is resolved, not with the flags)."""
    from megatron import arguments, start_plan, training

    monkeypatch.setenv("WORLD_SIZE", "1")  # the launcher's world size: the config is resolved before the rendezvous
    placeholders = {"tmp": "/nonexistent", "data": "/nonexistent/data", "vocab": "/nonexistent/vocab.txt"}
    for value in ("0", "-5"):
        args = arguments.build_parser().parse_args([part.format(**placeholders) for part in PRETRAIN]
                                                   + ["--vocab-size", value])
        with pytest.raises(ConfigError, match=re.escape(f"vocab_size = {value} must be positive; set --vocab-size "
                                                        "to an integer >= 1")):
            training.check_before_rendezvous(args, start_plan.check_start(args))


def test_a_pipeline_without_a_json_is_told_which_json_to_pass(monkeypatch):
    """Through the trainer's own start-up checks, where the JSON it resolves holds the optimizer and settings it
    fills in even when none was given: the fix names the file to pass, not keys of a JSON the user lacks."""
    from megatron import arguments, start_plan, training

    monkeypatch.setenv("WORLD_SIZE", "2")  # the launcher's world size: the layout is checked before the rendezvous
    placeholders = {"tmp": "/nonexistent", "data": "/nonexistent/data", "vocab": "/nonexistent/vocab.txt"}
    args = arguments.build_parser().parse_args([part.format(**placeholders) for part in PRETRAIN]
                                               + ["--pipeline-model-parallel-size", "2"])
    with pytest.raises(ConfigError) as error:
        training.check_before_rendezvous(args, start_plan.check_start(args))
    assert error.value.problem.startswith("gradient clipping 1.0 (DeepSpeed's default: no --deepspeed_config is "
                                          "given) with a pipeline"), error.value.problem
    assert error.value.fix == ('pass --deepspeed --deepspeed_config FILE holding {"zero_optimization": {"stage": 1}}, '
                               "or turn clipping off (--clip-grad 0)")


# Megatron-LM's and Megatron-DeepSpeed's flags (megatron/flag_habits.py): one line naming this trainer's
# equivalent, where they were a bare `unrecognized arguments` whose "see --help" said nothing of precision
HABIT_FLAGS = {
    "fp16": (["--fp16"], ("--fp16 is Megatron-LM's flag: this trainer takes the precision from the DeepSpeed JSON",
                          '"fp16": {"enabled": true}', "ds_configs/fp16_ring_sp2.json")),
    "bf16": (["--bf16"], ('"bf16": {"enabled": true}', "ds_configs/bf16_ring_sp2.json")),
    # Megatron's TP activation splitting: was read as an abbreviation of --sequence-parallel-size (and
    # `--sequence-parallel 1` was accepted silently)
    "sequence_parallel": (["--sequence-parallel"], ("--sequence-parallel is Megatron-LM's flag: it splits "
                                                    "tensor-parallel activations", "--sequence-parallel-size N")),
    "sequence_parallel_with_a_value": (["--sequence-parallel", "2"], ("no tensor parallelism",)),
    "sequence_parallel_equals": (["--sequence-parallel=1"], ("--sequence-parallel is Megatron-LM's flag",)),
    "context_parallel_size": (["--context-parallel-size", "2"], (
        "pass --sequence-parallel-size 2 --attention ring (or ulysses)",)),
    "ds_sequence_parallel_size": (["--ds-sequence-parallel-size=4"], (
        "--ds-sequence-parallel-size is Megatron-DeepSpeed's flag", "pass --sequence-parallel-size 4 --attention "
        "ulysses")),
    "recompute_activations": (["--recompute-activations"], ("pass --checkpoint-activations",)),
    "recompute_granularity": (["--recompute-granularity", "full", "--recompute-method", "uniform"], (
        "--recompute-granularity is Megatron-LM's flag", "pass --checkpoint-activations")),
    "recompute_num_layers": (["--recompute-num-layers", "2"], ("pass --checkpoint-activations --checkpoint-num-layers "
                                                               "2",)),
    "deepspeed_activation_checkpointing": (["--deepspeed-activation-checkpointing"], (
        "Megatron-DeepSpeed's flag", "pass --checkpoint-activations")),
    "tensor_model_parallel_size": (["--tensor-model-parallel-size", "2"], (
        "this trainer has no tensor parallelism", "--sequence-parallel-size N", "--pipeline-model-parallel-size N",
        '"zero_optimization": {"stage": 1}')),
    "exit_interval": (["--exit-interval", "2"], ("pass --train-iters 2",)),
    "zero_stage": (["--zero-stage", "2"], ('"zero_optimization": {"stage": 2}',)),
    "use_flash_attn": (["--use-flash-attn"], ("scaled_dot_product_attention", "drop it")),
    "override_scheduler": (["--override-opt_param-scheduler"], ("pass --finetune --load DIR",)),
    "rotary": (["--use-rotary-position-embeddings"], ("pass --position-embedding-type rope",)),
    "a_later_habit_flag": (["--seed", "3", "--timing-log-level", "2"], ('"wall_clock_breakdown": true',)),
}


@pytest.mark.parametrize("mistake", HABIT_FLAGS)
def test_another_trainers_flag_names_this_ones_equivalent(mistake, capsys):
    from megatron.arguments import build_parser

    argv, phrases = HABIT_FLAGS[mistake]
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    lines = capsys.readouterr().err.splitlines()
    assert exited.value.code == 2 and len(lines) == 1 and lines[0].startswith("pretrain_bert.py: error: "), lines
    assert all(phrase in lines[0] for phrase in phrases) and "see pretrain_bert.py --help" not in lines[0], lines


def test_every_habit_row_is_one_line_and_unknown_flags_keep_argparses():
    """Each row of the tables is refused by its program in the `problem; fix` form (the row's own flag first,
    no other '; '), none shadows a flag the program has, an abbreviation of the trainer's own flags still
    works (documented: docs/launching.md), and a flag no table knows keeps argparse's line."""
    from megatron.arguments import build_parser
    from megatron.flag_habits import PREPROCESS_HABITS, TRAINER_HABITS, habit_problem

    preprocess_data = importlib.import_module("preprocess_data")
    for habits, parser in ((TRAINER_HABITS, build_parser()), (PREPROCESS_HABITS, preprocess_data.build_parser())):
        for flag in habits:
            assert flag not in parser._option_string_actions, flag
            problem, fix = habit_problem([flag, "3"], parser._option_string_actions, habits)
            assert problem.startswith(f"{flag} is ") and "; " not in problem + fix and "{value}" not in fix, fix
    assert build_parser().parse_args(["--micro-batch", "3", "--local-rank=1"]).micro_batch_size == 3
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--sequence-parallel-sise", "2"])


def test_every_habit_flag_of_a_command_line_is_named_in_its_one_line(capsys):
    """Megatron-DeepSpeed's own BERT script pasted took six runs, one refused flag each: the first flag's
    equivalent comes in full, the others are named with the docs' table that gives theirs."""
    from megatron.arguments import build_parser
    from megatron.paths import in_repository

    argv = ["--override-opt_param-scheduler", "--tensor-model-parallel-size", "1", "--fp16", "--zero-stage=0",
            "--no-pipeline-parallel", "--fp16", "--tensorboard-queue-size", "1", "--log-timers-to-tensorboard"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pretrain_bert.py: error: --override-opt_param-scheduler is "
                                                   "Megatron-LM's flag: "), lines
    assert lines[0].endswith("pass --finetune --load DIR with the new --lr and schedule flags (and another --save) "
                             "(and --tensor-model-parallel-size, --fp16, --zero-stage, --no-pipeline-parallel, "
                             "--tensorboard-queue-size, --log-timers-to-tensorboard: each one's equivalent is in "
                             f'{in_repository("docs/deepspeed.md")}, "Coming from Megatron-LM / '
                             'Megatron-DeepSpeed")'), lines


def _pasted_flags(fix: str, parser) -> list[str]:
    """The trainer flags a habit row's fix names, as argv: each with the value written after it where the flag takes
    that value (a number, one of its choices), else a stand-in "2" where it takes one (N, DIR, "(samples / ...)")."""
    argv = []
    for flag, written in re.findall(r"(--[\w-]+)(?: ([^\s()]+))?", fix):
        action, written = parser._option_string_actions[flag], written.rstrip(",")  # KeyError: no trainer flag
        if action.nargs == 0:
            value = []
        elif written and (re.fullmatch(r"[\d.,]+", written) or written in (action.choices or ())):
            value = [written]
        else:
            value = ["2"]
        argv += [flag, *value]
    return argv


def _pasted_json(fix: str) -> dict | None:
    """The DeepSpeed JSON keys a habit row's fix writes after "with" (the longest part that is JSON, a stand-in 2 for
    a one-letter value), or None."""
    from megatron.flag_habits import JSON

    if not fix.startswith(JSON) and f"{JSON} " not in fix:
        return None
    text = re.sub(r"(?<=: )[A-Z]\b", "2", fix.split(f"{JSON} ", 1)[1])  # a stand-in number: "initial_scale_power": P
    for end in range(len(text), 0, -1):
        try:
            return json.loads("{" + text[:end] + "}")
        except ValueError:
            continue
    return None


def test_each_habit_rows_equivalent_works_when_pasted():
    """The equivalent each row names, pasted: its trainer flags parse (with the value shown), and the JSON keys it
    writes pass the trainer's checks of the DeepSpeed JSON (the row of --accumulate-allreduce-grads-in-fp32 named
    a JSON DeepSpeed stops on without ZeRO)."""
    from megatron.arguments import build_parser
    from megatron.config import resolve
    from megatron.flag_habits import JSON, TRAINER_HABITS

    parser = build_parser()
    bf16 = _pasted_json(TRAINER_HABITS["--bf16"][2])
    for flag, (_, _, fix) in TRAINER_HABITS.items():
        pasted = fix.replace("{value}", "2")
        argv = _pasted_flags(pasted, parser)
        parser.parse_args(argv)  # SystemExit: the pasted flags are no command line
        settings = _pasted_json(pasted)
        assert settings is not None or JSON not in fix or "..." in fix, (flag, fix)
        for precision in ({}, bf16):  # and with the JSON of --bf16, which Megatron-LM's runs pair with the others
            if settings is not None and not (precision and "fp16" in settings):
                resolve({}, {"train_micro_batch_size_per_gpu": 1, **precision, **settings}, world_size=1)


def test_a_habit_flag_after_the_wrapping_tools_dashes_names_their_own_options():
    """tools/extend_context.py and azureml/submit.py hand the trainer's flags on after `--` and refuse the ones
    they set themselves (the JSON, the layout, the data and checkpoint folders): a habit row's fix names the
    tool's option, which goes before the `--`, not the trainer flag the tool would refuse."""
    from megatron.flag_habits import wrapped_fix

    extend_context = importlib.import_module("extend_context")
    with pytest.raises(ConfigError) as error:
        extend_context.trainer_parser().parse_args(["--fp16"])
    assert error.value.problem.startswith("pretrain_bert.py flags after --: --fp16 is Megatron-LM's flag")
    assert error.value.fix.startswith('pass --deepspeed-config FILE with "fp16": {"enabled": true}'), error.value.fix
    assert error.value.fix.endswith("(--deepspeed-config: this tool's own, before --)")
    with pytest.raises(ConfigError) as error:
        extend_context.trainer_parser().parse_args(["--context-parallel-size", "4"])
    assert error.value.fix == ("pass --sequence-parallel-size 4 --attention ring (or ulysses) "
                               "(--sequence-parallel-size, --attention: this tool's own, before --)")

    from test_azureml import load_submit_module

    job_flags = load_submit_module().JOB_FLAGS  # azureml/submit.py's own options for trainer flags
    fix = wrapped_fix("pass --save-interval 5 with --save DIR", {flag: option for flag, option in job_flags.values()})
    assert fix == "pass --save-interval 5 with --checkpoints DIR (--checkpoints: this tool's own, before --)"


def test_torch_distributed_launchs_local_rank_is_taken():
    """torch.distributed.launch (Megatron-LM's launch) passes --local-rank=N, DeepSpeed's launcher --local_rank=N."""
    from megatron.arguments import build_parser

    for given in (["--local-rank=1"], ["--local-rank", "1"], ["--local_rank=1"]):
        assert build_parser().parse_args(given).local_rank == 1, given


@pytest.mark.parametrize("argv, phrases", [
    (["--partitions", "2"], ("--partitions is Megatron-LM's flag", "drop it and pass --workers N")),
    (["--tokenizer-model", "t.model"], ("not a SentencePiece .model", "pass --tokenizer-file TOKENIZER.json",
                                        "--vocab-file vocab.txt")),
    (["--keep-sequential-samples"], ("documents are always written in input order", "drop it")),
])
def test_megatrons_preprocess_flags_name_their_equivalent(argv, phrases, capsys):
    preprocess_data = importlib.import_module("preprocess_data")
    with pytest.raises(SystemExit) as exited:
        preprocess_data.parse_args(["--input", "x.json", "--output-prefix", "x", *argv])
    lines = capsys.readouterr().err.splitlines()
    assert exited.value.code == 2 and len(lines) == 1 and lines[0].startswith("preprocess_data.py: error: "), lines
    assert all(phrase in lines[0] for phrase in phrases), lines


def test_the_megatron_table_of_the_docs_is_the_parsers():
    """docs/deepspeed.md's "Coming from Megatron-LM" table is the one the parsers refuse flags with."""
    from megatron.flag_habits import markdown_table

    assert markdown_table() in (ROOT / "docs" / "deepspeed.md").read_text(), (
        "regenerate the table: python -c 'from megatron.flag_habits import markdown_table; print(markdown_table())'")


def test_no_data_path_with_another_vocab_is_refused_before_the_default_data_is_built(tmp_path, assets):
    """Without --data-path the run trains on the default dataset, made with its own vocab: another
    --vocab-file is refused before anything is built (no process group needed: extend_context's dry
    run calls the same check); the vocab of a --default-data-dir built with it passes."""
    from megatron import run_data, start_plan
    from megatron.arguments import build_parser
    from megatron.errors import ConfigError

    args = build_parser().parse_args([*TINY, "--vocab-file", assets["vocab"], "--default-data-dir", str(tmp_path / "d")])
    with pytest.raises(ConfigError, match=f"no --data-path: the run would train on the default dataset, made with the "
                                          f"vocab .*default_vocab.txt, while its tokenizer is {assets['vocab']}"):
        run_data.data_paths(args, start_plan.StartPlan.given(args))
    assert not (tmp_path / "d").exists()
    cased = build_parser().parse_args([*TINY, "--vocab-file", assets["vocab"], "--tokenizer-type", "BertWordPieceCase"])
    with pytest.raises(ConfigError, match=f"preprocess_data.py --tokenizer-type BertWordPieceCase --vocab-file "
                                          rf"{assets['vocab']} \.\.\.\)"):  # the data made as the fix says is cased
        run_data.data_paths(cased, start_plan.StartPlan.given(cased))
    args.default_data_dir = str(assets["dir"])  # made by prepare_default_dataset with this vocab
    run_data.check_default_data_vocab(args, run_data.run_tokenizer(args, start_plan.StartPlan.given(args)))
    bare = build_parser().parse_args([*TINY, "--default-data-dir", str(tmp_path / "d")])  # weights, no tokenizer
    with pytest.raises(ConfigError, match=r"no --data-path, and the weights carry no tokenizer: the run would train on "
                                          r"the default dataset, whose vocab .*default_vocab.txt has 8192 tokens, more "
                                          r"than the model's vocab_size 1500; pass the tokenizer the weights"):
        run_data.data_paths(bare, start_plan.StartPlan.given(bare), vocab_size=1500)
    assert not (tmp_path / "d").exists()
    run_data.check_default_data_vocab(bare, None, vocab_size=8192)  # it fits: the default vocab is theirs


def test_truncated_safetensors_is_a_data_error(tmp_path):
    from megatron.errors import DataError
    from megatron.hf_io import read_safetensors, write_safetensors
    import torch

    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"w": torch.ones(64, 64)})
    whole = path.read_bytes()
    for kept in (1000, len(whole) - 4):  # cut inside the data, or short of its last bytes only
        path.write_bytes(whole[:kept])
        with pytest.raises(DataError, match="model.safetensors is not a complete safetensors file"):
            read_safetensors(path)


def test_the_largest_token_id_the_vocab_holds_is_accepted_one_more_is_refused():
    """Ids 0 to vocab_size - 1 fit the embedding; vocab_size itself is data of another vocab (the ranks'
    largest id, here one rank's)."""
    import torch
    from megatron.errors import DataError
    from megatron.stop_signals import StopSignals

    stop = StopSignals("tokenizer.json")
    stop._largest = lambda values: values  # one rank: the all-reduce's MAX is its own values
    stop.agree([SimpleNamespace(tokens=torch.tensor([[1, 99]]))], 100)
    with pytest.raises(DataError, match="the data holds token id 100, beyond the 100 tokens of the vocab tokenizer"):
        stop.agree([SimpleNamespace(tokens=torch.tensor([[3, 100]]))], 100)


# Settings that only the resolved configuration can judge (the JSON, the optimizer type, the attention variant,
# the layer options, an HF folder, the launch environment): refused by pretrain() before the rendezvous (here:
# device.select_device fails the test), in this process, one line, nothing written. id -> (argv, files, phrases,
# env); argv and files take {tmp}, and {hf}: a call that builds an HF folder in tmp first.
CONFIG_MISTAKES = {
    # ---- flags the run would not read, where the JSON decides it (its activation_checkpointing section turns the
    # recompute on that --checkpoint-num-layers sizes)
    "checkpoint_num_layers_without_recompute": (["--checkpoint-num-layers", "2"], {}, (
        "--checkpoint-num-layers is given without --checkpoint-activations or an activation_checkpointing section",
        "add --checkpoint-activations"), {}),
    # ---- JSON read strictly
    "json_nan_clipping": (["--deepspeed_config", "{tmp}/ds.json"],
                          {"ds.json": '{"train_micro_batch_size_per_gpu": 2, "gradient_clipping": NaN}'},
                          ("ds.json: gradient_clipping = NaN is not a finite number",), {}),
    "json_infinity_nested": (["--deepspeed_config", "{tmp}/ds.json"],
                             {"ds.json": '{"optimizer": {"type": "AdamW", "params": {"eps": -Infinity}}}'},
                             ("optimizer.params.eps = -Infinity is not a finite number",), {}),
    "json_number_overflows_to_inf": (["--deepspeed_config", "{tmp}/ds.json"],
                                     {"ds.json": '{"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1e999}'},
                                     ("gradient_clipping = 1e999 is not a finite number",), {}),
    # ---- optimizer params against the optimizer type
    "json_lr_string": (["--deepspeed_config", "{tmp}/ds.json"],
                       {"ds.json": ds_json(optimizer={"type": "AdamW", "params": {"lr": "1e-3"}})},
                       ('optimizer.params.lr = "1e-3" is not a number >= 0', "without quotes"), {}),
    "json_betas_of_length_one": (["--deepspeed_config", "{tmp}/ds.json"],
                                 {"ds.json": ds_json(optimizer={"type": "AdamW", "params": {"betas": [0.9]}})},
                                 ("optimizer.params.betas = [0.9] is not two numbers in [0, 1)", "[0.9, 0.999]"), {}),
    "json_betas_of_length_one_with_beta2_flag": (
        ["--deepspeed_config", "{tmp}/ds.json", "--adam-beta2", "0.99"],
        {"ds.json": ds_json(optimizer={"type": "AdamW", "params": {"betas": [0.9]}})},
        ("optimizer.params.betas = [0.9] is not two numbers",), {}),
    "json_beta_of_one": (["--deepspeed_config", "{tmp}/ds.json"],
                         {"ds.json": ds_json(optimizer={"type": "Adam", "params": {"betas": [0.9, 1.0]}})},
                         ("optimizer.params.betas = [0.9, 1.0] is not two numbers in [0, 1)",), {}),
    "json_eps_zero": (["--deepspeed_config", "{tmp}/ds.json"],
                      {"ds.json": ds_json(optimizer={"type": "AdamW", "params": {"eps": 0}})},
                      ("optimizer.params.eps = 0 is not a number > 0",), {}),
    "json_weight_decay_negative": (["--deepspeed_config", "{tmp}/ds.json"],
                                   {"ds.json": ds_json(optimizer={"type": "AdamW", "params": {"weight_decay": -1}})},
                                   ("optimizer.params.weight_decay = -1 is not a number >= 0",), {}),
    "json_amsgrad_string": (["--deepspeed_config", "{tmp}/ds.json"],
                            {"ds.json": ds_json(optimizer={"type": "AdamW", "params": {"amsgrad": "yes"}})},
                            ('optimizer.params.amsgrad = "yes" is not a boolean',), {}),
    "json_sgd_with_eps": (["--deepspeed_config", "{tmp}/ds.json"],
                          {"ds.json": ds_json(optimizer={"type": "SGD", "params": {"eps": 1e-8}})},
                          ("optimizer.params.eps is not a parameter of optimizer.type SGD, which takes dampening",),
                          {}),
    "json_fused_adam_param_with_torch_adam": (
        ["--deepspeed_config", "{tmp}/ds.json"],
        {"ds.json": ds_json(optimizer={"type": "AdamW", "params": {"torch_adam": True, "bias_correction": True}})},
        ("optimizer.params.bias_correction is not a parameter of torch's AdamW",), {}),
    "json_muon_unknown_param": (["--deepspeed_config", "{tmp}/ds.json"],
                                {"ds.json": ds_json(optimizer={"type": "Muon", "params": {"nesterov": True}})},
                                ("optimizer.params.nesterov is not a parameter of optimizer.type Muon",), {}),
    "json_max_grad_norm": (["--deepspeed_config", "{tmp}/ds.json"],
                           {"ds.json": ds_json(optimizer={"type": "AdamW", "params": {"max_grad_norm": 1.0}})},
                           ("optimizer.params.max_grad_norm", "gradient_clipping"), {}),
    "json_lbfgs": (["--deepspeed_config", "{tmp}/ds.json"], {"ds.json": ds_json(optimizer={"type": "LBFGS"})},
                   ("optimizer.type LBFGS cannot train this model", "closure"), {}),
    "json_sgd_with_adam_beta1_flag": (["--deepspeed_config", "{tmp}/ds.json", "--adam-beta1", "0.8"],
                                      {"ds.json": ds_json(optimizer={"type": "SGD", "params": {"lr": 0.1}},
                                                          zero_optimization__stage=0)},
                                      ("--adam-beta1 0.8 is given but optimizer.type SGD takes no betas",
                                       "drop --adam-beta1"), {}),
    # ---- DeepSpeed's unchecked top-level scalars
    "json_steps_per_print_string": (["--deepspeed_config", "{tmp}/ds.json"], {"ds.json": ds_json(steps_per_print="10")},
                                    ('steps_per_print = "10" is not an integer >= 1',), {}),
    "json_prescale_gradients_number": (["--deepspeed_config", "{tmp}/ds.json"],
                                       {"ds.json": ds_json(prescale_gradients=1)},
                                       ("prescale_gradients = 1 is not a boolean",), {}),
    "json_sparse_gradients": (["--deepspeed_config", "{tmp}/ds.json"], {"ds.json": ds_json(sparse_gradients=True)},
                              ('"sparse_gradients" in the DeepSpeed JSON: DeepSpeed 0.19.8 removed sparse embedding '
                               'gradients and refuses the key; remove "sparse_gradients"',), {}),
    "json_elasticity": (["--deepspeed_config", "{tmp}/ds.json"],
                        {"ds.json": ds_json(elasticity={"enabled": True, "max_train_batch_size": 64})},
                        ('"elasticity" in the DeepSpeed JSON: DeepSpeed 0.19.8 removed elastic training',
                         'remove "elasticity"; set the batch with train_batch_size'), {}),
    "json_compile_old_form": (["--deepspeed_config", "{tmp}/ds.json"],
                              {"ds.json": ds_json(compile={"enabled": True, "backend": "inductor"})},
                              ("compile.enabled is DeepSpeed 0.12-0.14's form", "--compile-mlp"), {}),
    # ---- a precision this device has no kernels for: before the rendezvous (and the data built after it)
    "json_fp16_on_a_cpu_without_fp16": (["--deepspeed_config", "{tmp}/ds.json"],
                                        {"ds.json": ds_json(fp16={"enabled": True})},
                                        ("fp16.enabled is true but DeepSpeed does not support fp16", "bf16"), {}),
    # ---- dtypes DeepSpeed reads late, or overrides
    "json_autocast_float16": (["--deepspeed_config", "{tmp}/ds.json"],
                              {"ds.json": ds_json(torch_autocast={"enabled": True, "dtype": "float16"})},
                              ('torch_autocast.dtype "float16" at ZeRO stage 1 with gradient_clipping 1.0 (the '
                               'default: the JSON sets none) would train on damped updates',
                               'use "fp16": {"enabled": true} in place of torch_autocast'),
                              {}),
    "json_autocast_int8": (["--deepspeed_config", "{tmp}/ds.json"],
                           {"ds.json": ds_json(torch_autocast={"enabled": True, "dtype": "int8"})},
                           ('torch_autocast.dtype = "int8" is not an autocast dtype', '"bfloat16"'), {}),
    "json_autocast_without_dtype": (["--deepspeed_config", "{tmp}/ds.json"],
                                    {"ds.json": ds_json(torch_autocast={"enabled": True})},
                                    ("torch_autocast is enabled without a dtype",), {}),
    **{f"json_autocast_modules_{name}": (["--deepspeed_config", "{tmp}/ds.json"], {"ds.json": ds_json(torch_autocast={
        "enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": modules})}, phrases, {})
       for name, modules, phrases in (
           ("not_importable", ["torch.nn.Linear", "foo.Bar"],
            ('lower_precision_safe_modules entry "foo.Bar" cannot be imported', "e.g. \"torch.nn.Linear\"")),
           ("a_string", "torch.nn.Linear", ('lower_precision_safe_modules = "torch.nn.Linear" is not a list',)),
           ("no_package", ["Linear"], ('entry "Linear" is not a "package.Class" name',)),
           ("a_function", ["torch.nn.functional.linear"], ("is not a torch.nn.Module class",)))},
    "json_grad_accum_dtype_unknown": (["--deepspeed_config", "{tmp}/ds.json"],
                                      {"ds.json": ds_json(data_types={"grad_accum_dtype": "fp8"})},
                                      ('data_types.grad_accum_dtype = "fp8" is not a dtype DeepSpeed knows',
                                       "fp32, fp16 or bf16"), {}),
    "json_seq_comm_dtype_unknown": (["--deepspeed_config", "{tmp}/ds.json"],
                                    {"ds.json": ds_json(seq_parallel_communication_data_type="int8")},
                                    ('seq_parallel_communication_data_type = "int8" is not a communication dtype',),
                                    {}),
    "json_comm_dtype_overridden_by_sequence_parallelism": (
        ["--deepspeed_config", "{tmp}/ds.json"],
        {"ds.json": ds_json(communication_data_type="fp16", sequence_parallel={"size": 2, "attention": "ring"})},
        ('communication_data_type "fp16" is not used at sequence-parallel size 2',
         '"seq_parallel_communication_data_type": "fp16"'), {"WORLD_SIZE": "2"}),
    # ---- ZeRO offload and stage-3 settings DeepSpeed ignores at the stage
    "json_offload_optimizer_at_stage_0": (["--deepspeed_config", "{tmp}/ds.json"], {"ds.json": ds_json(
        zero_optimization={"stage": 0, "offload_optimizer": {"device": "cpu"}})}, (
        "zero_optimization.offload_optimizer works at ZeRO stage 1-3 only and does nothing at stage 0",), {}),
    "json_offload_param_below_stage_3": (["--deepspeed_config", "{tmp}/ds.json"], {"ds.json": ds_json(
        zero_optimization={"stage": 2, "offload_param": {"device": "cpu"}})}, (
        "zero_optimization.offload_param works at ZeRO stage 3 only and does nothing at stage 2",), {}),
    "json_nvme_offload_below_stage_3": (["--deepspeed_config", "{tmp}/ds.json"], {"ds.json": ds_json(
        zero_optimization={"stage": 2, "offload_optimizer": {"device": "nvme"}})}, (
        'zero_optimization.offload_optimizer.device "nvme" works at ZeRO stage 3 only', 'device to "cpu"'), {}),
    "json_stage3_key_below_stage_3": (["--deepspeed_config", "{tmp}/ds.json"], {"ds.json": ds_json(
        zero_optimization={"stage": 1, "stage3_max_live_parameters": 1000})}, (
        "zero_optimization.stage3_max_live_parameters works at ZeRO stage 3 only and does nothing at stage 1",), {}),
    "json_nvme_offload_without_async_io": (["--deepspeed_config", "{tmp}/ds.json"], {"ds.json": ds_json(
        zero_optimization={"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nonexistent/swap"}})}, (
        'zero_optimization.offload_optimizer.device "nvme" needs DeepSpeed\'s async_io op', 'device "cpu"'), {}),
    # ZeRO++'s quantized communication where DeepSpeed has no quantizer op (its CPU accelerator), whatever
    # the precision: torch_autocast with quantized weights was a traceback inside deepspeed.zero.Init
    **{f"json_{key}_without_quantizer_op": (["--deepspeed_config", "{tmp}/ds.json"], {"ds.json": ds_json(
        zero_optimization={"stage": 3, key: True}, **autocast)}, (
        f"zero_optimization.{key} needs DeepSpeed's quantizer op", f"remove {key}"), {})
       for key, autocast in (("zero_quantized_weights", {"torch_autocast": {"enabled": True, "dtype": "bfloat16"}}),
                             ("zero_quantized_nontrainable_weights", {}), ("zero_quantized_gradients", {}))},
    **{f"json_weight_quantization_{name}": (["--deepspeed_config", "{tmp}/ds.json"], {"ds.json": ds_json(
        zero_optimization={"stage": 3}, weight_quantization={name: settings})}, (
        "\"weight_quantization\" section is ZeRO-Inference's weight quantization", 'remove "weight_quantization"'), {})
       for name, settings in (("quantized_initialization", {"num_bits": 8, "group_size": 64}),
                              ("post_init_quant", {"fc": {"num_bits": 8, "group_size": 64}}))},
    # ---- options of a variant or mode the run does not use
    "json_bigbird_section_with_ring": (
        ["--deepspeed_config", "{tmp}/ds.json"],
        {"ds.json": ds_json(sequence_parallel={"size": 1, "attention": "ring", "bigbird": {"block_size": 16}})},
        ("sequence_parallel.bigbird.block_size is set but attention is 'ring'", "set attention 'bigbird'"), {}),
    "json_linformer_section_with_dense": (
        ["--deepspeed_config", "{tmp}/ds.json"],
        {"ds.json": ds_json(sequence_parallel={"size": 1, "attention": "dense", "linformer": {"share_kv": False}})},
        ("sequence_parallel.linformer.share_kv is set but attention is 'dense'",), {}),
    "flag_linformer_k_with_ring": (["--attention", "ring", "--linformer-k", "16"],
                                   {}, ("--linformer-k is set but attention is 'ring'",), {}),
    "flag_block_size_with_dense": (["--block-size", "16"], {}, ("--block-size is set but attention is 'dense'",), {}),
    "flag_rotary_base_with_learned_positions": (["--rotary-base", "500000"], {}, (
        "--rotary-base 500000.0 is set but positions are learned", "add --position-embedding-type rope"), {}),
    "flag_global_every_without_window": (["--global-attention-every", "3"], {}, (
        "--global-attention-every 3 is set without --local-attention-window",), {}),
    "flag_window_with_every_layer_global": (["--position-embedding-type", "rope", "--local-attention-window", "16"],
                                            {}, ("--local-attention-window 16 is set but no layer is local",), {}),
    "flag_local_rotary_base_without_local_layers": (
        ["--position-embedding-type", "rope", "--local-rotary-base", "500"], {},
        ("--local-rotary-base 500.0 is set but no layer is local",), {}),
    # ---- Hugging Face import accounts for every tensor
    "hf_missing_encoder_tensor": (["--init-from-hf", "{hf}", "--max-position-embeddings", "512"], {},
                                  ("lacks 1 tensor(s) of the model", MISSING_KEY), {}),
    "hf_nan_weights": (["--init-from-hf", "{hf}", "--max-position-embeddings", "512"],
                       {"hf_nan": ("bert.encoder.layer.1.output.dense.weight",)},
                       ("tensor bert.encoder.layer.1.output.dense.weight of",
                        "model.safetensors holds 256 of 16384 values", "NaN or inf", "download the model folder again"),
                       {}),
    "hf_config_string_size": (["--init-from-hf", "{hf}", "--max-position-embeddings", "512"],
                              {"hf_config": {"num_hidden_layers": "2"}},
                              ('num_hidden_layers = "2" in the Hugging Face config.json is not an integer',), {}),
    # ---- the launch environment
    "launch_partial_environment": ([], {}, ("RANK is set but WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not",
                                            "deepspeed --num_gpus N pretrain_bert.py"), {**NO_LAUNCHER, "RANK": "0"}),
    "launch_srun_tasks_without_launcher": ([], {}, ("started as one of 4 srun tasks without the env:// variables",
                                                    "each would train alone", "deepspeed --num_gpus N"),
                                           {**NO_LAUNCHER, "SLURM_STEP_NUM_TASKS": "4"}),
    "launch_two_srun_tasks_without_launcher": ([], {}, ("started as one of 2 srun tasks without the env:// variables",),
                                               {**NO_LAUNCHER, "SLURM_STEP_NUM_TASKS": "2"}),
    "launch_without_the_rendezvous_address": ([], {}, (
        "RANK, WORLD_SIZE, LOCAL_RANK are set but MASTER_ADDR, MASTER_PORT are not: a partial launcher environment",
        "or unset RANK, WORLD_SIZE, LOCAL_RANK to run one process"),
        {**NO_LAUNCHER, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}),
    "launch_mpi_without_mpi4py": ([], {}, ("started by an MPI launcher (OMPI_COMM_WORLD_SIZE is set)",
                                           "pip install mpi4py"), {**NO_LAUNCHER, "OMPI_COMM_WORLD_SIZE": "2"}),
    # ---- a preset or flag that contradicts the --init-from-hf folder (more in test_config.py)
    "hf_preset_contradicts_the_folder": (
        ["--init-from-hf", "{hf}", "--max-position-embeddings", "512", "--model-preset", "modernbert-base"], {},
        ("--model-preset modernbert-base (ffn_hidden_size 96) contradicts the --init-from-hf folder",
         "drop --model-preset modernbert-base"), {}),
    **{f"hf_bert_folder_{field}": (["--init-from-hf", "{hf}", "--max-position-embeddings", "512", *flag], {}, (
        f"{' '.join(flag)} contradicts the --init-from-hf folder", f"whose model has {field} {value}",
        f"drop {' '.join(flag)}"), {}) for flag, field, value in (
            (["--position-embedding-type", "rope"], "position_embedding_type", "learned"),
            (["--normalization", "RMSNorm"], "normalization", "LayerNorm"),
            (["--disable-bias-linear"], "add_bias_linear", True), (["--mlp-type", "geglu"], "mlp_type", "gelu"),
            (["--no-first-layer-attention-norm"], "first_layer_attention_norm", True))},
    # ---- a requeue (--init-from-hf X --load S) of another run than the one S holds
    **{f"requeue_of_a_run_from_{name}": (["--init-from-hf", "{hf}", "--load", "{tmp}"], {
        "latest": "iter_0000001", "iter_0000001/mp_rank_00_model_states.pt": "",
        "iter_0000001/run_state.json": json.dumps({"config": {"model": {}}, "iteration": 1, "consumed_samples": 2,
                                                   "weights_from": record})}, phrases, {})
       for name, record, phrases in (
           ("another_folder", {"from": "/elsewhere/bert", "kind": "hf", "sha256": "0" * 64}, (
               "holds a run that started from --init-from-hf /elsewhere/bert, not from --init-from-hf",
               "requeue it with --init-from-hf /elsewhere/bert, or pass another --load and --save to start from")),
           ("scratch", {"from": None}, ("holds a run that started from scratch, not from --init-from-hf",
                                        "resume it with --load", "alone, or pass another --load and --save")),
           ("a_checkpoint", {"from": "/elsewhere/w", "kind": "checkpoint", "sha256": "0" * 64}, (
               "holds a run that started from --load /elsewhere/w, not from --init-from-hf",
               "requeue it with --load /elsewhere/w --save ", " in place of --init-from-hf ", ", --load and --save, or "
               "pass another --load and --save to start from")),
           ("a_bad_record", "elsewhere", ('holds "elsewhere" as weights_from, not the record of the weights',
                                          'delete its "weights_from" entry')))},
    # a --load that this run does not save into is a typo (an unmounted disk), not a job's first run
    "requeue_from_a_load_without_checkpoint": (["--init-from-hf", "{hf}", "--load", "{tmp}/typo", "--save",
                                                "{tmp}/save"], {}, ("no checkpoint in", "typo"), {}),
    "requeue_with_an_empty_latest": (["--init-from-hf", "{hf}", "--load", "{tmp}"], {"latest": ""}, (
        "the 'latest' file of", "is empty: it names no checkpoint"), {}),
    "finetune_with_init_from_hf": (["--init-from-hf", "{hf}", "--load", "{tmp}", "--finetune"], {}, (
        "--finetune is given with --init-from-hf", "drop --finetune"), {}),
    # ---- a folder given with the other kind's flag, and checkpoints written into the Hugging Face folder
    "init_from_hf_of_a_checkpoint": (["--init-from-hf", "{tmp}/ck"], {"ck/latest": "iter_0000001"}, (
        "/ck is a checkpoint of this trainer, not a Hugging Face model folder", "/ck with --load (a weights-only "
        "one"), {}),
    "init_from_hf_of_one_checkpoint": (["--init-from-hf", "{tmp}/iter_0000001"], {
        "latest": "iter_0000001", "iter_0000001/run_state.json": "{}"}, (
        "/iter_0000001 is a checkpoint of this trainer", "with --load (a weights-only"), {}),
    "load_of_an_hf_folder": (["--load", "{hf}"], {}, (
        "/hf is a Hugging Face model folder, not a checkpoint of this trainer (it has no 'latest')",
        "pass it to pretrain_bert.py with --init-from-hf in place of --load, or convert it first"), {}),
    # a run's --log-dir (its config.json is the resolved config, not a Hugging Face model's)
    **{f"{flag[2:].replace('-', '_')}_of_a_log_dir{name}": ([flag, "{tmp}/log"], files, (
        "/log is the --log-dir of a run of this trainer (metrics.jsonl, config.json), not its checkpoint",
        f"pass the run's --save folder{named} with --load"), {})
       for flag in ("--load", "--init-from-hf") for name, files, named in (
           ("", {"log/config.json": json.dumps({"ds_config": {}, "model": {}, "micro_batch_size": 2})}, ""),
           ("_naming_its_save", {"log/metrics.jsonl": json.dumps({"kind": "start", "save": "/runs/ck"}) + "\n"},
            " (/runs/ck)"))},
    **{f"save_{name}_the_hf_folder": (["--init-from-hf", "{hf}", "--save", save], {}, (
        f"is {where} --init-from-hf folder: the checkpoint would be written into the Hugging Face model folder",
        "choose another --save"), {}) for name, where, save in (("as", "the", "{hf}"), ("inside", "inside the",
                                                                                       "{hf}/run"))},
    # a --save inside the --load checkpoint folder: its resumes and --keep-last remove iter_* folders
    "save_inside_the_load_folder": (["--load", "{tmp}/ck", "--finetune", "--save", "{tmp}/ck/iter_0000002/ft"], {}, (
        "/ck/iter_0000002/ft is inside the checkpoint folder --load ", "/ck (resumes and --keep-last there remove",
        "; choose a --save outside "), {}),
    # ---- one rule per number, whatever its value breaks
    # numbers that reached torch after the index maps were built (config.check_model_numbers)
    "init_method_std_negative": (["--init-method-std", "-1"], {}, ("init_method_std = -1.0 is not a finite number > 0",
                                                                    "pass --init-method-std above 0, e.g. 0.02"), {}),
    "layernorm_epsilon_zero": (["--layernorm-epsilon", "0"], {}, ("layernorm_epsilon = 0.0 is not a finite number > 0",
                                                                  "pass --layernorm-epsilon above 0"), {}),
    **{f"rotary_base_{name}": (["--position-embedding-type", "rope", "--rotary-base", value], {}, (
        f"rotary_base = {float(value)} is not a finite number > 1", "pass --rotary-base above 1"), {})
       for name, value in (("zero", "0"), ("half", "0.5"))},
    # a theta float32 cannot hold: inf in bert.rotary_cos_sin, and every pair but the first without a position
    **{f"{flag[2:].replace('-', '_')}_overflows_float32": (
        ["--position-embedding-type", "rope", "--local-attention-window", "16", "--global-attention-every", "2", flag,
         "1e300"], {}, (f"{flag[2:].replace('-', '_')} = 1e+300 overflows float32",
                        f"pass {flag} between 1 and 3.4e+38"), {})
       for flag in ("--rotary-base", "--local-rotary-base")},
    # a setting's fix names the flag the user gave, not the config field
    "ffn_hidden_size_zero": (["--ffn-hidden-size", "0"], {}, ("ffn_hidden_size = 0 must be positive",
                                                              "set --ffn-hidden-size to an integer >= 1"), {}),
    # both of two opposite flags: the last won silently (as --swiglu with --mlp-type geglu is refused)
    **{f"opposite_flags_{on[2:].replace('-', '_')}": ([off, on], {}, (f"{off} and {on} contradict each other",
                                                                      "pass one of them"), {})
       for on, off in (("--add-bias-linear", "--disable-bias-linear"),
                       ("--embedding-layernorm", "--no-embedding-layernorm"),
                       ("--first-layer-attention-norm", "--no-first-layer-attention-norm"),
                       ("--pack-samples", "--no-pack-samples"))},
    # ---- a flag's mistake is named as the flag's, not the JSON section's
    "attention_dropout_with_local_layers": (["--position-embedding-type", "rope", "--local-attention-window", "16",
                                             "--global-attention-every", "2", "--attention-dropout", "0.1"], {},
                                            ("error: attention_dropout 0.1 is not supported with local layers",
                                             "set --attention-dropout 0"), {}),
}
SKIPPED = {"launch_mpi_without_mpi4py": "mpi4py is installed" if importlib.util.find_spec("mpi4py") else None,
           "json_fp16_on_a_cpu_without_fp16": lambda: "this device runs fp16" if fp16_supported() else None}


def fp16_supported() -> bool:
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().is_fp16_supported()


@pytest.mark.parametrize("mistake", CONFIG_MISTAKES)
def test_config_mistake_is_one_line_before_the_rendezvous(mistake, tmp_path, monkeypatch, capsys, assets):
    import megatron.training as training

    skipped = SKIPPED.get(mistake)
    if skipped := (skipped() if callable(skipped) else skipped):
        pytest.skip(skipped)
    argv, files, phrases, env = CONFIG_MISTAKES[mistake]
    if mistake == "json_nvme_offload_without_async_io":  # as on a machine without libaio, wherever the test runs
        from deepspeed.git_version_info import installed_ops
        from deepspeed.ops.op_builder import AsyncIOBuilder

        monkeypatch.setattr(AsyncIOBuilder, "is_compatible", lambda self, verbose=False: False)
        monkeypatch.setitem(installed_ops, "async_io", False)
    if mistake.endswith("_without_quantizer_op"):  # as on DeepSpeed's CPU accelerator, wherever the test runs
        from deepspeed.accelerator import get_accelerator
        from deepspeed.ops.op_builder.cpu import NotImplementedBuilder

        accelerator, create = get_accelerator(), get_accelerator().create_op_builder
        monkeypatch.setattr(accelerator, "create_op_builder", lambda name: NotImplementedBuilder()
                            if name == "QuantizerBuilder" else create(name))
    launcher = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for name, value in {**launcher, **env}.items():
        monkeypatch.setenv(name, "")  # recorded: restored (or removed) after the test
        if value is None:
            monkeypatch.delenv(name)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.setattr(training.device, "select_device", lambda: pytest.fail("accepted up to the rendezvous"))
    files = dict(files)
    hf_config, nan = files.pop("hf_config", None), files.pop("hf_nan", ())
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    hf = hf_folder(tmp_path, assets, without=(MISSING_KEY,) if mistake == "hf_missing_encoder_tensor" else (),
                   config_changes=hf_config, nan=nan) if "{hf}" in argv else None
    placeholders = {"tmp": str(tmp_path), "hf": str(hf), "data": "/nonexistent/data", "vocab": "/nonexistent/vocab.txt"}
    before = snapshot(tmp_path)
    capsys.readouterr()
    code = training.main([part.format(**placeholders) for part in [*PRETRAIN, *argv]])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("pretrain_bert.py: error: "), lines
    assert all(phrase in lines[0] for phrase in phrases), lines
    assert snapshot(tmp_path) == before


def test_a_cpu_run_refuses_deepspeeds_cuda_only_optimizers(monkeypatch):
    """Lamb and Lion are DeepSpeed's CUDA kernels ("not implemented on CPU backend" inside deepspeed.initialize);
    muP's optimizers need the mup package."""
    import torch

    from megatron.ds_schema import default_optimizer
    from megatron.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name, kernel in (("Lamb", "FusedLamb"), ("Lion", "FusedLion")):
        with pytest.raises(ConfigError, match=f"optimizer.type {name} is DeepSpeed's {kernel}, a CUDA kernel"):
            default_optimizer({"optimizer": {"type": name}}, cuda=False)
        default_optimizer({"optimizer": {"type": name}}, cuda=True)
    lion_offloaded = {"optimizer": {"type": "Lion"}, "zero_optimization": {"offload_optimizer": {"device": "cpu"}}}
    assert default_optimizer(lion_offloaded, cuda=False)["lr"] == 1e-4  # DeepSpeedCPULion
    if importlib.util.find_spec("mup") is None:
        with pytest.raises(ConfigError, match="optimizer.type MuAdam comes from the mup package, which is not"):
            default_optimizer({"optimizer": {"type": "MuAdam"}}, cuda=False)


# the tools that import torch (and through megatron.checkpoint or the model, DeepSpeed)
TOOLS = ("convert_checkpoint.py", "fill_mask.py", "plot_run.py", "preprocess_data.py", "build_vocab.py",
         "clean_index_maps.py", "make_sample_corpus.py")


def test_tools_print_nothing_of_deepspeeds_accelerator_detection():
    """DeepSpeed logs "Setting accelerator to CPU ... we were unable to detect it" on every import without
    CUDA; the tools name the accelerator first (megatron.quiet), as pretrain_bert.py does."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("DS_ACCELERATOR", None)

    def run(tool: str) -> subprocess.CompletedProcess:
        return subprocess.run([PYTHON, str(ROOT / "tools" / tool), "--help"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)

    with ThreadPoolExecutor(2) as pool:
        for tool, result in zip(TOOLS, pool.map(run, TOOLS)):
            assert result.returncode == 0, (tool, result.stderr[-2000:])
            assert "accelerator" not in (result.stdout + result.stderr).lower(), (tool, result.stderr[-2000:])


def test_the_shm_op_load_prints_nothing_but_its_failures(capfd):
    """DeepSpeed's CPU comm op printed `DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully`
    once per rank on every start (the op loaded from the extensions folder); that line alone goes,
    the comm module's other prints stay."""
    import importlib

    from megatron.quiet import quiet_shm_build

    quiet_shm_build()
    comm_torch = importlib.import_module("deepspeed.comm.torch")
    comm_torch.build_shm_op()
    getattr(comm_torch, "print", print)("DeepSpeed other news")  # the module's print, as its code calls it
    out = capfd.readouterr().out
    assert "built successfully" not in out and out.splitlines()[-1:] == ["DeepSpeed other news"], out


def test_a_cpu_tool_runs_under_ds_accelerator_cuda(monkeypatch):
    """fill_mask.py and convert_checkpoint.py read weights on the CPU: DS_ACCELERATOR=cuda from a GPU cluster's
    profile loads DeepSpeed fine and is no reason to refuse them; the trainer (and extend_context.py's launch),
    which would bind a GPU, refuse it."""
    import torch

    from megatron.errors import ConfigError
    from megatron.quiet import refuse_missing_accelerator

    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    refuse_missing_accelerator(on_the_device=False)
    with pytest.raises(ConfigError, match="DS_ACCELERATOR=cuda names a device this machine lacks"):
        refuse_missing_accelerator(on_the_device=True)


def test_a_rendezvous_port_in_use_is_named_with_its_fix(monkeypatch):
    """Rank 0's store cannot listen on a port another run holds: torch's message was cut before its
    cause and the fix pointed at the address and the timeout, not at the port."""
    import socket

    from megatron.errors import ConfigError
    from megatron.parallel import device

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port))):
            monkeypatch.setenv(name, value)
        with pytest.raises(ConfigError) as error:
            device.rendezvous("gloo", 5)
    assert error.value.problem.startswith(f"rank 0 cannot host the rendezvous at 127.0.0.1:{port}: the port is in use")
    assert error.value.fix.startswith("pass a free port: the launcher's --master_port")


@pytest.mark.parametrize("rank,local_rank,host,expected", [
    ("0", "0", "127.0.0.1", "rank 0 cannot host the rendezvous at 127.0.0.1:{port}: the port is in use on"),
    ("2", "0", "no-such-host-xyz.invalid", "MASTER_ADDR no-such-host-xyz.invalid does not resolve ("),
    ("3", "1", "no-such-host-xyz.invalid", None),  # the node's first rank says it; this one waits, exits 2
], ids=["port_in_use", "name_unknown", "name_unknown_second_rank"])
def test_the_rendezvous_address_is_checked_before_the_imports(rank, local_rank, host, expected):
    """A MASTER_ADDR that does not resolve (torch retried it for --rendezvous-timeout, 300 s, with C++
    stacks) and, on rank 0, a MASTER_PORT another run listens on (named after 40 s of imports on a
    loaded machine) are one line before anything else: before the flags are parsed."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {**os.environ, "RANK": rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": "4", "MASTER_ADDR": host,
               "MASTER_PORT": str(port)}
        result = subprocess.run([PYTHON, str(ROOT / "pretrain_bert.py"), "--no-such-flag"], env=env,
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    if expected is None:
        assert lines == []
    else:
        assert len(lines) == 1 and expected.format(port=port) in lines[0], result.stderr[-2000:]


def test_only_rank_0_probes_the_port_and_not_under_torchruns_agent(monkeypatch):
    """Rank 0 alone listens on MASTER_PORT; torchrun's agent hosts the store on it itself."""
    import socket

    from megatron.parallel import master_address

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        for name, value in (("RANK", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(busy.getsockname()[1]))):
            monkeypatch.setenv(name, value)
        master_address.check()
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
        master_address.check()
        monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE")
        assert master_address.port_in_use(busy.getsockname()[1])


@pytest.mark.parametrize("rank,port,problem,fix", [
    ("1", "70000", "MASTER_PORT 70000 is not a TCP port the ranks can meet at, 1-65535", "pass a free port: the "
     "launcher's --master_port"),  # bind()'s OverflowError traceback
    ("0", "0", "MASTER_PORT 0 is not a TCP port the ranks can meet at, 1-65535 (0 lets the system pick", "pass a free "
     "port: the launcher's --master_port"),  # rank 0 listened on a port no rank knew: the whole --rendezvous-timeout
    ("0", "29x", "MASTER_PORT '29x' is not a TCP port", "pass a free port"),
    (None, "70000", "MASTER_PORT 70000 is not a TCP port", "unset MASTER_PORT, left in the environment"),  # no launcher
    (None, "0", None, None),  # one process meets only itself: port 0 works
], ids=["above_65535", "zero_in_a_launch", "not_a_number", "stale_without_launcher", "zero_without_launcher"])
def test_a_master_port_outside_1_65535_is_one_line_before_the_imports(monkeypatch, rank, port, problem, fix):
    """deepspeed --master_port 70000 was bind()'s OverflowError traceback in every rank; --master_port 0 a wait
    of the whole --rendezvous-timeout, then advice to raise it."""
    from megatron.errors import ConfigError
    from megatron.parallel import master_address

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(name, raising=False)
    if rank is not None:
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", port)
    if problem is None:
        master_address.check()
        return
    with pytest.raises(ConfigError) as error:
        master_address.check()
    assert error.value.problem.startswith(problem) and error.value.fix.startswith(fix)


@pytest.mark.parametrize("launched", [False, True, "bert_distributed.sh"],
                         ids=["environment_only", "under_a_launcher", "by_a_launch_script"])
def test_a_rendezvous_timeout_without_a_launcher_names_the_environment(monkeypatch, launched):
    """`python pretrain_bert.py` in a shell that kept an old job's RANK, WORLD_SIZE=2, MASTER_*: after the
    whole --rendezvous-timeout it said to start every rank with each node's launcher, though none was used.
    A launch script's run named the launcher's --master_addr and --master_port, which the script refuses: its user
    sets MASTER_ADDR and MASTER_PORT."""
    from megatron.errors import ConfigError
    from megatron.parallel import device, launcher_watch
    from megatron.parallel.spawn import free_port

    monkeypatch.setattr(launcher_watch, "launcher_processes", lambda: [(1, None, "its launcher")] if launched else [])
    monkeypatch.delenv("MEGATRON_LAUNCH_SCRIPT", raising=False)
    if isinstance(launched, str):
        monkeypatch.setenv("MEGATRON_LAUNCH_SCRIPT", launched)
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(free_port()))):
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as error:
        device.rendezvous("gloo", 1)
    assert error.value.problem.endswith("timed out after 1 s: 1 of 2 ranks arrived (rank 1 missing); the missing "
                                        "ranks may have stopped at start-up on their node (their own error line "
                                        "there) or their launcher ended: look at that node's output first")
    note = ("no launcher started this process: if RANK, WORLD_SIZE=2, MASTER_ADDR and MASTER_PORT are left in the "
            "environment by another job, unset them to run one process")
    assert (note in error.value.fix) is not bool(launched)
    same = ("MASTER_ADDR and MASTER_PORT in the environment of bert_distributed.sh" if isinstance(launched, str) else
            "the launcher's --master_addr and --master_port")
    assert error.value.fix.startswith(f"start every rank of the 2 ({same} the same on every node), "), error.value.fix


def test_a_rank_refused_before_the_rendezvous_ends_the_waiting_ranks_at_once(monkeypatch):
    """A node whose flags were refused at start-up (or whose rank stopped before its rendezvous) left the other
    nodes' ranks waiting out the whole --rendezvous-timeout, to end with a line that blamed the rendezvous: the
    refusing rank posts its line to rank 0's store (post_refusal, from report_once and the parser), and rank 0's
    verdict ends every rank that arrived at once with a line naming that rank and its error."""
    import socket
    import threading
    import time

    from megatron.parallel import device, launcher_watch

    monkeypatch.setattr(launcher_watch, "launcher_processes", lambda: [(1, None, "its launcher")])
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(free_port()))):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(device, "_rendezvous_begun", [False])
    monkeypatch.setattr(device, "launcher_rank", lambda: 1)  # the refusing rank's view (rank 0 reads RANK)
    waiting, listening = threading.Event(), device._listening
    monkeypatch.setattr(device, "_listening", lambda *args: waiting.set() or listening(*args))
    posted = []
    refusing = threading.Thread(target=lambda: posted.append(device.post_refusal(
        "pretrain_bert.py: error: --hidden-size 63 is odd; pass an even one", time.monotonic() + 10)))
    refusing.start()
    assert waiting.wait(10)  # it looks for rank 0's store before rank 0 starts it (its rendezvous, below)
    began = time.monotonic()
    with pytest.raises(ConfigError) as error:
        device.rendezvous("gloo", 60)
    refusing.join()
    assert posted == [True] and time.monotonic() - began < 30, "waited out --rendezvous-timeout"
    assert error.value.problem == (f"rank 1 on {socket.gethostname()} stopped at start-up, before the rendezvous, "
                                   "with its own error (--hidden-size 63 is odd; pass an even one), so the rendezvous "
                                   f"at 127.0.0.1:{os.environ['MASTER_PORT']} cannot complete (1 of 2 ranks arrived)")
    assert device.post_refusal("its error", time.monotonic() + 1) is False, "its rendezvous' own errors are not posted"


@pytest.mark.parametrize("rank_0", ["refused", "died", "began"])
def test_rank_0s_node_stopped_before_the_rendezvous_ends_the_other_nodes_at_once(monkeypatch, capsys, tmp_path,
                                                                                 rank_0):
    """Rank 0's node stopped before rank 0 opened its store (its flags refused there alone, an import that died, its
    launch.py that failed): the other nodes' ranks waited out --rendezvous-timeout at MASTER_ADDR:MASTER_PORT, where
    nothing listened, to end with a line that blamed the rendezvous. That node's launch.py (deepspeed_command.py)
    answers there with why, and they stop at once. A rank 0 that began its rendezvous told them itself: no answer."""
    import base64
    import threading
    import time

    from megatron import arguments
    from megatron.parallel import deepspeed_command, device, launch_env, launcher_watch
    from megatron.parallel.launch_env import RANK_0_STATE

    monkeypatch.setattr(launcher_watch, "launcher_processes", lambda: [(1, None, "its launcher")])
    port = free_port()
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port))):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(RANK_0_STATE, str(tmp_path / "state"))  # rank 0's parser notes its line for its launch.py
    (tmp_path / "state").write_text("")
    with pytest.raises(SystemExit):
        arguments.build_parser().parse_args(["--hidden-size", "x"])
    refused = (tmp_path / "state").read_text()
    assert refused.startswith("pretrain_bert.py: error: argument --hidden-size: invalid int value")

    def rank_0_node(launch, stops):  # launch.py on node 0 and its rank 0, whose state file it set
        if rank_0 == "died":
            raise ImportError("its torch is broken")
        with open(os.environ[RANK_0_STATE], "w") as state:
            state.write(refused if rank_0 == "refused" else "rendezvous begun")
        return lambda: sys.exit(2)

    monkeypatch.setattr(deepspeed_command, "_deepspeed_main", rank_0_node)
    world = base64.urlsafe_b64encode(json.dumps({"node-a": [0], "node-b": [0]}).encode()).decode()
    monkeypatch.setattr(sys, "argv", ["deepspeed_command.py", "deepspeed.launcher.launch", f"--world_info={world}",
                                      "--node_rank=0", "--master_addr=127.0.0.1", f"--master_port={port}", "x.py"])
    monkeypatch.setattr(deepspeed_command, "NOTICE_SECONDS", 20.0)
    monkeypatch.setattr(launch_env, "QUIET_SECONDS", 0.0)  # its line at once, before rank 1 connects
    statuses = []
    node_0 = threading.Thread(target=lambda: statuses.append(deepspeed_command.main()))
    node_0.start()
    monkeypatch.setenv("RANK", "1")  # a rank of node-b, at rank 0's rendezvous
    monkeypatch.setattr(device, "_rendezvous_begun", [False])
    began = time.monotonic()
    with pytest.raises(ConfigError) as error:
        device.rendezvous("gloo", 8 if rank_0 != "began" else 1)
    node_0.join()
    assert statuses == [2 if rank_0 != "died" else 1]
    if rank_0 == "began":
        assert "timed out" in str(error.value) or "could not reach" in str(error.value)
        assert "waiting at port" not in capsys.readouterr().err  # rank 0 told them itself: no wait
        return
    assert time.monotonic() - began < 6, "waited out --rendezvous-timeout"
    why = ("rank 0 on {host} stopped at start-up with its own error (argument --hidden-size: invalid int value: 'x'; "
           "see pretrain_bert.py --help)" if rank_0 == "refused" else "its launch on {host} ended (status 1) before "
           "rank 0 began it, e.g. a failed import; its traceback or line is in that node's output")
    assert error.value.problem == (f"rank 0's node (127.0.0.1:{port}) stopped before the rendezvous: "
                                   + why.format(host=socket.gethostname()))
    err = capsys.readouterr().err
    assert ("ImportError: its torch is broken" in err) is (rank_0 == "died")
    # node 0's wait is said, not a silent 30 s after its own error
    assert err.endswith(f"deepspeed: rank 0's node stopped before the rendezvous: waiting at port {port} for up to "
                        "20 s to tell the 1 rank of the other nodes not connected yet why; Ctrl-C ends the wait\n"), err


def test_rank_0s_node_says_its_wait_only_when_ranks_are_still_to_come(monkeypatch):
    """serve_stop_notice calls `waiting` once the others have not all connected within QUIET_SECONDS; a rank already
    waiting, which connects at once, is answered with nothing said."""
    import threading
    import time

    from megatron.parallel import launch_env

    port, said, calls = free_port(), [], []

    def waiting_rank():  # polls as a joining rank does, until node 0 listens
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as peer:
                    said.append(peer.makefile("rb").readline())
                    return
            except OSError:
                time.sleep(0.02)

    rank = threading.Thread(target=waiting_rank)
    rank.start()
    assert launch_env.serve_stop_notice(port, "why", 1, 10.0, lambda *left: calls.append(left)) == 1
    rank.join()
    assert said == [launch_env.STOP_NOTICE + b"why\n"] and calls == []
    monkeypatch.setattr(launch_env, "QUIET_SECONDS", 0.1)
    assert launch_env.serve_stop_notice(free_port(), "why", 1, 0.3, lambda *left: calls.append(left)) == 0
    assert len(calls) == 1 and 0.1 < calls[0][0] <= 0.2 and calls[0][1] == 1


def test_a_rank_stops_when_the_program_at_master_port_is_no_store(monkeypatch):
    """Another program held MASTER_PORT on rank 0's node (rank 0 stopped there with its own line): the other nodes'
    ranks connected to it, and TCPStore's handshake waited for its answer without end (11 minutes seen)."""
    import socket

    from megatron.parallel import device

    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, says nothing
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        for name, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"),
                            ("MASTER_PORT", str(silent.getsockname()[1]))):
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(device, "JOIN_WAIT", 1.0)
        with pytest.raises(ConfigError) as error:
            device.rendezvous("gloo", 60)
    assert error.value.problem == (f"rank 1 could not join the rendezvous at {address}: the program listening there "
                                   "accepted its connection but did not answer as rank 0's store within 1 s: another "
                                   "program holds MASTER_PORT on rank 0's node, whose rank 0 then stopped with its "
                                   "own line there")


@pytest.mark.parametrize("rank, local_rank", [("1", "1"), ("2", "0")], ids=["other_rank", "other_nodes_first"])
def test_a_rank_whose_flags_are_refused_posts_its_line(monkeypatch, capsys, rank, local_rank):
    """A rank other than rank 0 prints no parser error (rank 0 does, for every rank alike), nor an error of its
    imports (a DS_ACCELERATOR its node lacks), nor a start-up error before the process group; on a node launched
    otherwise than rank 0's, that line goes to rank 0's store instead, which ends the ranks waiting there. The
    first rank of another node prints it once too (it printed nothing: that node's output did not say why its
    ranks stopped, where they alone refused, such as a path missing there)."""
    from megatron import arguments, errors
    from megatron.parallel import device, peers

    posted = []
    monkeypatch.setattr(device, "post_refusal", lambda line, until: posted.append(line))
    # WORLD_SIZE 1: no wait for rank 0 to print
    for name, value in (("RANK", rank), ("LOCAL_RANK", local_rank), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit):
        arguments.build_parser().parse_args(["--linformer-kk", "16"])
    with pytest.raises(SystemExit):
        with errors.start_up_stops_in_one_line("pretrain_bert.py", tell=False):
            raise ConfigError("DS_ACCELERATOR=xpu names a device this machine lacks", "unset DS_ACCELERATOR")
    lines = ["pretrain_bert.py: error: unrecognized arguments: --linformer-kk 16; see pretrain_bert.py --help",
             "pretrain_bert.py: error: DS_ACCELERATOR=xpu names a device this machine lacks; unset DS_ACCELERATOR"]
    if local_rank == "0":  # a start-up error before the process group (another rank prints it after a wait)
        peers.report_once("pretrain_bert.py: error: --data-path x is missing; fix it")
        lines.append("pretrain_bert.py: error: --data-path x is missing; fix it")
    assert posted == lines
    assert capsys.readouterr().err.splitlines() == (lines if local_rank == "0" else [])


def test_rank_0_repeats_the_line_another_node_printed(monkeypatch, capsys):
    """After the rendezvous the first rank to report prints the run's line (report_once): a --data-path missing on
    node-b alone was printed there only, and rank 0's node, in a launch per node, ended with exit code 2 and no word.
    Rank 0 repeats it, named by that rank and host; a line printed on its own host is not repeated."""
    import json
    import socket

    import torch.distributed as dist

    from megatron.parallel import peers

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    store = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    store = dist.distributed_c10d._get_default_store()  # the group's keys, as report_once reads them
    try:
        for host, repeated in (("node-b", "pretrain_bert.py: error: rank 1 on node-b: dataset file /d.idx does not "
                                          "exist; check --data-path\n"), (socket.gethostname(), "")):
            store.set("megatron/errors_reported", "1")  # rank 1 reported first, and printed
            store.set(peers.PRINTED_BY, json.dumps([1, host, "pretrain_bert.py: error: dataset file /d.idx does not "
                                                              "exist; check --data-path"]))
            store.set("megatron/error_printed", "1")
            peers.report_once("pretrain_bert.py: error: another rank ended during start-up")
            assert capsys.readouterr().err == repeated
    finally:
        dist.destroy_process_group()


def test_a_launch_script_checks_its_port_and_names_its_rendezvous_variables(monkeypatch):
    """Under a launch script (MEGATRON_LAUNCH_SCRIPT) a busy MASTER_PORT was rank 0's line half a minute after the
    launch, and it and an unknown MASTER_ADDR named the launcher's flags; the script checks the port on the node
    that hosts rank 0 before its launch (check_script_launch; '' elsewhere and in a dry run)."""
    import socket

    from megatron.errors import ConfigError
    from megatron.parallel import launch_check, master_address

    monkeypatch.setenv("MEGATRON_LAUNCH_SCRIPT", "bert_distributed.sh")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        launch_check.check_script_launch(1, 2, 1, 2, "")
        with pytest.raises(ConfigError) as error:
            launch_check.check_script_launch(1, 2, 1, 2, f"127.0.0.1:{port}")
    assert str(error.value) == (f"rank 0 cannot host the rendezvous at 127.0.0.1:{port}: the port is in use on "
                                f"{socket.gethostname()} (another run?); set MASTER_PORT in the environment of "
                                "bert_distributed.sh to a free port")
    assert master_address.address_fix() == ("set MASTER_ADDR in the environment of bert_distributed.sh to the address "
                                            "of the node with rank 0")


def test_ranks_that_came_to_a_failed_rendezvous_print_one_line_each():
    """2 of 3 ranks arrive: rank 0 gives up and its store goes with it. Rank 1 read its verdict while the
    store could still answer (it printed torch's C++ frames, 'recvVector failed', when the store closed
    under its read, or 'timed out' when its read began before rank 0's clock ran out)."""
    from megatron.parallel.spawn import free_port

    code = ("import sys\nfrom megatron.errors import ConfigError\nfrom megatron.parallel import device\n"
            "try:\n    device.rendezvous('gloo', 2.0)\nexcept ConfigError as error:\n"
            "    print(f'error: {error}', file=sys.stderr)\n    sys.exit(2)\n")
    env = {**os.environ, "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "DS_ACCELERATOR": "cpu"}
    ranks = [subprocess.Popen([PYTHON, "-c", code], env={**env, "RANK": str(rank)}, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    for rank in ranks:
        assert rank.wait(timeout=120) == 2
    for rank in ranks:
        lines = rank.stderr.read().strip().splitlines()
        assert len(lines) == 1 and "timed out after 2 s: 2 of 3 ranks arrived" in lines[0], lines


def test_an_error_line_is_one_write(monkeypatch):
    """print() writes the newline apart: another rank's output could land between them, glued to the line."""
    import io

    from megatron.parallel import peers

    writes = []
    stream = io.StringIO()
    monkeypatch.setattr(stream, "write", lambda text: writes.append(text) or len(text))
    monkeypatch.setattr(sys, "stderr", stream)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    peers.report_once("pretrain_bert.py: error: a mistake; fix it")
    assert writes == ["pretrain_bert.py: error: a mistake; fix it\n"]


def test_a_rendezvous_address_that_does_not_answer_is_one_line_without_c10d_frames():
    """Rank 0 with a MASTER_ADDR of another host (a stale cluster profile) under a launcher environment:
    the trainer's one line came after c10d's retry warnings and some 30 C++ `frame #N` lines per try."""
    code = ("import sys\nfrom megatron.quiet import quiet_deepspeed\nquiet_deepspeed()\n"
            "from megatron.errors import ConfigError\nfrom megatron.parallel import device\n"
            "try:\n    device.rendezvous('gloo', 3.0)\nexcept ConfigError as error:\n"
            "    print(f'error: {error}', file=sys.stderr)\n    sys.exit(2)\n")
    env = {name: value for name, value in os.environ.items() if name != "TORCH_CPP_LOG_LEVEL"}
    env.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="192.0.2.1", MASTER_PORT=str(free_port()))
    result = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert "could not join the rendezvous at 192.0.2.1" in lines[0]


def test_c10d_errors_after_the_rendezvous_reach_the_user():
    """The rendezvous alone is quiet: TORCH_CPP_LOG_LEVEL=FATAL at start-up hid every C++ log line of the run,
    NCCL's watchdog timeouts and failed collectives among them (LOG(ERROR) in ProcessGroupNCCL.cpp). Two real
    ranks over gloo, started as the trainer starts: rank 0's monitored barrier times out on rank 1, which gloo
    logs at ERROR as NCCL's watchdog does: shown; then rank 0 ends and rank 1's next store call fails, which c10d
    logs at WARNING with ~30 stack frames: hidden, as before (the trainer says a rank has gone in one line).
    NCCL itself cannot run here: its lines are seen only through their level."""
    code = ("import os, time\nfrom datetime import timedelta\nfrom megatron.quiet import quiet_deepspeed\n"
            "quiet_deepspeed()\nimport torch.distributed as dist\nfrom megatron.parallel import device\n"
            "device.rendezvous('gloo', 60.0)\nif dist.get_rank() == 0:\n"
            "    try:\n        dist.monitored_barrier(timeout=timedelta(seconds=1))\n"
            "    except RuntimeError:\n        os._exit(3)\n"
            "store = dist.distributed_c10d._get_default_store()\nfor _ in range(300):\n"
            "    try:\n        store.add('beat', 0)\n    except RuntimeError:\n        os._exit(4)\n"
            "    time.sleep(0.2)\n")
    env = {name: value for name, value in os.environ.items() if name != "TORCH_CPP_LOG_LEVEL"}
    env.update(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), DS_ACCELERATOR="cpu")
    ranks = [subprocess.Popen([PYTHON, "-c", code], env={**env, "RANK": str(rank)}, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    codes = [rank.wait(timeout=120) for rank in ranks]
    [rank_0, rank_1] = [rank.stderr.read() for rank in ranks]
    assert codes == [3, 4], (rank_0[-2000:], rank_1[-2000:])
    assert re.search(r"\[E\S* \S+ ProcessGroupGloo\.cpp:\d+\] .*Rank 1 failed to pass monitoredBarrier", rank_0), rank_0
    assert not re.search(r"\[W\S* \S+ TCPStore\.cpp:\d+\]|frame #", rank_1), rank_1


def test_c10d_log_is_quieted_for_the_rendezvous_alone_unless_asked(monkeypatch):
    """c10's C++ log level is FATAL in the window and torch's again after it; --debug, or a TORCH_CPP_LOG_LEVEL
    the user set, keeps torch's in it too (that the variable is the one torch reads, the tests above show)."""
    from megatron.quiet import c10_log_level, c10d_log_quieted

    level = c10_log_level()
    assert level is not None, "torch's libc10 no longer exports FLAGS_caffe2_log_level: the rendezvous is not quiet"
    monkeypatch.setattr(sys, "argv", ["pretrain_bert.py"])
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    before = level.value
    with c10d_log_quieted():
        assert level.value == 3
    assert level.value == max(before, 2), "errors, not warnings, after the rendezvous"
    level.value = before
    for argv, env in ((["pretrain_bert.py", "--debug"], None), (["pretrain_bert.py"], "INFO")):
        monkeypatch.setattr(sys, "argv", argv)
        if env:
            monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", env)
        with c10d_log_quieted():
            assert level.value == before


def test_a_run_without_a_launcher_ignores_a_stale_master_addr(monkeypatch):
    """`python pretrain_bert.py` with MASTER_ADDR left in the environment connected there (a world of 1
    on a free local port at a remote host) and hung until --rendezvous-timeout: it meets itself on 127.0.0.1."""
    from megatron.parallel.launch_check import launch_environment

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "192.0.2.1")
    line = launch_environment()
    assert os.environ["MASTER_ADDR"] == "127.0.0.1" and os.environ["WORLD_SIZE"] == "1"
    assert line.splitlines()[-1].startswith("note: MASTER_ADDR=192.0.2.1 from the environment is not used")


def test_more_workers_than_cpus_is_one_warning_line_not_torchs(monkeypatch, capsys):
    """--num-workers 4 on 2 CPUs printed torch's four-line UserWarning with file paths at the first step."""
    import warnings

    from megatron.data import workers

    monkeypatch.setattr(workers, "usable_cpus", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "0")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        workers.check_num_workers(4)
        warnings.warn("This DataLoader will create 4 worker processes in total. Our suggested max ...", UserWarning)
    assert shown == []
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: --num-workers 4 is more than the 2 CPUs"), lines
    workers.check_num_workers(2)
    assert capsys.readouterr().err == ""


def test_a_tilde_after_an_equals_sign_is_the_home_folder(tmp_path, assets):
    """`--save=~/ck` (bash expands no ~ after `=`) saved into a folder named `~` in the current one, and an
    input given so was `~/data/vocab.txt does not exist`, though it was there."""
    result = run_command("pretrain", [*PRETRAIN, "--vocab-file=~/none.txt"], tmp_path, assets,
                         env={"HOME": str(tmp_path)})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert f"{tmp_path}/none.txt does not exist" in lines[0] and "~" not in lines[0], lines[0]


MORE_THAN_CPUS, ONE, AS_MANY_AS_CPUS = (lambda cpus: cpus + 1), (lambda cpus: 1), (lambda cpus: cpus)


@pytest.mark.parametrize("accelerator,ranks,threads,warned", [
    ("cpu", MORE_THAN_CPUS, None, "CPU ranks (no GPU is used) share this machine's"),  # bert_distributed.sh 6 ...
    ("cpu", ONE, MORE_THAN_CPUS, "is more than the"),  # OMP_NUM_THREADS=512 on 2 CPUs
    ("cpu", AS_MANY_AS_CPUS, None, None),  # torch's own threads: the main job's CPU run
    ("cuda", MORE_THAN_CPUS, MORE_THAN_CPUS, None),  # GPU ranks: their CPU threads are not the work
], ids=["ranks_beyond_cpus", "threads_beyond_cpus", "ranks_equal_cpus", "gpu_ranks"])
def test_cpu_ranks_or_threads_beyond_the_cpus_are_one_warning(monkeypatch, capsys, accelerator, ranks, threads,
                                                              warned):
    """6 CPU ranks on 2 CPUs (a GPU machine's command run where there is none) or OMP_NUM_THREADS=512 trained
    without a word, each step many times slower."""
    from megatron.data.workers import usable_cpus, warn_cpu_oversubscription

    cpus = usable_cpus()
    monkeypatch.setenv("DS_ACCELERATOR", accelerator)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_SIZE", str(ranks(cpus)))
    if threads:
        monkeypatch.setenv("OMP_NUM_THREADS", str(threads(cpus)))
    else:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    warn_cpu_oversubscription()
    lines = capsys.readouterr().err.splitlines()
    if warned is None:
        assert lines == []
    else:
        assert len(lines) == 1 and lines[0].startswith("warning: ") and warned in lines[0], lines


@pytest.mark.parametrize("flags, problem", [
    (["--lr", "-1"], "--lr -1.0 is negative"),
    (["--keep-last", "2"], "--keep-last is given without --save"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "50"], "--lr-wsd-decay-iters 50 is longer than the 20 steps"),
    (["--num-workers", "100000", "--keep-last", "2", "--save", "ck"], None)])
def test_a_launch_scripts_check_refuses_what_the_ranks_would_from_the_flags(flags, problem):
    """The launch scripts' check before a dry run or a launch (arguments.launchable) ran the parser alone: a value
    out of range, a flag missing its partner, an LR schedule longer than the run passed the dry run and stopped
    every rank at start-up. What depends on the ranks' node (--num-workers against its CPUs) stays theirs."""
    from megatron import arguments
    from megatron.errors import ConfigError

    args = arguments.build_parser().parse_args(["--train-iters", "20", *flags])
    if problem is None:
        arguments.launchable(args)
        return
    with pytest.raises(ConfigError) as error:
        arguments.launchable(args)
    assert error.value.problem.startswith(problem), error.value.problem
