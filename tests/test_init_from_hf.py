"""Starting a run from Hugging Face weights through pretrain_bert.py: --init-from-hf DIR (a BertModel
folder without heads, fewer positions than the run) and --load of a weights-only checkpoint that
tools/convert_checkpoint.py from-hf wrote. Tiny random HF models, built offline. --lr 0 keeps the
weights of the first step, so the saved checkpoint shows what the run started from."""
import argparse
from pathlib import Path

import pytest
import torch

from megatron import (checkpoint, checkpoint_compat, checkpoint_weights, flag_checks, hf_convert, hf_io, run_data,
                      start_plan, starting_weights, training)
from megatron.errors import ConfigError, DataError
from megatron.model.bert import BertConfig, BertModel
from megatron.model.fields import resume_kept
from test_convert_checkpoint import convert
from test_hf_convert import hf_model, write_vocab_file
from test_training import TINY, run_entry_point

HF = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
          max_position_embeddings=64)  # the run asks for 128 positions: extended by repetition


def vocab_size(data_dir) -> int:
    return len((Path(data_dir) / "vocab.txt").read_text().splitlines())


def run_one_step(tmp_path, data_dir, *argv):
    return run_entry_point(*TINY, "--lr", "0", "--train-iters", "1", "--eval-iters", "1", "--split", "100,0,0",
                           "--default-data-dir", data_dir, "--save", str(tmp_path / "run"),
                           "--log-dir", str(tmp_path / "log"), *argv)


def test_init_from_hf_folder_without_heads(tmp_path, data_dir):
    _, folder = hf_model("bert", tmp_path, heads=False, vocab_size=vocab_size(data_dir), **HF)
    result = run_one_step(tmp_path, data_dir, "--init-from-hf", str(folder))
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    # the pooler is in a BertModel folder; the SOP classifier and the MLM head are not
    assert warnings == ["warning: not in the Hugging Face folder, initialised: binary_head.classifier.bias, "
                        "binary_head.classifier.weight, lm_head.bias, lm_head.dense.bias, lm_head.dense.weight, "
                        "lm_head.layernorm.bias, lm_head.layernorm.weight"], result.stderr[-3000:]
    stored = checkpoint.stored_config(str(tmp_path / "run"), checkpoint.tag_for(1))["model"]
    # the HF config filled the flags TINY leaves out, and its layout
    assert (stored["ffn_hidden_size"], stored["layernorm_layout"], stored["layernorm_epsilon"]) == (128, "post", 1e-12)
    trained = checkpoint_weights.bert_state_from_checkpoint(str(tmp_path / "run"))
    config = BertConfig(**stored)
    hf_state, _ = hf_convert.bert_state_from_hf(hf_convert.read_hf_tensors(folder), config)
    for name, tensor in hf_state.items():
        assert torch.equal(trained[name], tensor), name
    positions = trained["embeddings.position_embeddings.weight"]
    assert torch.equal(positions[64:], positions[:64])  # the 64 learned positions, repeated


def test_init_from_hf_refuses_extension_when_asked(tmp_path, data_dir):
    _, folder = hf_model("bert", tmp_path, heads=False, vocab_size=vocab_size(data_dir), **HF)
    result = run_one_step(tmp_path, data_dir, "--init-from-hf", str(folder), "--no-position-extension")
    errors = [line for line in result.stderr.splitlines() if line.startswith("pretrain_bert.py: error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-3000:]
    assert "has 64 positions, max_position_embeddings is 128 and extension is refused" in errors[0]
    assert not (tmp_path / "run").exists()


def test_load_weights_only_checkpoint_from_the_converter(tmp_path, data_dir):
    _, folder = hf_model("megatron-bert", tmp_path, vocab_size=vocab_size(data_dir), **HF)
    done = convert("from-hf", "--hf-dir", folder, "--save", tmp_path / "converted", "--max-position-embeddings", 128)
    assert done.returncode == 0, done.stderr
    result = run_one_step(tmp_path, data_dir, "--load", str(tmp_path / "converted"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning:" not in result.stderr  # every head came from the checkpoint
    converted = checkpoint_weights.bert_state_from_checkpoint(str(tmp_path / "converted"))
    trained = checkpoint_weights.bert_state_from_checkpoint(str(tmp_path / "run"))
    assert set(trained) == set(converted) and all(torch.equal(trained[n], converted[n]) for n in converted)
    stored = checkpoint.run_state(str(tmp_path / "run"), checkpoint.tag_for(1))
    assert stored["iteration"] == 1 and stored["config"]["model"]["layernorm_layout"] == "pre"


def test_an_unreadable_folder_tokenizer_is_one_line_or_a_warning_beside_the_flags(tmp_path, capsys):
    """In-process (run_data.data_paths): the folder's broken tokenizer.json stops a run that has no other
    tokenizer; beside --vocab-file it is a plain warning line (no Python warning with its source line)."""
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{oops")
    args = argparse.Namespace(load=None, init_from_hf=str(folder), finetune=False, vocab_file=None,
                              tokenizer_file=None, tokenizer_type=None, data_path=[str(tmp_path / "data")],
                              whole_word_masking=False)
    with pytest.raises(DataError, match=f"the tokenizer of the Hugging Face folder {folder} cannot be used: .*; fix "
                                        "it or download the model folder again, or pass the --tokenizer-file"):
        run_data.data_paths(args, start_plan.StartPlan.given(args))
    args.vocab_file = str(write_vocab_file(tmp_path / "vocab.txt"))
    capsys.readouterr()
    assert run_data.data_paths(args, start_plan.StartPlan.given(args))[1].file == args.vocab_file
    assert capsys.readouterr().err.splitlines() == [
        f"warning: the tokenizer of the Hugging Face folder {folder} cannot be used: tokenizer file "
        f"{folder / 'tokenizer.json'} is not a Hugging Face tokenizer.json (key must be a string at line 1 column 2); "
        f"the run uses {args.vocab_file}"]


def test_a_start_from_weights_of_another_variant_initialises_or_drops_linformers_projections(tmp_path, capsys):
    """In-process (starting_weights.initial_weights): a weights-only checkpoint (from-hf's, dense) starts a linformer
    run as --init-from-hf does, its projections initialised and named in one warning line; --finetune from a
    linformer-trained checkpoint into dense attention drops them and says in one line that the outputs change
    (a from-hf one says nothing: it was not trained here). A resume cannot: its fix names --finetune."""
    import json

    from bert_fixtures import small_config, small_model
    from megatron.errors import ConfigError

    dense, linformer = small_config("dense"), small_config("linformer", linformer_k=8)
    for name, config in (("from_hf", dense), ("trained", linformer)):
        hf_convert.save_weights_only_checkpoint(tmp_path / name, small_model(config).state_dict(), config)
    run_state = tmp_path / "trained" / checkpoint.tag_for(0) / checkpoint.RUN_STATE
    run_state.write_text(json.dumps({**json.loads(run_state.read_text()), "weights_only": False}))  # a trained one

    def start(name: str, config: BertConfig) -> dict:
        plan = start_plan.StartPlan.at(str(tmp_path / name), None, finetune=True)
        return starting_weights.initial_weights(argparse.Namespace(), plan, argparse.Namespace(model=config))

    capsys.readouterr()
    state = start("from_hf", linformer)
    stored = checkpoint_weights.bert_state_from_checkpoint(str(tmp_path / "from_hf"))
    projections = [f"layers.{i}.attention.core.{kind}_projection" for i in (0, 1) for kind in ("key", "value")]
    assert sorted(set(state) - set(stored)) == projections and all(torch.equal(state[n], stored[n]) for n in stored)
    assert capsys.readouterr().err.splitlines() == [
        f"warning: not in checkpoint {tmp_path / 'from_hf'}, initialised: {', '.join(sorted(projections))}"]
    state = start("trained", dense)
    assert set(state) == set(small_model(dense).state_dict())
    assert capsys.readouterr().err.splitlines() == [
        f"warning: checkpoint {tmp_path / 'trained'} was trained with Linformer's low-rank projected attention "
        "(linformer); this run uses attention to every token (dense), so its outputs differ from the trained model's"]
    with pytest.raises(ConfigError, match="lacks layers.0.attention.core.key_projection, which this model has; "
                                          "resume with attention dense, the checkpoint's, or pass --finetune and "
                                          "another --save to start a new run from the checkpoint.s weights"):
        checkpoint_compat.check_model_shapes(vars(dense), linformer, "ckpt/iter_0000001")
    # any other tensor the weights lack stays one error, and a start from weights is no resume
    with pytest.raises(ConfigError, match="lacks binary_head.pooler.weight, which this model has; pass the model "
                                          "flags the checkpoint was trained with$"):
        checkpoint_compat.check_model_shapes(vars(small_config("dense", add_binary_head=False)), dense, "ckpt",
                                             start=True)
    # and so is one tensor the model lacks (a learned position table met by rope): not dropped silently
    with pytest.raises(ConfigError, match="holds embeddings.position_embeddings.weight, which this model does not "
                                          "have; pass the model flags the checkpoint was trained with$"):
        checkpoint_compat.check_model_shapes(vars(dense), small_config("dense", position_embedding_type="rope"),
                                             "ckpt", start=True)


def test_linformer_or_bigbird_over_the_local_layers_of_the_weights_names_them_not_a_flag(tmp_path):
    """In-process (starting_weights.model_flags): the window comes from the weights the run starts from (here a
    weights-only checkpoint; an --init-from-hf folder alike), so no flag drops it: the one fix is a
    variant for the global layers."""
    from bert_fixtures import small_config, small_model
    from megatron.arguments import build_parser
    from megatron.errors import ConfigError

    config = small_config("dense", position_embedding_type="rope", local_attention_window=8, global_attention_every=2)
    hf_convert.save_weights_only_checkpoint(tmp_path / "ck", small_model(config).state_dict(), config)
    for variant, flags, ds in (("bigbird", [], {"sequence_parallel": {"attention": "bigbird"}}),
                               ("linformer", ["--attention", "linformer"], {})):
        args = build_parser().parse_args(["--load", str(tmp_path / "ck"), *flags])
        with pytest.raises(ConfigError) as caught:
            starting_weights.model_flags(args, ds, start_plan.StartPlan.given(args))
        assert str(caught.value) == (
            f"{variant} attention cannot be combined with the local sliding-window layers of the weights-only "
            f"checkpoint {tmp_path / 'ck'} (its global layers would change the math of a windowed model); use "
            "attention dense, ring, ulysses or hybrid for the global layers")


def test_a_contradicting_flag_names_the_checkpoint_as_what_it_is(tmp_path):
    """In-process (starting_weights.model_flags): --finetune starts from any checkpoint's weights; its refusal called
    every one 'the weights-only checkpoint', a full training checkpoint too."""
    from bert_fixtures import small_config, small_model
    from megatron.arguments import build_parser
    from megatron.errors import ConfigError

    config = small_config("dense")
    hf_convert.save_weights_only_checkpoint(tmp_path / "ck", small_model(config).state_dict(), config)
    for flags, source in (([], "the weights-only checkpoint"), (["--finetune"], "the checkpoint")):
        args = build_parser().parse_args(["--load", str(tmp_path / "ck"), "--num-attention-heads", "8", *flags])
        with pytest.raises(ConfigError, match=f"--num-attention-heads 8 contradicts {source} {tmp_path / 'ck'}, "):
            starting_weights.model_flags(args, {}, start_plan.StartPlan.given(args))


def test_no_position_extension_is_refused_for_rotary_positions(tmp_path):
    """In-process (starting_weights.model_flags, and from-hf in its process): rotary weights have no position
    table, so the flag that refuses extending one would do nothing."""
    from megatron.arguments import build_parser
    from megatron.errors import ConfigError
    from test_hf_modernbert import hf_folder

    _, folder = hf_folder(tmp_path, "geglu-every3")
    args = build_parser().parse_args(["--init-from-hf", str(folder), "--no-position-extension"])
    with pytest.raises(ConfigError, match=f"--no-position-extension has no effect on the --init-from-hf folder "
                                          f"{folder}: its positions are rotary"):
        starting_weights.model_flags(args, {}, start_plan.StartPlan.given(args))
    done = convert("from-hf", "--hf-dir", folder, "--save", tmp_path / "ck", "--no-position-extension")
    assert done.returncode == 2 and "its positions are rotary, with no table to extend; drop" in done.stderr
    assert not (tmp_path / "ck").exists()


def test_a_folders_fixed_tokenizer_is_the_folders_and_other_data_is_preprocessed_again(tmp_path):
    """In-process (run_data.data_paths): the folder's tokenizer is named as the folder's, not a checkpoint's,
    and data made with another vocab gets the one fix that applies: the folder refuses the data's vocab flag."""
    from megatron.data.tokenizer import BertWordPiece
    from megatron.data.tokenizer_identity import write_data_identity

    folder = tmp_path / "hf"
    folder.mkdir()
    write_vocab_file(folder / "vocab.txt")
    lines = (folder / "vocab.txt").read_text().splitlines()
    other = tmp_path / "other.txt"
    other.write_text("\n".join(lines[:5] + lines[5:][::-1]) + "\n")
    args = argparse.Namespace(load=None, init_from_hf=str(folder), finetune=False, vocab_file=str(other),
                              tokenizer_file=None, tokenizer_type=None, data_path=[str(tmp_path / "data")],
                              whole_word_masking=False)
    with pytest.raises(DataError, match=f"the vocab {other} differs from {folder}/vocab.txt, the one the Hugging Face "
                                        f"folder {folder} was trained with .*; drop --vocab-file/--tokenizer-file "
                                        r"\(the folder carries its tokenizer\)"):
        run_data.data_paths(args, start_plan.StartPlan.given(args))
    args.vocab_file = None
    write_data_identity(BertWordPiece(str(other)), str(tmp_path / "data"))
    with pytest.raises(DataError) as caught:
        run_data.data_paths(args, start_plan.StartPlan.given(args))
    assert str(caught.value).endswith(
        f"; rerun tools/preprocess_data.py with the run's tokenizer (--tokenizer-type BertWordPieceLowerCase "
        f"--vocab-file {folder}/vocab.txt, the one the Hugging Face folder {folder} was trained with)")


def test_a_checkpoint_that_carries_no_tokenizer_is_named_when_the_data_needs_one(tmp_path):
    """In-process (run_data.data_paths): --load of a checkpoint without a tokenizer (a from-hf one of a folder
    without one) said 'the run starts from nothing that carries a tokenizer', as if no --load were given."""
    from bert_fixtures import small_config, small_model
    from megatron.errors import ConfigError

    config = small_config("dense")
    hf_convert.save_weights_only_checkpoint(tmp_path / "ck", small_model(config).state_dict(), config)
    args = argparse.Namespace(load=str(tmp_path / "ck"), init_from_hf=None, finetune=False, vocab_file=None,
                              tokenizer_file=None, tokenizer_type=None, data_path=[str(tmp_path / "data")],
                              whole_word_masking=False, launched_by=None)
    with pytest.raises(ConfigError) as caught:
        run_data.data_paths(args, start_plan.StartPlan.given(args))
    assert str(caught.value) == (f"--data-path is given without --vocab-file, and the checkpoint {tmp_path / 'ck'} "
                                 "carries no tokenizer; pass the vocab.txt (or --tokenizer-file) the data was made "
                                 "with")


def test_a_run_started_from_an_hf_folder_resumes_with_the_same_command(tmp_path, data_dir, capsys):
    """The first run takes its model and its --seq-length (the folder's 64 positions, not the default 512)
    from the folder. Requeued with the same command (--init-from-hf X --load S --save S: Megatron's
    --pretrained-checkpoint with --load), it resumes S once S holds a checkpoint, saying that X is not
    used, and goes on as the first run did past the checkpoint: the same iterations and the same losses,
    at the same length, with no warning but the one that the logs are in two folders; so does that command with
    --load alone (no model flag restated).
    A requeue naming another folder than the first run's is refused, one copied elsewhere is not."""
    import json
    import shutil

    from megatron import run_log

    _, folder = hf_model("bert", tmp_path, vocab_size=vocab_size(data_dir), **HF)
    run = tmp_path / "run"
    command = ["--micro-batch-size", "4", "--lr", "1e-3", "--attention-dropout", "0", "--hidden-dropout", "0",
               "--train-iters", "4", "--save-interval", "2", "--log-interval", "1", "--eval-iters", "1",
               "--split", "100,0,0", "--default-data-dir", data_dir, "--save", str(run)]
    requeueable = [*command, "--init-from-hf", str(folder), "--load", str(run)]
    first = run_entry_point(*requeueable, "--log-dir", str(tmp_path / "log"))
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"starting from the weights of {folder}" in first.stdout and "is not used" not in first.stdout

    def stopped_after_2():
        (run / "latest").write_text(checkpoint.tag_for(2))
        shutil.rmtree(run / checkpoint.tag_for(4))

    def trained(log: str) -> dict:
        return {r["iteration"]: r["loss"] for r in run_log.read_metrics(tmp_path / log / "metrics.jsonl")
                if r["kind"] == "train"}

    for log, start in (("requeued", requeueable), ("resumed", [*command, "--load", str(run)])):
        stopped_after_2()
        resumed = run_entry_point(*start, "--log-dir", str(tmp_path / log))
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        # the one warning: this test logs each resume in its own folder, to compare them
        warnings = [line for line in resumed.stderr.splitlines() if "warning:" in line]
        assert warnings == [f"warning: this resume logs into --log-dir {tmp_path / log}, the checkpoint's run logged "
                            f"into {tmp_path / 'log'}: the run's metrics.jsonl and config.json are split between the "
                            f"folders; pass --log-dir {tmp_path / 'log'} to continue them in one"], resumed.stderr[-3000:]
        assert f"resuming from {run / 'iter_0000002'} iteration 2" in resumed.stdout
        assert (f"--init-from-hf {folder} is not used: --load {run} holds iteration 2, which this run resumes"
                in resumed.stdout) == (log == "requeued"), resumed.stdout[-3000:]
        assert list(trained(log)) == [3, 4] and trained(log) == {i: trained("log")[i] for i in (3, 4)}
        configs = [json.loads((tmp_path / name / "config.json").read_text())["model"] for name in ("log", log)]
        assert configs[0] == configs[1] and configs[0]["seq_length"] == 64 and configs[0]["ffn_hidden_size"] == 128
    # each checkpoint records where the run started and the run's id (the resumes carried both on)
    first, origin = (checkpoint.run_state(str(run), checkpoint.tag_for(i))[checkpoint.ORIGIN] for i in (2, 4))
    assert origin == {"from": str(folder.resolve()), "kind": "hf", "sha256": hf_io.weights_fingerprint(folder, "hf"),
                      checkpoint.RUN_ID: first[checkpoint.RUN_ID]}
    # a requeue pointed at another model is refused before any work; a copy of the first one is the same model
    _, other = hf_model("bert", tmp_path / "other", seed=1, vocab_size=vocab_size(data_dir), **HF)
    files = sorted(tmp_path.rglob("*"))
    capsys.readouterr()
    assert training.main([*command, "--init-from-hf", str(other), "--load", str(run)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"pretrain_bert.py: error: --load {run} holds a run that started from --init-from-hf {folder.resolve()}, "
        f"not from --init-from-hf {other}; requeue it with --init-from-hf {folder.resolve()}, or pass another --load "
        f"and --save to start from {other}"]
    assert sorted(tmp_path.rglob("*")) == files
    # the first run of that command says where it starts; a --load it does not save into is a typo
    first = tmp_path / "first"
    args = argparse.Namespace(init_from_hf=str(folder), load=str(first), save=str(first), finetune=False,
                              launched_by=None)
    capsys.readouterr()
    plan = start_plan.check_start(args)
    fresh = start_plan.weights_origin(plan)  # the same weights; a run of its own
    assert (plan.init_from_hf, plan.load) == (str(folder), None)
    assert fresh[checkpoint.RUN_ID] != origin[checkpoint.RUN_ID]
    assert {**fresh, checkpoint.RUN_ID: origin[checkpoint.RUN_ID]} == origin
    assert vars(args) == dict(init_from_hf=str(folder), load=str(first), save=str(first), finetune=False,
                              launched_by=None)  # as given
    assert capsys.readouterr().out == f"--load {first} holds no checkpoint yet: starting from --init-from-hf {folder}\n"
    copy = shutil.copytree(folder, tmp_path / "copy")
    args = argparse.Namespace(init_from_hf=str(copy), load=str(run), save=str(run), finetune=False, launched_by=None)
    plan = start_plan.check_start(args)
    assert plan.init_from_hf is None and plan.load == str(run) and args.init_from_hf == str(copy)
    # a flag that restates a field with another value is refused, before the data's index maps
    maps = sorted(Path(data_dir).rglob("*"))
    refused = run_entry_point(*command, "--load", str(run), "--num-layers", "3",
                              "--log-dir", str(tmp_path / "refused"))
    assert refused.returncode == 2 and refused.stderr.splitlines()[-1].startswith(
        f"pretrain_bert.py: error: --num-layers 3 contradicts the checkpoint {run}, whose model has "
        "num_layers 2; drop --num-layers 3"), refused.stderr[-3000:]
    assert sorted(Path(data_dir).rglob("*")) == maps and not (tmp_path / "refused").exists()


def test_a_json_typo_in_a_run_from_weights_is_one_line_before_their_hash(tmp_path, capsys, monkeypatch):
    """Rank 0 hashes the weights a new run starts from (weights_origin, for its checkpoints): every weight,
    minutes for a large model. It ran first, before the cheap checks of the flags and the JSON, and while
    the other ranks counted --rendezvous-timeout; it now runs aside, after those checks."""
    _, folder = hf_model("bert", tmp_path, **HF)
    (tmp_path / "ds.json").write_text('{"train_micro_batch_size_per_gpu": 4,}')
    hashed = []
    monkeypatch.setattr(hf_io, "weights_fingerprint", lambda *args: hashed.append(args) or "digest")
    capsys.readouterr()
    assert training.main([*TINY, "--train-iters", "1", "--init-from-hf", str(folder), "--save", str(tmp_path / "run"),
                          "--deepspeed", "--deepspeed_config", str(tmp_path / "ds.json")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"pretrain_bert.py: error: {tmp_path / 'ds.json'}:1:38: invalid JSON (Expecting property name enclosed in "
        "double quotes); fix the JSON syntax at that position"]
    assert hashed == [] and not (tmp_path / "run").exists()
    plan = start_plan.StartPlan.at(None, str(folder), False)
    origin = start_plan.pending_origin(plan, str(tmp_path / "run")).result()
    assert origin == {"from": str(folder.resolve()), "kind": "hf", "sha256": "digest",
                      checkpoint.RUN_ID: origin[checkpoint.RUN_ID]}
    assert hashed == [(str(folder), "hf")]  # aside, for the checkpoints of rank 0 of a run that saves
    assert start_plan.pending_origin(plan, None) is None


def test_a_checkpoints_hash_is_done_before_its_weights_are_loaded_for_the_run(tmp_path, monkeypatch):
    """A checkpoint's hash loads every weight: hashed aside while initial_weights held the run's copy, rank 0
    held two. It is done first (a finished future), then the run's copy loads; an HF folder's hash, read
    block by block, stays aside."""
    import threading

    from bert_fixtures import small_config, small_model

    config = small_config("dense")
    hf_convert.save_weights_only_checkpoint(tmp_path / "ck", small_model(config).state_dict(), config)
    events = []
    loading = hf_io.bert_state_from_checkpoint
    monkeypatch.setattr(hf_io, "bert_state_from_checkpoint",
                        lambda *args: events.append(threading.current_thread().name) or loading(*args))
    plan = start_plan.StartPlan.at(str(tmp_path / "ck"), None, False)
    origin = start_plan.pending_origin(plan, str(tmp_path / "run"))
    assert origin.done() and origin.result()["kind"] == "checkpoint"
    assert events == [threading.main_thread().name]  # the hash's load, finished: nothing aside


def test_a_requeued_run_from_checkpoint_weights_resumes_its_save_folder(tmp_path, capsys):
    """`--load W --save S` (W weights only, or --finetune) given again once S holds a checkpoint of the run
    that started from W (or a copy of W) resumes S, as --init-from-hf X --load S does; a checkpoint of
    a run from other weights is refused naming both, one that records no start keeps check_save_dir's line."""
    import json
    import shutil

    from bert_fixtures import small_config, small_model
    from megatron.errors import ConfigError

    config = small_config("dense")
    weights = tmp_path / "weights"
    hf_convert.save_weights_only_checkpoint(weights, small_model(config).state_dict(), config)
    other = tmp_path / "other"
    hf_convert.save_weights_only_checkpoint(other, small_model(config, seed=7).state_dict(), config)
    origin = start_plan.weights_origin(start_plan.StartPlan.at(str(weights), None, finetune=False))
    assert origin == {"from": str(weights.resolve()), "kind": "checkpoint",
                      "sha256": hf_io.weights_fingerprint(weights, "checkpoint"), checkpoint.RUN_ID: origin[checkpoint.RUN_ID]}
    save = tmp_path / "save"
    (save / "iter_0000004").mkdir(parents=True)
    (save / "iter_0000004" / "mp_rank_00_model_states.pt").write_bytes(b"")
    (save / "latest").write_text("iter_0000004")

    def start(load, record=origin, finetune=False):
        state = {"config": {"model": {}}, "iteration": 4, "consumed_samples": 16,
                 **({checkpoint.ORIGIN: record} if record else {})}
        (save / "iter_0000004" / checkpoint.RUN_STATE).write_text(json.dumps(state))
        args = argparse.Namespace(init_from_hf=None, load=str(load), save=str(save), finetune=finetune,
                                  launched_by=None)
        given = dict(vars(args))
        plan = start_plan.check_start(args)
        assert vars(args) == given  # the run reads the plan; the flags stay as given
        return plan

    capsys.readouterr()
    for load, finetune in ((weights, False), (shutil.copytree(weights, tmp_path / "copy"), True)):
        plan = start(load, finetune=finetune)
        assert (plan.load, plan.finetune) == (str(save), False)
        assert capsys.readouterr().out == (f"--load {load}{' --finetune' if finetune else ''} is not used: --save "
                                           f"{save} holds iteration 4, which this run resumes (a requeued job)\n")
    with pytest.raises(ConfigError) as refused:
        start(other)
    assert str(refused.value) == (f"--save {save} holds a run that started from --load {weights.resolve()}, not from "
                                  f"--load {other}; requeue it with --load {weights.resolve()}, or pass another --save "
                                  f"to start from {other}")
    with pytest.raises(ConfigError) as refused:  # a run from an HF folder: its whole start is named
        start(weights, record={"from": "/models/a", "kind": "hf", "sha256": "0" * 64}, finetune=True)
    assert str(refused.value) == (f"--save {save} holds a run that started from --init-from-hf /models/a, not from "
                                  f"--load {weights} --finetune; requeue it with --init-from-hf /models/a --load {save} "
                                  f"--save {save} in place of --load {weights} --finetune and --save, or pass another "
                                  f"--save to start from {weights}")
    with pytest.raises(ConfigError, match=f"--save {save} holds checkpoint iter_0000004, ahead of this run's start"):
        start(weights, record=None)
    with pytest.raises(ConfigError, match="holds a run that started from scratch, not from --load"):
        start(weights, record={"from": None})
    with pytest.raises(ConfigError, match="--finetune is given with --init-from-hf"):
        flag_checks.check_flag_combinations(training.build_parser().parse_args(
            ["--train-iters", "1", "--init-from-hf", str(tmp_path), "--load", str(save), "--finetune"]))


def test_weights_with_nan_are_refused_naming_the_tensor(tmp_path):
    """Every tensor a run starts from: an HF folder's (from-hf, --init-from-hf: read_hf_weights) and a
    weights-only checkpoint's (--load, --finetune); NaN weights would give a NaN loss at the first step."""
    from bert_fixtures import small_config, small_model

    config = small_config("dense")
    state = small_model(config).state_dict()
    state["layers.1.mlp.dense_4h_to_h.weight"][0, 0] = float("inf")
    hf_convert.save_weights_only_checkpoint(tmp_path / "ck", state, config)
    plan = start_plan.StartPlan.at(str(tmp_path / "ck"), None, finetune=False)
    with pytest.raises(DataError, match=r"tensor layers.1.mlp.dense_4h_to_h.weight of checkpoint .*ck/iter_0000000 "
                                        r"holds 1 of \d+ values that are NaN or inf; start from another checkpoint"):
        starting_weights.initial_weights(argparse.Namespace(), plan, argparse.Namespace(model=config))
    _, folder = hf_model("bert", tmp_path, **HF)
    weights = folder / "model.safetensors"
    tensors = hf_io.read_safetensors(weights)
    tensors["bert.embeddings.word_embeddings.weight"][3, 1] = float("nan")
    hf_io.write_safetensors(weights, tensors)
    with pytest.raises(DataError, match=f"tensor bert.embeddings.word_embeddings.weight of {weights} holds 1 of"):
        hf_io.read_hf_weights(folder)
    done = convert("from-hf", "--hf-dir", folder, "--save", tmp_path / "converted")
    assert done.returncode == 2 and "bert.embeddings.word_embeddings.weight" in done.stderr.splitlines()[-1]
    assert not (tmp_path / "converted").exists()


def test_a_start_from_weights_pads_the_vocab_to_the_runs_multiple(tmp_path):
    """--make-vocab-size-divisible-by with a weights-only --load was refused ("the weights fix it") while
    --init-from-hf of the same folder took it: the padding rows, which no token reaches, are padded again
    as from an HF folder (zero embeddings, a bias of no probability); the vocab's own rows stay."""
    from bert_fixtures import small_config, small_model

    config = small_config("dense", vocab_size=97, make_vocab_size_divisible_by=16)  # 112 rows
    hf_convert.save_weights_only_checkpoint(tmp_path / "ck", small_model(config).state_dict(), config)
    wider = small_config("dense", vocab_size=97, make_vocab_size_divisible_by=100)  # 100 rows
    state = starting_weights.initial_weights(argparse.Namespace(), start_plan.StartPlan.at(str(tmp_path / "ck"), None, False),
                                     argparse.Namespace(model=wider))
    stored = checkpoint_weights.bert_state_from_checkpoint(str(tmp_path / "ck"))
    embeddings, bias = state["embeddings.word_embeddings.weight"], state["lm_head.bias"]
    assert embeddings.shape == (100, config.hidden_size) and bias.shape == (100,)
    assert torch.equal(embeddings[:97], stored["embeddings.word_embeddings.weight"][:97])
    assert torch.equal(bias[:97], stored["lm_head.bias"][:97])
    assert not embeddings[97:].any() and (bias[97:] == hf_io.PADDED_VOCAB_BIAS).all()
    BertModel(wider).load_state_dict(state)  # every tensor of the run's model, in its shape


def test_local_layers_added_to_weights_trained_all_global_are_a_warning(tmp_path, capsys):
    """docs/resuming.md's warning for local layers added to weights trained without them: for weights
    trained elsewhere (an HF folder, a from-hf checkpoint) as for --finetune of a checkpoint trained here."""
    from bert_fixtures import small_config, small_model

    config = small_config("dense")
    hf_convert.save_weights_only_checkpoint(tmp_path / "ck", small_model(config).state_dict(), config)
    local = small_config("dense", local_attention_window=8, global_attention_every=2)
    capsys.readouterr()
    starting_weights.initial_weights(argparse.Namespace(), start_plan.StartPlan.at(str(tmp_path / "ck"), None, False),
                             argparse.Namespace(model=local))
    assert capsys.readouterr().err.splitlines() == [
        f"warning: checkpoint {tmp_path / 'ck'} was trained with every layer global, at local_attention_window None, "
        "global_attention_every 1; this run uses local_attention_window 8, global_attention_every 2, so its outputs "
        "differ from the trained model's"]
    # trained with them: the period is fixed
    assert checkpoint_compat.local_layers_added("ck", vars(local), local) is None
    assert checkpoint_compat.local_layers_added("ck", vars(config), config) is None


def test_a_resume_takes_the_checkpoints_model_unless_a_flag_or_preset_restates_it(tmp_path):
    """In-process (starting_weights.model_flags): every field the resume checks (checkpoint_compat.check_same_model) and
    --seq-length come from the checkpoint, a classic BERT's too; a preset that differs is refused by name."""
    import json

    from bert_fixtures import small_config, small_model
    from megatron.arguments import build_parser
    from megatron.errors import ConfigError

    config = small_config("dense", seq_length=48, local_attention_window=8, global_attention_every=2,
                          layernorm_layout="pre", embedding_layernorm=False)
    hf_convert.save_weights_only_checkpoint(tmp_path / "ck", small_model(config).state_dict(), config)
    run_state = tmp_path / "ck" / checkpoint.tag_for(0) / checkpoint.RUN_STATE
    run_state.write_text(json.dumps({**json.loads(run_state.read_text()), "weights_only": False}))  # a trained one
    args = build_parser().parse_args(["--load", str(tmp_path / "ck")])
    flags = starting_weights.model_flags(args, {}, start_plan.StartPlan.given(args))
    kept = (*resume_kept(), "seq_length", "max_position_embeddings", "make_vocab_size_divisible_by")
    given = {name: getattr(BertConfig, name) if flags[name] is None else flags[name] for name in kept}  # thetas:
    assert given == {name: getattr(config, name) for name in kept}  # unread with learned positions, not carried
    args = build_parser().parse_args(["--load", str(tmp_path / "ck"), "--model-preset", "modernbert-base"])
    with pytest.raises(ConfigError, match=f"^--model-preset modernbert-base \\(.*\\) contradicts the checkpoint "
                                          f"{tmp_path / 'ck'}, whose model has"):
        starting_weights.model_flags(args, {}, start_plan.StartPlan.given(args))


def test_the_weights_fingerprint_hashes_the_model_the_run_reads(tmp_path):
    """A staged copy of an HF folder with one of its two weight formats is the same model (read_hf_weights
    reads model.safetensors first); a checkpoint's optimizer states (a ZeRO-0 model file holds them) are not
    the model."""
    import shutil

    import torch
    from bert_fixtures import small_config, small_model

    both = tmp_path / "both"
    both.mkdir()
    for name, data in (("config.json", b"{}"), ("model.safetensors", b"weights"), ("pytorch_model.bin", b"other")):
        (both / name).write_bytes(data)
    staged = shutil.copytree(both, tmp_path / "staged", ignore=shutil.ignore_patterns("*.bin"))
    assert hf_io.weights_fingerprint(staged, "hf") == hf_io.weights_fingerprint(both, "hf")
    (staged / "model.safetensors").write_bytes(b"weightz")
    assert hf_io.weights_fingerprint(staged, "hf") != hf_io.weights_fingerprint(both, "hf")
    config = small_config("dense")
    weights = tmp_path / "weights"
    hf_convert.save_weights_only_checkpoint(weights, small_model(config).state_dict(), config)
    before = hf_io.weights_fingerprint(weights, "checkpoint")
    path = weights / "iter_0000000" / "mp_rank_00_model_states.pt"
    states = torch.load(path, weights_only=False)
    torch.save({**states, "optimizer": {"state": {0: {"exp_avg": torch.ones(3)}}}}, path)
    assert hf_io.weights_fingerprint(weights, "checkpoint") == before
    states["module"] = {name: tensor + 1 for name, tensor in states["module"].items()}
    torch.save(states, path)
    assert hf_io.weights_fingerprint(weights, "checkpoint") != before


def test_a_run_from_weights_trains_with_their_dropout_unless_a_flag_or_preset_sets_it(tmp_path, capsys):
    """In-process (starting_weights.model_flags): a ModernBERT folder (dropout 0) was trained at BertConfig's default
    0.1 and exported so by to-hf; the weights' dropout is the run's, as a resume keeps it (kept_regime), and a
    line says so. A BERT folder's 0.1 is kept alike; local layers, or a variant without attention dropout,
    drop a folder's (BertConfig sets 0) instead of refusing it; a flag sets another; a weights-only
    checkpoint's is taken too."""
    import json

    import transformers
    from bert_fixtures import small_config, small_model
    from megatron.arguments import build_parser
    from test_hf_modernbert import SHAPES

    def dropouts(*argv):
        args = build_parser().parse_args([str(arg) for arg in argv])
        flags = starting_weights.model_flags(args, {}, start_plan.StartPlan.given(args))
        return flags["hidden_dropout"], flags["attention_dropout"]

    modern, bert = tmp_path / "mb", tmp_path / "bert"
    modern.mkdir()
    hf = transformers.ModernBertConfig(**SHAPES["geglu-every3"]).to_dict()
    (modern / "config.json").write_text(json.dumps({**hf, "attention_dropout": 0.0, "mlp_dropout": 0.0}))
    capsys.readouterr()
    assert dropouts("--init-from-hf", modern) == (0.0, 0.0)
    assert f"hidden_dropout 0.0, attention_dropout 0.0, init_method_std 0.02 as in the --init-from-hf folder " \
           f"{modern} (" in capsys.readouterr().out
    assert dropouts("--init-from-hf", modern, "--hidden-dropout", "0.2") == (0.2, 0.0)
    (modern / "config.json").write_text(json.dumps({**hf, "attention_dropout": 0.1, "mlp_dropout": 0.05}))
    assert dropouts("--init-from-hf", modern) == (0.05, None)  # BertConfig: 0 with local layers
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", **HF, "vocab_size": 100,
                                                  "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}))
    assert dropouts("--init-from-hf", bert) == (0.1, 0.1)
    assert dropouts("--init-from-hf", bert, "--attention", "ring") == (0.1, None)  # ring: none
    config = small_config("dense", hidden_dropout=0.0, attention_dropout=0.0)
    hf_convert.save_weights_only_checkpoint(tmp_path / "ck", small_model(config).state_dict(), config)
    assert dropouts("--load", tmp_path / "ck") == (0.0, 0.0)
    assert f"as in the weights-only checkpoint {tmp_path / 'ck'} (" in capsys.readouterr().out


def test_a_flag_that_replaces_the_weights_theta_or_window_is_a_note_naming_theirs(tmp_path, capsys):
    """In-process (starting_weights.model_flags): a new run from weights may set another window or rope theta (a
    longer context wants one), but every layer it reaches then computes otherwise than the weights were
    trained to: one note per replaced setting names the weights' value; restating it says nothing. The
    same for a weights-only checkpoint (--load of from-hf's output)."""
    import json

    import transformers
    from megatron.arguments import build_parser
    from test_hf_modernbert import SHAPES

    def notes(*argv) -> list:
        capsys.readouterr()
        args = build_parser().parse_args([str(arg) for arg in argv])
        starting_weights.model_flags(args, {}, start_plan.StartPlan.given(args))
        return [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]

    modern = tmp_path / "mb"
    modern.mkdir()  # window 8, thetas 1000 (global) and 100 (local)
    (modern / "config.json").write_text(json.dumps(transformers.ModernBertConfig(**SHAPES["geglu-every3"]).to_dict()))
    source = f"the --init-from-hf folder {modern}"
    assert notes("--init-from-hf", modern, "--local-attention-window", 32, "--rotary-base", 500,
                 "--local-rotary-base", 50) == [
        f"note: --rotary-base 500.0 replaces the global rope theta 1000 of {source}",
        f"note: --local-rotary-base 50.0 replaces the local rope theta 100 of {source}",
        f"note: --local-attention-window 32 replaces the local attention window 8 of {source} (its local layers "
        "were trained seeing 4 tokens each side)"]
    assert notes("--init-from-hf", modern, "--local-attention-window", 8, "--rotary-base", 1000) == []
    config = BertConfig(vocab_size=100, hidden_size=32, num_layers=2, num_attention_heads=4, seq_length=64,
                        position_embedding_type="rope", local_attention_window=8, global_attention_every=2)
    hf_convert.save_weights_only_checkpoint(tmp_path / "ck", {}, config)
    assert notes("--load", tmp_path / "ck", "--local-attention-window", 16) == [
        f"note: --local-attention-window 16 replaces the local attention window 8 of the weights-only checkpoint "
        f"{tmp_path / 'ck'} (its local layers were trained seeing 4 tokens each side)"]
    # a value then refused (an odd window, a theta float32 cannot hold) is that one error, with no note on it first
    for flag, value, error in (("--local-attention-window", 33, "local_attention_window = 33 is not an even"),
                               ("--rotary-base", 1e39, r"rotary_base = 1e\+39 overflows float32")):
        with pytest.raises(ConfigError, match=error):
            notes("--load", tmp_path / "ck", flag, value)
        assert capsys.readouterr().out == ""
