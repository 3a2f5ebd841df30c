"""tools/extend_context.py: a ModernBERT folder (random weights declared as trained at 64 tokens,
its own BPE tokenizer.json) continued at 4x (256) on SP = 2 through the real `deepspeed` launcher
(2 CPU ranks over gloo) on a corpus preprocessed with the folder's tokenizer, no tokenizer flag
anywhere; the exported folder loads in transformers (model and tokenizer) and gives our logits at
the new length; the same command resumes once --save holds a checkpoint (one more step, the same
model); what cannot be extended or resumed this way is one line, before the launcher starts.

What it cannot see: whether the scaled theta helps a real model at 32K (that takes GPUs and long
documents); here the model is random and trains three steps, the point is the plumbing."""
import argparse
import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from megatron.checkpoint import RUN_ENDED, latest_tag, stored_config
from megatron.checkpoint_weights import bert_state_from_checkpoint
from megatron.data.default_dataset import DEFAULT_VOCAB_SIZE, EMBEDDED_VOCAB
from megatron.data.preprocess import PreprocessOptions, preprocess
from megatron.paths import python_command
from megatron.data.tokenizer import HFTokenizer
from megatron.errors import run_tool
from megatron.model.bert import BertConfig, BertModel
from megatron.parallel.spawn import free_port
from megatron.start_plan import StartPlan
from megatron.training import finished_resume
from test_hf_modernbert import ATOL, SPECIAL, compare, randomize
from test_hf_tokenizer import corpus, modernbert_style, texts, train_bpe  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
TOOL = [PYTHON, str(ROOT / "tools" / "extend_context.py")]
TRAINED, LONGER = 64, 256
_spec = importlib.util.spec_from_file_location("extend_context", ROOT / "tools" / "extend_context.py")
extend_context = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(extend_context)


def tiny_modernbert(folder: Path, vocab_size: int, tokenizer: Path | None = None) -> Path:
    """A random ModernBertForMaskedLM declared as trained at 64 tokens: 3 layers (global, local,
    local), a window of 16, head size 16; with `tokenizer`, its tokenizer.json and special ids."""
    special = SPECIAL
    if tokenizer:
        ours = HFTokenizer(tokenizer)
        special = dict(pad_token_id=ours.pad, cls_token_id=ours.cls, sep_token_id=ours.sep, bos_token_id=ours.cls,
                       eos_token_id=ours.sep)
    config = transformers.ModernBertConfig(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=3,
                                           num_attention_heads=4, intermediate_size=96, local_attention=16,
                                           global_attn_every_n_layers=3, global_rope_theta=10000.0,
                                           local_rope_theta=10000.0, max_position_embeddings=TRAINED, **special)
    torch.manual_seed(0)
    model = transformers.ModernBertForMaskedLM(config)
    randomize(model, 0)
    model.save_pretrained(folder)
    if tokenizer:
        (folder / "tokenizer.json").write_bytes(tokenizer.read_bytes())
    return folder


def other_weights(folder: Path) -> Path:
    """The folder's model with other weights: the same config and shapes."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 1
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def fake_checkpoint(save: Path, model: dict, origin: dict | None = None) -> Path:
    """A --save folder as far as the tool reads it before the launcher: `latest` and one run state
    (`origin`: its weights_from record, the weights the run started from)."""
    (save / "iter_0000001").mkdir(parents=True)
    (save / "latest").write_text("iter_0000001")
    (save / "iter_0000001" / "mp_rank_00_model_states.pt").write_bytes(b"")
    (save / "iter_0000001" / "run_state.json").write_text(json.dumps(
        {"config": {"model": model}, "iteration": 1, "consumed_samples": 2, **({"weights_from": origin} if origin else {})}))
    return save


def run(*argv) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TORCH_EXTENSIONS_DIR": os.environ.get(
        "TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))}
    return subprocess.run([*TOOL, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)


@pytest.fixture(scope="module")
def extended(tmp_path_factory, corpus, modernbert_style):  # noqa: F811
    out = tmp_path_factory.mktemp("extend")
    source = tiny_modernbert(out / "hf", HFTokenizer(modernbert_style).vocab_size, modernbert_style)
    preprocess(PreprocessOptions(input=str(corpus), output_prefix=str(out / "data" / "bpe"),
                                 tokenizer_file=str(source / "tokenizer.json"), split_sentences=True))
    argv = ["--from", str(source), "--seq-length", str(LONGER), "--save", str(out / "ckpt"), "--num-gpus", "2",
            "--master-port", str(free_port()), "--", "--data-path", str(out / "data" / "bpe_text_sentence"),
            "--train-iters", "3", "--micro-batch-size", "1", "--log-interval", "1", "--eval-iters", "1",
            "--lr", "1e-4", "--log-dir", str(out / "log")]
    result = run(*argv)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, argv, result


def test_a_modernbert_continues_at_4x_on_sp2_and_exports_to_transformers(extended, tmp_path):
    out, _, result = extended
    theta = 10000 * 4 ** (16 / 14)
    assert f"trained at {TRAINED} tokens -> {LONGER} (4x); global rope theta 10000 -> {theta:.6g}" in result.stdout
    stored = stored_config(str(out / "ckpt"), latest_tag(str(out / "ckpt")))
    model = stored["model"]
    assert (model["seq_length"], model["rotary_base"], model["local_rotary_base"]) == (LONGER, float(f"{theta:.6g}"),
                                                                                       10000.0)
    assert (model["local_attention_window"], model["global_attention_every"]) == (16, 3)
    assert stored["sequence_parallel_size"] == 2 and model["attention"] == "ring" and stored["pack_samples"]
    steps = [json.loads(line) for line in (out / "log" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r.get("kind") == "train"]
    assert [r["iteration"] for r in steps] == [1, 2, 3] and all(0 < r["loss"] < 20 for r in steps)
    assert all(r["real_token_share"] > 0.9 for r in steps)  # packed: no padding

    exported = tmp_path / "hf-256"
    done = subprocess.run([PYTHON, str(ROOT / "tools" / "convert_checkpoint.py"), "to-hf", "--load", str(out / "ckpt"),
                           "--output", str(exported)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)  # the folder's own, carried through
    assert tokenizer("a test").input_ids[0] == HFTokenizer(out / "hf" / "tokenizer.json").cls
    hf_config = json.loads((exported / "config.json").read_text())
    assert hf_config["max_position_embeddings"] == LONGER
    hf = transformers.ModernBertForMaskedLM.from_pretrained(exported, attn_implementation="eager").eval()
    ours = BertModel(BertConfig(**{**model, "attention": "dense"}))
    ours.load_state_dict(bert_state_from_checkpoint(str(out / "ckpt")), strict=False)
    # both in fp32 with the same rope angles; the two sum attention in other orders (our tiles, transformers'
    # eager softmax over the whole row), which this peaked random model amplifies with depth and length:
    # measured 1.1e-5 (hidden) and 4e-5 (logits) at 256 tokens, hence the bounds above 1e-5
    hidden, logits = compare(ours.eval(), hf, LONGER, "extended")
    assert hidden < 3 * ATOL and logits < 10 * ATOL


def test_the_same_command_resumes_once_save_holds_a_checkpoint(extended, tmp_path, capsys, texts,  # noqa: F811
                                                                monkeypatch):
    """One more step: the resume restates the model the first run took from the folder (--load
    alone takes none from the checkpoint); another model, length or tokenizer is refused before the
    launcher starts; the same command run once more says the trainer's nothing-to-train line, unlaunched."""
    out, argv, _ = extended
    tail = argv[argv.index("--"):]
    tail[tail.index("--train-iters") + 1] = "4"
    tail[tail.index("--log-dir") + 1] = str(tmp_path / "log")
    head = argv[:argv.index("--")]
    head[head.index("--master-port") + 1] = str(free_port())
    result = run(*head, *tail)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"--load {out / 'ckpt'} " in result.stdout and "--init-from-hf" not in result.stdout
    assert f"resuming from {out / 'ckpt' / 'iter_0000003'} iteration 3" in result.stdout
    steps = [json.loads(line) for line in (tmp_path / "log" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in steps if r.get("kind") == "train"] == [4]
    first, resumed = (json.loads((log / "config.json").read_text())["model"] for log in (out / "log", tmp_path / "log"))
    assert resumed == first and latest_tag(str(out / "ckpt")) == "iter_0000004"

    launched = []
    monkeypatch.setattr(extend_context.os, "execve", lambda path, command, env: launched.append(command))
    capsys.readouterr()
    assert run_tool("extend_context.py", lambda: extend_context.main([*head, *tail])) == 0 and not launched
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"nothing to train: the run of checkpoint {out / 'ckpt' / 'iter_0000004'} is finished already at iteration 4 "
        f"of --train-iters 4; pass a larger --train-iters to train on")

    # a field the first run may have set after `--` (the window) is restated as --save holds it
    shutil.copytree(out / "ckpt" / "iter_0000004", tmp_path / "wider" / "iter_0000004")
    state = json.loads((tmp_path / "wider" / "iter_0000004" / "run_state.json").read_text())
    state["config"]["model"]["local_attention_window"] *= 2
    (tmp_path / "wider" / "iter_0000004" / "run_state.json").write_text(json.dumps(state))
    (tmp_path / "wider" / "latest").write_text("iter_0000004")
    wider = [*head, "--", "--train-iters", "5", "--data-path", tail[tail.index("--data-path") + 1]]
    wider[wider.index("--save") + 1] = str(tmp_path / "wider")
    capsys.readouterr()
    assert run_tool("extend_context.py", lambda: extend_context.main(["--dry-run", *wider])) == 0
    assert f"--local-attention-window {state['config']['model']['local_attention_window']} " in capsys.readouterr().out

    theta = float(f"{10000 * 4 ** (16 / 14):.6g}")
    assert f"rerun with --rotary-base {theta} or choose" in one_line(capsys, *head, "--rotary-base", "20000")
    other = tiny_modernbert(tmp_path / "other", DEFAULT_VOCAB_SIZE)
    assert one_line(capsys, *head, "--from", str(other)) == (
        f"the checkpoint in --save was extended from {(out / 'hf').resolve()}, --from {other} holds another model; "
        f"rerun with --from {(out / 'hf').resolve()} or choose a new --save")
    train_bpe(texts[:200], ["[UNK]", "[MASK]", "[SEP]", "[PAD]", "[CLS]"], 300).save(str(tmp_path / "other.json"))
    assert "differs from" in one_line(capsys, *head, "--", "--train-iters", "5", "--tokenizer-file",
                                      str(tmp_path / "other.json"))
    head[head.index("--seq-length") + 1] = str(2 * LONGER)
    assert one_line(capsys, *head) == (f"the checkpoint in --save was extended to {LONGER} tokens; rerun with "
                                       f"--seq-length {LONGER} or choose a new --save")


def test_a_checkpoint_continues_from_its_weights_as_a_new_run(extended, tmp_path, capsys):
    """The run above (trained at 256) as the source: --load --finetune starts at iteration 0 at 4x again,
    theta scaled from the checkpoint's, the tokenizer the checkpoint carries. At its own length (1x), the
    new run at a lower rate that a NaN names in a run the tool launched (relaunch.new_run_fix), its theta is
    kept."""
    out, argv, _ = extended
    tail = argv[argv.index("--"):]
    tail[tail.index("--train-iters") + 1] = "1"
    tail[tail.index("--log-dir") + 1] = str(tmp_path / "log")
    result = run("--from", str(out / "ckpt"), "--seq-length", str(4 * LONGER), "--save", str(tmp_path / "ckpt"),
                 "--num-gpus", "2", "--master-port", str(free_port()), *tail)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"--load {out / 'ckpt'} --finetune" in result.stdout
    source = stored_config(str(out / "ckpt"), latest_tag(str(out / "ckpt")))["model"]
    stored = stored_config(str(tmp_path / "ckpt"), latest_tag(str(tmp_path / "ckpt")))["model"]
    assert latest_tag(str(tmp_path / "ckpt")) == "iter_0000001" and stored["seq_length"] == 4 * LONGER
    assert stored["rotary_base"] == float(f"{source['rotary_base'] * 4 ** (16 / 14):.6g}")
    command, _ = dry_run(capsys, "--from", str(out / "ckpt"), "--seq-length", str(LONGER), "--save",
                         str(tmp_path / "lower"), *tail, "--lr", "1e-5")
    assert f"--rotary-base {source['rotary_base']} " in command and " --launched-by extend_context.py " in command


def test_a_finished_resume_is_said_in_the_trainers_words(tmp_path):
    """The line the tool says instead of a launch (training.finished_resume) is the one the trainer exits 0 with
    (ended_run) for a checkpoint whose run ended at its length, else the one of its final evaluation again."""
    folder = tmp_path / "ckpt" / "iter_0000004"
    folder.mkdir(parents=True)
    (folder / "mp_rank_00_model_states.pt").touch()
    (tmp_path / "ckpt" / "latest").write_text("iter_0000004")
    args = argparse.Namespace(train_iters=4, train_samples=None)
    plan = StartPlan(str(tmp_path / "ckpt"), init_from_hf=None, finetune=False, weights_only=False)
    state = {"config": {"model": {}}, "iteration": 4, "consumed_samples": 32}
    (folder / "run_state.json").write_text(json.dumps(state))
    assert finished_resume(args, plan, 8) == ("nothing to train: the checkpoint is at iteration 4 of --train-iters 4; "
                                              "pass a larger --train-iters to train on")
    assert finished_resume(args, plan, 8, ended_only=True) is None
    (folder / "run_state.json").write_text(json.dumps({**state, RUN_ENDED: True}))
    assert finished_resume(args, plan, 8) == finished_resume(args, plan, 8, ended_only=True) == (
        f"nothing to train: the run of checkpoint {folder} is finished already at iteration 4 of --train-iters 4; "
        f"pass a larger --train-iters to train on")
    assert finished_resume(argparse.Namespace(train_iters=5, train_samples=None), plan, 8) is None


def one_line(capsys, *argv) -> str:
    """The error line of the tool run in this process with --dry-run (exit 2, nothing else on stderr, and no
    note on stdout about a run that does not start)."""
    capsys.readouterr()
    assert run_tool("extend_context.py", lambda: extend_context.main(["--dry-run", *argv])) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("extend_context.py: error: ") and not captured.out, captured
    return lines[0].removeprefix("extend_context.py: error: ")


def test_what_cannot_be_extended_is_one_line(tmp_path, capsys):
    source = tiny_modernbert(tmp_path / "hf", DEFAULT_VOCAB_SIZE)
    bert = tmp_path / "bert"
    transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                                         num_attention_heads=2, intermediate_size=64)).save_pretrained(bert)
    # a trainer checkpoint of a classic BERT
    learned = fake_checkpoint(tmp_path / "learned", {"position_embedding_type": "learned", "seq_length": 64})
    (tmp_path / "only_config").mkdir()
    (tmp_path / "only_config" / "config.json").write_text((source / "config.json").read_text())
    (tmp_path / "a_file").write_text("x")
    hybrid_no_size, hybrid_text_size = tmp_path / "hybrid.json", tmp_path / "hybrid_text.json"
    hybrid_no_size.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "sequence_parallel": {"attention": "hybrid"}}))
    hybrid_text_size.write_text(json.dumps({"sequence_parallel": {"attention": "hybrid", "ulysses_size": "2"}}))
    dense = tmp_path / "dense.json"
    dense.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "sequence_parallel": {"attention": "dense"}}))
    pipeline = tmp_path / "pp2.json"
    pipeline.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "pipeline": {"stages": 2},
                                    "zero_optimization": {"stage": 1}, "sequence_parallel": {"attention": "ring"}}))
    save = str(tmp_path / "c")
    unnamed = fake_checkpoint(tmp_path / "unnamed", {})  # a --save whose `latest` was lost
    (unnamed / "latest").unlink()
    hf = ["--from", str(source), "--seq-length", "256"]
    python = python_command()  # the interpreter a hint names (.venv/bin/python from the repository)
    for argv, message in (
            (["--from", str(source), "--seq-length", str(TRAINED * 128), "--save", save], "pick 1 to 64 times 64"),
            (["--from", str(tmp_path), "--seq-length", "256", "--save", save], "is neither a Hugging Face folder"),
            (["--from", str(bert), "--seq-length", "2048", "--save", save],
             f"has learned positions, not rotary ones; extend a learned-position BERT with {python} pretrain_bert.py "
             f"--init-from-hf {bert} --max-position-embeddings N"),
            (["--from", str(learned), "--seq-length", "2048", "--save", save],
             f"with {python} tools/convert_checkpoint.py to-hf --load {learned} --output HF, then {python} "
             "pretrain_bert.py --init-from-hf HF --max-position-embeddings N"),
            (["--from", str(tmp_path / "missing"), "--seq-length", "256", "--save", save], "missing does not exist"),
            (["--from", "", "--seq-length", "256", "--save", save], "--from is given an empty value ('')"),
            ([*hf, "--save", ""], "--save is given an empty value (''); pass --save a value (an unset shell variable"),
            (["--from", str(learned / "iter_0000001"), "--seq-length", "256", "--save", save],
             f"iter_0000001 is one checkpoint of the --save directory {learned}; point --from at {learned} "),
            (["--from", str(source / "config.json"), "--seq-length", "256", "--save", save],
             "config.json is a file; pass the folder holding it"),
            (["--from", str(tmp_path / "only_config"), "--seq-length", "256", "--save", save],
             "holds config.json but no weights"),
            ([*hf, "--save", save, "--num-gpus", "0"], "--num-gpus 0 must be >= 1"),
            ([*hf, "--save", save, "--num-gpus", "2", "--sequence-parallel-size", "3"],
             "--sequence-parallel-size 3 does not divide the 2 ranks; pass --num-gpus a multiple of 3, or a "
             "--sequence-parallel-size that divides 2"),
            ([*hf, "--save", save, "--deepspeed-config", str(ROOT / "ds_configs" / "linformer_sp2.json")],
             "sets up linformer attention, and extend_context.py runs ring, ulysses or hybrid (sequence-parallel, "
             "exact, and what the local layers need); pass a JSON without sequence_parallel.linformer and with one of "
             "them, such as ds_configs/ring_sp2.json"),
            ([*hf, "--save", save, "--deepspeed-config", str(dense)],  # named, so not replaced by the default ring
             "sets up dense attention, and extend_context.py runs ring, ulysses or hybrid (sequence-parallel, exact, "
             "and what the local layers need); pass --attention ring/ulysses/hybrid, or a JSON with one of them"),
            ([*hf, "--save", save, "--num-gpus", "3", "--deepspeed-config", str(pipeline)],
             "the JSON's 2 pipeline stages do not divide the 3 ranks; pass --num-gpus a multiple of 2"),
            ([*hf, "--save", save, "--num-gpus", "4", "--sequence-parallel-size", "4", "--deepspeed-config",
              str(pipeline)], "--sequence-parallel-size 4 x the JSON's 2 pipeline stages does not divide the 4 ranks; "
             "pass --num-gpus a multiple of 8, or a --sequence-parallel-size that divides 2"),
            # the pipeline given after -- is the run's as the JSON's is: in this tool's options, not the trainer's
            # "launch a multiple of sp*pp processes" about an SP size the user never set
            ([*hf, "--save", save, "--num-gpus", "3", "--", "--train-iters", "1", "--pipeline-model-parallel-size",
              "2"], "the 2 pipeline stages of --pipeline-model-parallel-size after -- do not divide the 3 ranks; pass "
             "--num-gpus a multiple of 2"),
            ([*hf, "--save", save, "--deepspeed-config", str(tmp_path / "missing.json")],
             "pass an existing JSON file to --deepspeed-config"),
            # the JSON's hybrid attention against --attention ring, or without the group size the tool passes
            ([*hf, "--save", save, "--attention", "ring", "--deepspeed-config", str(ROOT / "ds_configs" /
                                                                                    "hybrid_sp4.json")],
             "--attention ring contradicts the sequence_parallel.ulysses_size 2 of --deepspeed-config "
             f"{ROOT / 'ds_configs' / 'hybrid_sp4.json'}; pass --attention hybrid --ulysses-size 2 to extend_context.py"),
            ([*hf, "--save", save, "--deepspeed-config", str(hybrid_no_size)],
             "runs hybrid attention without ulysses_size; pass --ulysses-size N (ranks per all-to-all group) to "
             "extend_context.py"),
            ([*hf, "--save", save, "--deepspeed-config", str(hybrid_text_size)],
             'sequence_parallel.ulysses_size = "2" is not an integer'),
            ([*hf, "--save", str(tmp_path / "a_file")], "a_file is a file; pass a folder"),
            ([*hf, "--save", str(source)], "--save is the --from folder; choose another --save"),
            ([*hf, "--save", str(source / "ext")], f"--save {source / 'ext'} is inside the --from folder {source}; "
                                                     f"choose a --save outside {source}"),
            ([*hf, "--save", save, "--master-port", "99999"], "--master-port 99999 is not a TCP port; pass a free"),
            ([*hf, "--save", save, "--data-path", "x"], "--data-path is a pretrain_bert.py flag, given before --; put it "
             "after --"),
            # a trainer flag before --save made the rest a remainder: `required: --save`, though given
            (["--from", str(source), "--seq-length", "128", "--data-path", "x", "--save", save, "--dry-run"],
             "--data-path is a pretrain_bert.py flag, given before --"),
            # this tool's required options after --: `required: --seq-length, --save`, not where they go
            (["--from", str(source), "--", "--data-path", "x", "--seq-length", "128", "--save", save],
             "--seq-length after -- would override what extend_context.py sets; pass --seq-length to extend_context.py "
             "(before --)"),
            # what the tool sets, given again after --, abbreviated as argparse takes it: refused, not overridden
            ([*hf, "--save", save, "--", "--train-iters", "1", "--seq-len", "128"],
             "--seq-len (for --seq-length) after -- would override what extend_context.py sets; pass --seq-length to "
             "extend_context.py (before --)"),
            ([*hf, "--save", save, "--", "--save=other"], "--save after -- would override"),
            ([*hf, "--save", save, "--", "--no-pack-samples"], "; drop --no-pack-samples"),
            ([*hf, "--save", save, "--", "--launched-by", "extend_context.py"], "; drop --launched-by"),
            # the trainer's line names this tool's command (--launched-by), which resumes once `latest` is back
            ([*hf, "--save", str(unnamed), "--", "--train-iters", "1"],
             f"write the tag to resume into {unnamed / 'latest'} (the newest: iter_0000001) and rerun the same "
             "extend_context.py command, or choose another --save directory to start afresh"),
            # the trainer's own start-up checks, on the command the launcher would get
            ([*hf, "--save", save], "the run length is not set"),
            # the LR schedule against the run's length (the trainer's Schedule, reached only after its rendezvous)
            ([*hf, "--save", save, "--", "--train-iters", "100", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters",
              "200"], "--lr-wsd-decay-iters 200 is longer than the 99 steps between the warm-up's end (1) and the "
             "decay's (100); pass a --lr-wsd-decay-iters of at most 99"),
            ([*hf, "--save", save, "--", "--train-iters", "10", "--lr-warmup-iters", "5", "--lr-decay-iters", "3"],
             "--lr-decay-iters 3 ends the decay before the 5 warm-up steps do"),
            ([*hf, "--save", save, "--", "--train-iters", "1", "--data-pth", "x"],
             "pretrain_bert.py flags after --: unrecognized arguments: --data-pth x"),
            ([*hf, "--save", save, "--num-gpus", "3", "--attention", "hybrid", "--ulysses-size", "3", "--",
              "--train-iters", "1"], "hybrid needs num_attention_heads (4) divisible by ulysses_size (3)"),
            # the weights fix the head count: no "head count for a model from scratch" among the ways out
            ([*hf, "--save", save, "--num-gpus", "3", "--attention", "ulysses", "--", "--train-iters", "1"],
             "ulysses needs num_attention_heads (4) divisible by the sequence-parallel size (3); use --attention ring, "
             "or a --sequence-parallel-size that divides the 4 heads (2 or 4) and the ranks\n")):
        assert message in one_line(capsys, *argv) + "\n"
    assert not (tmp_path / "c").exists()
    capsys.readouterr()  # a missing flag: argparse's line, with no usage block before it (as in every tool)
    with pytest.raises(SystemExit, match="^2$"):
        extend_context.main(["--dry-run", *hf])
    assert capsys.readouterr().err.splitlines() == [
        "extend_context.py: error: the following arguments are required: --save; see extend_context.py --help"]
    # without GPUs and --num-gpus: one sequence-parallel group (2 by default) per pipeline stage
    piped = [*hf, "--save", save, "--deepspeed-config", str(pipeline), "--", "--train-iters", "1"]
    assert run_tool("extend_context.py", lambda: extend_context.main(["--dry-run", *piped])) == 0
    assert "--num_gpus 4 " in capsys.readouterr().out
    for argv in ([*hf, "--save", save, "--", "--train-iters", "1", "--pipeline-model-parallel-size", "2"],
                 [*hf, "--save", save, "--num-gpus", "4", "--", "--train-iters", "1", "--pipeline-model-parallel-size",
                  "2"]):  # the same from the flag after --: SP is the ranks per stage, not all of them
        command, _ = dry_run(capsys, *argv)
        assert "--num_gpus 4 " in command and "--sequence-parallel-size 2 " in command


def dry_run(capsys, *argv) -> tuple[str, list]:
    """(the launch command, the stderr lines) of a dry run that passes."""
    capsys.readouterr()
    assert run_tool("extend_context.py", lambda: extend_context.main(["--dry-run", *argv])) == 0
    captured = capsys.readouterr()
    return captured.out.splitlines()[-1], captured.err.splitlines()


def test_the_attention_comes_from_the_json_unless_given(tmp_path, capsys):
    """ds_configs/hybrid_sp4.json without --attention runs its hybrid attention and Ulysses groups
    (the tool's default ring used to override the first and then refuse the second, saying to edit the
    JSON), ulysses_sp2.json its Ulysses (it ran ring without a word); --attention and --ulysses-size still
    override the JSON, as documented."""
    source = tiny_modernbert(tmp_path / "hf", DEFAULT_VOCAB_SIZE)
    argv = ["--from", str(source), "--seq-length", "256", "--save", str(tmp_path / "ext"), "--deepspeed-config",
            str(ROOT / "ds_configs" / "hybrid_sp4.json")]
    command, _ = dry_run(capsys, *argv, "--", "--train-iters", "1")
    assert " --attention hybrid --ulysses-size 2 " in command
    command, _ = dry_run(capsys, *argv, "--ulysses-size", "1", "--", "--train-iters", "1")
    assert " --attention hybrid --ulysses-size 1 " in command
    ulysses = [*argv[:-1], str(ROOT / "ds_configs" / "ulysses_sp2.json"), "--", "--train-iters", "1"]
    assert " --attention ulysses --seq-length " in dry_run(capsys, *ulysses)[0]  # was replaced by ring silently
    assert " --attention ring " in dry_run(capsys, *ulysses[:-3], "--attention", "ring", *ulysses[-3:])[0]


def test_the_dry_run_refuses_a_precision_this_device_lacks(tmp_path, capsys):
    """fp16 on a CPU without its kernels: the trainer refuses it at start-up, so the dry run does too."""
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().is_fp16_supported():
        pytest.skip("this device runs fp16")
    source = tiny_modernbert(tmp_path / "hf", DEFAULT_VOCAB_SIZE)
    (tmp_path / "ds.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}}))
    assert one_line(capsys, "--from", str(source), "--seq-length", "256", "--save", str(tmp_path / "ext"),
                    "--deepspeed-config", str(tmp_path / "ds.json"), "--", "--train-iters", "1").startswith(
        "fp16.enabled is true but DeepSpeed does not support fp16 on this cpu device")


def test_a_rotary_base_below_the_models_is_a_warning_naming_the_scaled_one(tmp_path, capsys):
    """A theta below the model's makes the slow rotations faster, the opposite of an extension (or a
    local theta given for the global one): said in a line, with the scaled default; not refused, since
    fine-tuning at a smaller base is a method of its own. At or above the model's, nothing is said."""
    source = tiny_modernbert(tmp_path / "hf", DEFAULT_VOCAB_SIZE)
    argv = ["--from", str(source), "--seq-length", "256", "--save", str(tmp_path / "ext")]
    tail = ["--", "--train-iters", "1"]
    scaled = f"{10000 * 4 ** (16 / 14):.6g}"
    command, warnings = dry_run(capsys, *argv, "--rotary-base", "100", *tail)
    assert "--rotary-base 100.0 " in command
    assert warnings == ["warning: --rotary-base 100 is below the model's global rope theta 10000: its slowest "
                        "rotations turn faster, not slower as an extension's do; drop --rotary-base for the scaled "
                        f"{scaled}"]
    for theta in ("10000", "20000"):
        assert dry_run(capsys, *argv, "--rotary-base", theta, *tail)[1] == []
    assert dry_run(capsys, *argv, *tail) == (dry_run(capsys, *argv, "--rotary-base", scaled, *tail)[0], [])


def test_the_dry_run_prints_the_notes_the_launched_run_gives_on_its_model_and_layout(tmp_path, capsys, monkeypatch):
    """The trainer's start-up notes on the resolved model and layout (training.start_notes: dropout per
    layout, a window that is not local, a model to-hf would refuse), which rank 0 prints once launched,
    come out in the dry run too, with the others it holds until its checks pass; a launch leaves them to
    the run."""
    source = tiny_modernbert(tmp_path / "hf", DEFAULT_VOCAB_SIZE)
    argv = ["--from", str(source), "--seq-length", "256", "--save", str(tmp_path / "ext"), "--num-gpus", "2",
            "--", "--train-iters", "1", "--hidden-dropout", "0.1", "--local-attention-window", "600"]
    capsys.readouterr()
    assert run_tool("extend_context.py", lambda: extend_context.main(["--dry-run", *argv])) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    starts = ("note: --rotary-base ", "note: --local-attention-window 600 replaces",
              "note: dropout (hidden 0.1, attention 0) draws its masks per layout: this sequence-parallel 2 run",
              "note: --local-attention-window 600 (300 tokens each side) is not below")
    assert len(notes) == len(starts) and all(map(str.startswith, notes, starts)), notes
    launched = []
    monkeypatch.setattr(extend_context.os, "execve", lambda path, command, env: launched.append(command))
    assert run_tool("extend_context.py", lambda: extend_context.main(argv)) == 0 and launched
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]


def test_a_resume_with_another_from_is_refused_naming_both(tmp_path, capsys, monkeypatch):
    """The checkpoint in --save records what the first run started from (path and a hash of the config and
    weights); a resume from a copy elsewhere goes on, from other weights of the same shapes it stops in
    one line. The launch itself writes nothing into --save (a run that fails before its first save leaves
    no record of a start). A --save without that record (another run) is compared by the model's fields,
    the first that differs named before a length or theta."""
    source = tiny_modernbert(tmp_path / "hf", DEFAULT_VOCAB_SIZE)
    save = tmp_path / "ext"
    argv = ["--from", str(source), "--seq-length", "256", "--save", str(save), "--", "--train-iters", "1"]
    assert run_tool("extend_context.py", lambda: extend_context.main(["--dry-run", *argv])) == 0
    assert not save.exists()
    launched = []
    monkeypatch.setattr(extend_context.os, "execve", lambda path, command, env: launched.append(command))
    assert run_tool("extend_context.py", lambda: extend_context.main(argv)) == 0 and launched
    assert not save.exists()
    # what the first run saved (the tool reads no more of it before check_source)
    fake_checkpoint(save, {}, {"from": str(source.resolve()), "kind": "hf",
                               "sha256": extend_context.hf_io.weights_fingerprint(source, "hf")})
    extend_context.check_source(argparse.Namespace(source=str(shutil.copytree(source, tmp_path / "copy")),
                                                   save=str(save)), "hf")
    other = other_weights(shutil.copytree(source, tmp_path / "other"))
    with_other = [*argv[:1], str(other), *argv[2:]]
    assert one_line(capsys, *with_other) == (f"the checkpoint in --save was extended from {source.resolve()}, --from "
                                             f"{other} holds another model; rerun with --from {source.resolve()} or "
                                             "choose a new --save")
    other_weights(source)
    assert one_line(capsys, *argv).startswith(f"--from {source} has changed since the checkpoint in --save was "
                                              "extended from it")

    fields = extend_context.source_fields(argparse.Namespace(source=str(source)), "hf")
    plain = fake_checkpoint(tmp_path / "plain", {**fields, "num_layers": 2, "seq_length": 256, "rotary_base": 1e4})
    assert one_line(capsys, *argv[:5], str(plain)) == (f"the checkpoint in --save is of a model with num_layers 2, "
                                                       f"--from {source} has 3: --save holds another run's checkpoint; "
                                                       "choose a new --save (or, if it is an extension, rerun with "
                                                       "the --from it started from)")
    # a run from scratch of the same shapes records no source: it is no extension of --from, whatever its fields
    scratch = fake_checkpoint(tmp_path / "scratch", {**fields, "seq_length": 256}, {"from": None, "run_id": "r"})
    assert one_line(capsys, *argv[:5], str(scratch)) == (f"--save {scratch} holds the checkpoint of a run that "
                                                         f"started from random weights, not from --from {source}; "
                                                         f"choose a new --save (resume that run with "
                                                         f"pretrain_bert.py --load {scratch})")


FAKE_RUNNER = """import os, signal, subprocess, sys, time
if os.environ["STOP_AT"] == "runner import":  # Ctrl-C while the runner imports torch
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
EXPORT_ENVS = ["NCCL", "PYTHON"]  # deepspeed_command adds the launch script's variable


def main():  # starts launch.py as DeepSpeed's runner does
    sys.exit(subprocess.Popen([sys.executable, "-u", "-m", "deepspeed.launcher.launch", "--world_info=x"]).wait())
"""
FAKE_LAUNCH = """import os, signal, sys, time
print("launch.py", sys.argv[1:], flush=True)
if os.environ["STOP_AT"].startswith("launch import"):  # a terminal's Ctrl-C reaches the runner and launch.py
    if os.environ["STOP_AT"] == "launch import":  # else launch.py ends first, as on a loaded machine, where the
        os.kill(os.getppid(), signal.SIGINT)  # runner passes its exit code on before it handles its own signal
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)


def main():
    pass
"""


def test_ctrl_c_while_the_launcher_starts_is_one_line(tmp_path, monkeypatch):
    """The process the tool hands over to: Ctrl-C in the seconds after the command is printed, while
    DeepSpeed's runner and then its launch.py import torch, used to be a KeyboardInterrupt traceback.
    A stand-in `deepspeed` package (runner.py, launch.py, the signal sent where torch's import would
    be), so that the moment is exact and no torch is imported; the real runner is test_signals'."""
    from deepspeed.launcher import runner

    # the stand-in starts launch.py as the pinned DeepSpeed's runner does, which deepspeed_command relies on
    assert 'sys.executable, "-u", "-m", "deepspeed.launcher.launch"' in inspect.getsource(runner.main)
    assert isinstance(runner.EXPORT_ENVS, list)
    source = tiny_modernbert(tmp_path / "hf", DEFAULT_VOCAB_SIZE)
    launched = []
    monkeypatch.setattr(extend_context.os, "execve", lambda path, command, env: launched.append((command, env)))
    argv = ["--from", str(source), "--seq-length", "256", "--save", str(tmp_path / "ext"), "--", "--train-iters", "1"]
    assert run_tool("extend_context.py", lambda: extend_context.main(argv)) == 0
    command, env = launched[0]
    fake = tmp_path / "fake" / "deepspeed" / "launcher"
    fake.mkdir(parents=True)
    for package in (fake.parent, fake):
        (package / "__init__.py").write_text("")
    (fake / "runner.py").write_text(FAKE_RUNNER)
    (fake / "launch.py").write_text(FAKE_LAUNCH)
    for stop, code, stdout, stderr in (
            ("never", 0, ["launch.py ['--world_info=x']"], []),
            ("runner import", 130, [], ["deepspeed: stopped by SIGINT during start-up, before any rank started; "
                                        "nothing was saved"]),
            *((stop, 130, ["launch.py ['--world_info=x']"],
               ["deepspeed: stopped by SIGINT; ranks it had started stop on their own, each saying what it saved"])
              for stop in ("launch import", "launch import, runner later"))):
        done = subprocess.run(command, env={**env, "PYTHONPATH": f"{tmp_path / 'fake'}{os.pathsep}{ROOT}",
                                            "STOP_AT": stop}, capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout.splitlines(), done.stderr.splitlines()) == (code, stdout, stderr), stop


def test_the_dry_run_checks_the_tokenizer_and_the_data_as_the_run_does(tmp_path, capsys, texts,  # noqa: F811
                                                                       modernbert_style):  # noqa: F811
    """What the launched run refuses at once (the tokenizer it takes, the data's vocab and files, a
    tokenizer larger than the model) is refused before the launcher, in the trainer's own words."""
    size = HFTokenizer(modernbert_style).vocab_size
    folder = tiny_modernbert(tmp_path / "hf", size, modernbert_style)
    smaller = tiny_modernbert(tmp_path / "smaller", size - 1, modernbert_style)
    no_tokenizer = tiny_modernbert(tmp_path / "no_tokenizer", size)
    train_bpe(texts[:200], ["[UNK]", "[MASK]", "[SEP]", "[PAD]", "[CLS]"], 300).save(str(tmp_path / "other.json"))
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts[:20]))
    preprocess(PreprocessOptions(input=str(tmp_path / "corpus.jsonl"), output_prefix=str(tmp_path / "other"),
                                 tokenizer_file=str(tmp_path / "other.json"), split_sentences=True))
    tail = ["--", "--train-iters", "1", "--data-path"]
    for source, data, message in (
            (no_tokenizer, "x", f"--init-from-hf folder {no_tokenizer} holds no vocab.txt or tokenizer.json"),
            # the fix names the data's tokenizer, as its vocab record does, and where this tool's command takes it
            (no_tokenizer, str(tmp_path / "other_text_sentence"), f"holds no vocab.txt or tokenizer.json; pass "
             f"--tokenizer-file {tmp_path / 'other.json'}, the tokenizer the data's vocab record names, after the -- "
             "of the extend_context.py command"),
            (folder, str(tmp_path / "other_text_sentence"), f"preprocessed with the vocab {tmp_path / 'other.json'}"),
            (folder, str(tmp_path / "missing"), f"dataset file {tmp_path / 'missing'}.idx does not exist"),
            (smaller, str(tmp_path / "missing"), f"the tokenizer {smaller / 'tokenizer.json'} has {size} tokens, the "
             f"model's vocab_size is {size - 1}; pass the --vocab-file (or --tokenizer-file) the model was trained")):
        argv = ["--from", str(source), "--seq-length", "256", "--save", str(tmp_path / "ext"), *tail, data]
        assert message in one_line(capsys, *argv)
    # no --data-path: the trainer would build the default dataset, of its own WordPiece vocab, first
    argv = ["--from", str(folder), "--seq-length", "256", "--save", str(tmp_path / "ext"), "--", "--train-iters", "1",
            "--default-data-dir", str(tmp_path / "default")]
    assert one_line(capsys, *argv) == (
        f"no --data-path: the run would train on the default dataset, made with the vocab {EMBEDDED_VOCAB}, while its "
        f"tokenizer is {folder / 'tokenizer.json'}; pass --data-path with data preprocessed with it "
        f"(tools/preprocess_data.py --tokenizer-file {folder / 'tokenizer.json'} ...)")
    # weights without a tokenizer would train on the default vocab, refused once built when it outgrows them
    argv[1] = str(no_tokenizer)
    assert one_line(capsys, *argv) == (
        f"no --data-path, and the weights carry no tokenizer: the run would train on the default dataset, whose vocab "
        f"{EMBEDDED_VOCAB} has {DEFAULT_VOCAB_SIZE} tokens, more than the model's vocab_size {size}; pass the "
        "tokenizer the weights were trained with (--tokenizer-file or --vocab-file) and --data-path with data "
        "preprocessed with it")
    assert not (tmp_path / "default").exists()


def test_a_run_from_weights_longer_than_they_trained_at_names_the_recipe(tmp_path, capsys):
    """--init-from-hf of rope weights at 4x their length and their own theta trains (extrapolation is
    a choice) with one line naming extend_context.py; a new theta says only that it replaces theirs, their
    own length nothing."""
    from megatron import start_plan, starting_weights
    from megatron.arguments import build_parser

    folder = tiny_modernbert(tmp_path / "hf", 512)
    lines = {}
    for name, extra in {"longer": ["--seq-length", str(LONGER)], "new theta": ["--seq-length", str(LONGER),
                        "--rotary-base", "40000"], "trained length": ["--seq-length", str(TRAINED)]}.items():
        args = build_parser().parse_args(["--init-from-hf", str(folder), *extra])
        flags = starting_weights.model_flags(args, {}, start_plan.StartPlan.given(args))
        assert flags["seq_length"] == int(extra[1])
        lines[name] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert lines["longer"] == [f"note: --seq-length {LONGER} is 4x the {TRAINED} tokens the --init-from-hf folder "
                               f"{folder} was trained at, with its global rope theta 10000: the model extrapolates; "
                               "tools/extend_context.py continues at a longer length with a scaled theta "
                               "(docs/hugging-face.md), or pass --rotary-base"], lines
    assert lines["new theta"] == [f"note: --rotary-base 40000.0 replaces the global rope theta 10000 of the "
                                  f"--init-from-hf folder {folder}"]  # the theta's own line, not the recipe's
    assert lines["trained length"] == []


def test_a_checkpoint_continued_longer_than_its_weights_counts_as_trained_at_its_latest_length(tmp_path, capsys):
    """A checkpoint of a run that continued rotary weights at a longer length (64 -> 128: it stores the
    weights' max_position_embeddings 64 and seq_length 128) was trained at 128: extend_context.py scales
    from 128, a new run from its weights notes extrapolation past 128 only, and carries 128 as the length
    its own checkpoints declare (their export's max_position_embeddings), also when it trains shorter."""
    from megatron import start_plan, starting_weights
    from megatron.arguments import build_parser
    from test_hf_modernbert import modern_config

    model = vars(modern_config(seq_length=128, max_position_embeddings=64))
    source = fake_checkpoint(tmp_path / "ck", model, {"from": str(tmp_path / "short"), "kind": "checkpoint"})
    assert extend_context.trained_length(stored_config(str(source), latest_tag(str(source)))["model"],
                                         "checkpoint") == 128
    declared = {}
    for length in (96, 256):
        args = build_parser().parse_args(["--load", str(source), "--finetune", "--seq-length", str(length)])
        flags = starting_weights.model_flags(args, {}, start_plan.StartPlan.given(args))
        declared[length] = flags["max_position_embeddings"]
    assert declared == {96: 128, 256: 128}  # the export of a run at 256 declares 256 (hf_positions)
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == [f"note: --seq-length 256 is 2x the 128 tokens the checkpoint {source} was trained at, with its "
                     "global rope theta 2000: the model extrapolates; tools/extend_context.py continues at a longer "
                     "length with a scaled theta (docs/hugging-face.md), or pass --rotary-base"]


def test_a_from_folder_whose_only_save_did_not_finish_is_named_so(tmp_path):
    """--from a --save folder whose first save was killed (only iter_N.partial) was 'neither a Hugging Face
    folder nor a checkpoint folder'; it names the unfinished save, as fill_mask.py and to-hf do."""
    from megatron.errors import DataError

    (tmp_path / "iter_0000002.partial").mkdir()
    with pytest.raises(DataError, match=f"^no checkpoint in {tmp_path}: iter_0000002.partial is a save that did not "
                                        f"finish \\(interrupted\\); let the run that saves into {tmp_path} finish"):
        extend_context.source_model(str(tmp_path))
