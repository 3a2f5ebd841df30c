"""tools/ds_config.py: show / set / validate / diff round trips, one-line errors naming the key,
and the atomic write that leaves the file untouched on error."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import ds_config  # noqa: E402

RING = ROOT / "ds_configs" / "ring_sp2.json"
NO_DROPOUT = ["--attention-dropout", "0"]  # ring attention refuses dropout


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "ds.json"
    shutil.copy(RING, path)
    return path


def run(capsys, *argv) -> tuple:
    code = ds_config.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_show_resolves_defaults(capsys):
    code, out, _ = run(capsys, "show", RING, *NO_DROPOUT)
    shown = json.loads(out)
    assert code == 0
    assert shown["world_size"] == 2 and shown["sequence_parallel_size"] == 2 and shown["data_parallel_size"] == 1
    assert shown["model"]["attention"] == "ring" and shown["model"]["num_layers"] == 12  # a BertConfig default
    assert shown["global_batch_size"] == 4 and shown["ds_config"]["train_batch_size"] == 4


def test_show_gives_the_vocab_size_the_trainer_takes(capsys, tmp_path):
    """`show` printed BertConfig's 30522, which no run takes: the trainer takes its vocab file's size (else the
    default data's vocab's, built or embedded), --vocab-size over both."""
    from megatron.data.default_dataset import EMBEDDED_VOCAB

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghij"]) + "\n")
    embedded = len(EMBEDDED_VOCAB.read_text(encoding="utf-8").splitlines())
    for flags, size in ((["--default-data-dir", tmp_path / "unbuilt"], embedded), (["--vocab-file", vocab], 15),
                        (["--default-data-dir", tmp_path], 15), (["--vocab-file", vocab, "--vocab-size", 40], 40)):
        code, out, _ = run(capsys, "show", RING, *NO_DROPOUT, *flags)
        assert (code, json.loads(out)["model"]["vocab_size"]) == (0, size), flags
    for value in (0, -5):  # 0 was taken for "not given" (the vocab file's size shown), -5 refused
        code, out, err = run(capsys, "show", RING, *NO_DROPOUT, "--vocab-file", vocab, "--vocab-size", value)
        assert (code, out, err) == (2, "", f"ds_config.py: error: vocab_size = {value} must be positive; set "
                                           "--vocab-size to an integer >= 1\n")


def test_set_is_typed_and_round_trips(capsys, config):
    code, _, _ = run(capsys, "set", config, "sequence_parallel.attention=bigbird", "sequence_parallel.size=4",
                     "sequence_parallel.bigbird.block_size=32", "bf16.enabled=true", "train_batch_size=16",
                     "gradient_accumulation_steps=null", "--world-size", 8, *NO_DROPOUT)
    written = json.loads(config.read_text())
    assert code == 0
    assert written["sequence_parallel"] == {"size": 4, "attention": "bigbird", "bigbird": {"block_size": 32}}
    assert written["bf16"] == {"enabled": True} and written["gradient_accumulation_steps"] is None
    code, out, _ = run(capsys, "show", config, "--world-size", 8, *NO_DROPOUT)
    shown = json.loads(out)
    assert (shown["model"]["bigbird_block_size"], shown["data_parallel_size"]) == (32, 2)
    assert shown["gradient_accumulation_steps"] == 2  # 16 = micro 4 x grad-acc 2 x data 2


def test_set_to_output_leaves_the_template(capsys, tmp_path):
    output, template = tmp_path / "ds.json", RING.read_text()
    code, _, _ = run(capsys, "set", RING, "zero_optimization.stage=2", "-o", output, *NO_DROPOUT)
    assert code == 0 and RING.read_text() == template
    assert json.loads(output.read_text())["zero_optimization"]["stage"] == 2
    code, out, _ = run(capsys, "diff", RING, output)
    assert (code, out) == (1, "zero_optimization.stage: 1 -> 2\n")
    assert run(capsys, "diff", RING, RING)[:2] == (0, "")


@pytest.mark.parametrize("assignment", ["zero_optimization.stage=2", "train_batch_size=8"])
def test_set_makes_no_folder_for_a_mistyped_output(capsys, tmp_path, assignment):
    """-o in a folder that does not exist is refused, as `cp` refuses it: a typo leaves no folders behind. The
    error is the only line: the note of a batch key made null (train_batch_size=8) came first, though nothing
    was set."""
    output = tmp_path / "runz" / "deep" / "ds.json"
    code, _, err = run(capsys, "set", RING, assignment, "-o", output, *NO_DROPOUT)
    assert code == 2 and err == (f"ds_config.py: error: output {output}: its folder {output.parent} does not exist; "
                                 f"check the path, or create the folder first (mkdir -p {output.parent})\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("assignments,message", [
    (["zero_optimization.stage=\"2\""], 'zero_optimization.stage = "2" is not an integer'),
    (["sequence_parallel.size=3"], "sequence_parallel.size 3 x pipeline 1 does not divide the world size 2"),
    (["sequence_parallel.atention=ulysses"], "unknown key sequence_parallel.atention"),
    (["pipeline.num_stages=2"], "unknown key pipeline.num_stages; did you mean 'stages'? use one of: "),
    (["zero_optimization.stage.x=1"], "zero_optimization.stage holds 1, not an object"),
    (["train_batch_size=6"], "train_batch_size 6 is not a multiple of train_micro_batch_size_per_gpu 4 x data-parallel "
                             "size 1 (= world / (pp x sp)) = 4; make train_batch_size a multiple of 4"),
    (["sequence_parallel.size"], "'sequence_parallel.size' is not key.path=value"),
    (["zero_optimization.stage=4"], "zero_optimization.stage 4 is not a ZeRO stage; set zero_optimization.stage to 0, "
                                    "1, 2 or 3"),
    (["fp16.enabled=true", "bf16.enabled=true"], "fp16.enabled and bf16.enabled are both true; pick one"),
    (["fp16.loss_scale=-1"], "fp16.loss_scale = -1 is not a number >= 0; set fp16.loss_scale to 0 (dynamic"),
    (["scheduler.type=WarmupLR"], '"scheduler" section is not used (the trainer runs Megatron\'s warm-up + decay'),
    (["checkpoint.writer.decoupled=true"], "checkpoint.writer cannot be used: the trainer stages each checkpoint"),
    (["checkpoint.load_universal=true"], "checkpoint.load_universal cannot be used: the trainer resumes its "
                                         "checkpoints in any layout itself"),
    (["zero_optimization.zero_quantized_gradients=true"], "zero_optimization.zero_quantized_gradients works at ZeRO "
                                                          "stage 3 only and does nothing at stage 1; remove"),
    (["data_efficiency.data_routing.random_ltd.enabled=true"], 'the DeepSpeed JSON\'s "data_efficiency" section is '
                                                               "not used (the trainer builds its own samples"),
    (["optimizer.type=SGD"], "optimizer.type SGD is not one DeepSpeed has tested with ZeRO (zero_optimization.stage "
                             '1), and it refuses it; add "zero_allow_untested_optimizer": true'),
])
def test_bad_set_names_the_key_and_writes_nothing(capsys, config, assignments, message):
    before = config.read_text()
    code, _, err = run(capsys, "set", config, "--world-size", 2, *assignments, *NO_DROPOUT)
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert config.read_text() == before
    assert [p.name for p in config.parent.iterdir()] == ["ds.json"]  # no temporary file left


def test_script_names_name_the_launch_scripts_arguments(capsys):
    """bert_common.sh writes its JSON with `set --script-names`: an error names its positional arguments (GLOBAL_BATCH,
    LAYERS), not the flags it refuses after them or the JSON keys it writes itself."""
    argv = ["validate", RING, "--world-size", 4, "--pipeline-model-parallel-size", 2, "--num-layers", 1, *NO_DROPOUT]
    code, _, err = run(capsys, *argv, "--script-names", "bert_distributed.sh")  # the script the user ran, named
    assert code == 2 and err.strip() == ("bert_distributed.sh: error: PP 2 is more pipeline stages than the 1 "
                                         "transformer layer: a stage would hold no transformer layer; pass PP 1, or "
                                         "pass LAYERS 2 or more"), err
    assert "--pipeline-model-parallel-size 2 is more" in run(capsys, *argv)[2]  # the tool's own names without it
    code, _, err = run(capsys, "set", RING, "train_batch_size=6", "--world-size", 4, "--script-names", "x.sh",
                       *NO_DROPOUT)
    assert err.startswith("x.sh: error: GLOBAL_BATCH 6 is not a multiple of MICRO_BATCH 4 x data-parallel size 2"), err


def test_validate_checks_the_layout_at_a_world_size(capsys):
    code, out, _ = run(capsys, "validate", RING, "--world-size", 8, "--pipeline-model-parallel-size", 2, *NO_DROPOUT)
    assert code == 0 and "pipeline 2 x data 2 x sequence 2, global batch 8 = micro 4 x grad-acc 1 x data 2" in out
    code, _, err = run(capsys, "validate", RING, "--world-size", 6, "--pipeline-model-parallel-size", 2, *NO_DROPOUT)
    assert code == 2 and "does not divide the world size 6" in err
    code, _, err = run(capsys, "validate", ROOT / "ds_configs" / "zero2_ring_sp2.json", "--world-size", 4,
                       "--pipeline-model-parallel-size", 2, *NO_DROPOUT)
    assert code == 2 and "zero_optimization.stage 2 cannot be combined with pipeline parallelism" in err
    code, _, err = run(capsys, "validate", RING, "--world-size", 6, "--pipeline-model-parallel-size", 3,
                       "--num-layers", 2, *NO_DROPOUT)  # a stage of only the heads
    assert code == 2 and "3 is more pipeline stages than the 2 transformer layers" in err


def test_show_and_validate_print_the_trainers_start_up_notes_of_the_model(capsys):
    """A model to-hf would refuse, a window that spans the sequence: the trainer's notes on stderr (show's
    stdout stays JSON), before anything is trained."""
    modern = ["--position-embedding-type", "rope", "--local-attention-window", "200", "--global-attention-every", "2",
              "--seq-length", "128", "--max-position-embeddings", "128", *NO_DROPOUT]
    for command in ("show", "validate"):
        code, out, err = run(capsys, command, RING, "--world-size", 2, *modern)
        assert code == 0 and [line.split(":")[1] for line in err.splitlines()] == [
            " convert_checkpoint.py to-hf will refuse this model", " --local-attention-window 200 (100 tokens each "
            "side) is not below the 128-token sequence (--seq-length)"], err
    assert json.loads(run(capsys, "show", RING, *modern)[1])["model"]["local_attention_window"] == 200
    assert run(capsys, "validate", RING, "--world-size", 2, *NO_DROPOUT)[2] == ""  # the default BERT exports
    # ModernBERT's own window of 128 at a fine-tune length of 128: the model's, not the user's mistake
    assert run(capsys, "validate", RING, "--world-size", 2, "--model-preset", "modernbert-base", "--seq-length",
               128)[2] == ""


def test_command_line_error_is_one_line(tmp_path):
    """The real script: exit code 2 and one line naming the file."""
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "ds_config.py"), "show", str(tmp_path / "no.json")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"ds_config.py: error: DeepSpeed config {tmp_path / 'no.json'} does not "
                                          "exist; pass an existing JSON file as the config argument of ds_config.py "
                                          "show"]  # not "to --deepspeed_config", a flag this tool has not


def test_validate_refuses_a_json_the_trainer_refuses(capsys, tmp_path):
    """A "scheduler" section, which the trainer refuses (DeepSpeed would drop it), fails `validate` too."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 4, "scheduler": {"type": "WarmupLR"}}))
    code, out, err = run(capsys, "validate", path, "--world-size", 2)
    assert (code, out) == (2, "") and err.startswith('ds_config.py: error: the DeepSpeed JSON\'s "scheduler" section')
    assert len(err.splitlines()) == 1 and 'remove "scheduler"' in err


def test_show_into_a_closed_pipe_exits_quietly():
    """`show ... | head`: no BrokenPipeError traceback; exit status 141 (128 + SIGPIPE), as cat's."""
    show = subprocess.Popen([sys.executable, str(ROOT / "tools" / "ds_config.py"), "show", str(RING), *NO_DROPOUT],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    show.stdout.close()  # the reader is gone before the first write
    _, err = show.communicate(timeout=120)
    assert (show.returncode, err) == (141, "")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full (Linux) to stand for a full disk")
def test_show_to_a_full_disk_is_one_line():
    with open("/dev/full", "w") as full:
        show = subprocess.run([sys.executable, str(ROOT / "tools" / "ds_config.py"), "show", str(RING), *NO_DROPOUT],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert show.returncode == 2 and show.stderr.splitlines() == [
        "ds_config.py: error: a write failed: the disk is full (No space left on device); free space on the disk "
        "the output goes to, or write it to another disk"], show.stderr


@pytest.mark.parametrize("assignment,message", [
    ("sequence_parallel.ulysses_size=3", "ulysses_size 3 does not divide the sequence-parallel size 4"),
    ("sequence_parallel.ulysses_size=true", "sequence_parallel.ulysses_size = true is not an integer"),
    ("sequence_parallel.attention=ring", "sequence_parallel.ulysses_size 2 is set but attention is 'ring'"),
])
def test_hybrid_keys_are_validated(capsys, tmp_path, assignment, message):
    """ulysses_size divides size, the heads divide by it, and it belongs to hybrid only (issue 15)."""
    hybrid = ROOT / "ds_configs" / "hybrid_sp4.json"
    code, out, _ = run(capsys, "validate", hybrid, "--world-size", 8, "--num-attention-heads", 4, "--hidden-size", 64)
    assert code == 0 and "attention hybrid (Ulysses 2 adjacent ranks x ring 2)" in out and "data 2" in out
    code, _, err = run(capsys, "validate", hybrid, "--world-size", 4, "--num-attention-heads", 3, "--hidden-size", 63)
    assert code == 2 and "hybrid needs num_attention_heads (3) divisible by ulysses_size (2)" in err
    code, _, err = run(capsys, "set", hybrid, assignment, "-o", tmp_path / "out.json", "--world-size", 4)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out.json").exists()


# ---------------------------------------------------------------- issue 16: a fast, quiet tool; the layout in one file

def test_the_tool_imports_neither_torch_nor_deepspeed(tmp_path):
    """--help, show, set and validate as real processes: no torch, no DeepSpeed (and so no accelerator
    warning), nothing on stderr; -X importtime lists every module a process imports."""
    out = tmp_path / "ds.json"
    for argv in (["--help"], ["show", RING, *NO_DROPOUT], ["set", RING, "train_batch_size=8", "-o", out, *NO_DROPOUT],
                 ["validate", out, "--world-size", 4, *NO_DROPOUT]):
        result = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "tools" / "ds_config.py"),
                                 *map(str, argv)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr[-2000:]
        imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
                    if line.startswith("import time:")}
        assert not {"torch", "deepspeed", "pydantic"} & imported, argv
        other = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
        assert other == ([] if argv[0] != "set" else
                         ["gradient_accumulation_steps set to null: derived at each world size (2 at world size 2)"])


def test_static_deepspeed_tables_match_the_installed_deepspeed():
    from ds_trace import (traced_deepspeed_top_level_keys, traced_optimizer_names, traced_optimizer_params,
                          traced_section_keys, traced_stage3_settings)
    from megatron.ds_schema import (DEEPSPEED_SECTION_KEYS, DEEPSPEED_TOP_LEVEL_KEYS, OPTIMIZER_NAMES, OPTIMIZER_PARAMS,
                                    TORCH_ADAM_PARAMS)
    from megatron.ds_schema import _STAGE3_SETTINGS

    assert traced_deepspeed_top_level_keys() == DEEPSPEED_TOP_LEVEL_KEYS
    assert traced_optimizer_names() == OPTIMIZER_NAMES
    assert traced_optimizer_params() == (OPTIMIZER_PARAMS, TORCH_ADAM_PARAMS)
    assert traced_section_keys() == DEEPSPEED_SECTION_KEYS
    assert traced_stage3_settings() == _STAGE3_SETTINGS


def test_deepspeed_check_runs_deepspeeds_own_section_checks(capsys, config):
    ds = json.loads(config.read_text())
    ds["zero_optimization"]["overlap_comm"] = "sometimes"
    config.write_text(json.dumps(ds))
    assert run(capsys, "validate", config, "--world-size", 2, *NO_DROPOUT)[0] == 0  # fast: our checks only
    code, _, err = run(capsys, "validate", config, "--world-size", 2, "--deepspeed-check", *NO_DROPOUT)
    assert code == 2 and "DeepSpeed rejects zero_optimization.overlap_comm" in err, err


def test_pipeline_degree_lives_in_the_json(capsys, tmp_path):
    path = tmp_path / "pp.json"
    path.write_text(json.dumps({**json.loads(RING.read_text()), "pipeline": {"stages": 2}}))
    shown = json.loads(run(capsys, "show", path, *NO_DROPOUT)[1])
    assert (shown["world_size"], shown["pipeline_parallel_size"], shown["sequence_parallel_size"]) == (4, 2, 2)
    assert shown["ds_config"]["pipeline"]["stages"] == 2
    code, out, _ = run(capsys, "validate", path, "--world-size", 8, *NO_DROPOUT)
    assert code == 0 and "pipeline 2 x data 2 x sequence 2" in out
    code, out, _ = run(capsys, "validate", path, "--world-size", 4, "--pipeline-model-parallel-size", 1, *NO_DROPOUT)
    assert code == 0 and "pipeline 1 x data 2 x sequence 2" in out  # the flag wins
    code, _, err = run(capsys, "set", path, "pipeline.stages=\"two\"", *NO_DROPOUT)
    assert code == 2 and 'pipeline.stages = "two" is not an integer' in err
    template = json.loads((ROOT / "ds_configs" / "pipeline_zero1_ring_sp2.json").read_text())
    assert template["pipeline"]["stages"] == 2  # the pipeline template describes its whole layout


@pytest.mark.parametrize("assignments,derived,expected", [
    (["train_batch_size=16"], "gradient_accumulation_steps", (16, 4, 4)),
    (["train_micro_batch_size_per_gpu=2"], None, (2, 2, 1)),  # no train_batch_size in ring_sp2.json: derived
    (["gradient_accumulation_steps=4"], None, (16, 4, 4)),  # no train_batch_size to contradict
    (["train_batch_size=16", "gradient_accumulation_steps=2", "train_micro_batch_size_per_gpu=2"], None, (16, 2, 2)),
    (["train_batch_size=8", "gradient_accumulation_steps=2"], None, (8, 4, 2)),
])
def test_set_batch_sizes_on_a_template(capsys, config, assignments, derived, expected):
    """A batch key set on a template leaves another to be derived (null) instead of contradicting it
    (ring_sp2.json fixes micro 4 and grad-acc 1 for world size 2)."""
    code, _, err = run(capsys, "set", config, *assignments, *NO_DROPOUT)
    assert code == 0, err
    written = json.loads(config.read_text())
    if derived:
        assert written[derived] is None and f"{derived} set to null" in err
    shown = json.loads(run(capsys, "show", config, *NO_DROPOUT)[1])["ds_config"]
    assert tuple(shown[key] for key in ds_config.BATCH_KEYS) == expected


def test_validate_refuses_world_size_0(capsys):
    code, _, err = run(capsys, "validate", RING, "--world-size", 0, *NO_DROPOUT)
    assert code == 2 and "world size 0 must be >= 1" in err


@pytest.mark.parametrize("assignment,named", [("sequence_parallel.size=0", "sequence_parallel.size = 0"),
                                              ("pipeline.stages=-1", "(pipeline.stages) = -1")])
def test_a_degree_below_1_is_named_not_the_world_size_it_implies(capsys, assignment, named):
    code, _, err = run(capsys, "set", RING, assignment, "-o", "-", *NO_DROPOUT)
    assert code == 2 and f"{named} must be >= 1" in err and "world size" not in err, err


def test_show_prints_the_seed_the_trainer_uses(capsys):
    bigbird = ROOT / "ds_configs" / "bigbird_sp2.json"
    flags = ["--seq-length", 1024, "--max-position-embeddings", 1024]
    assert json.loads(run(capsys, "show", bigbird, *flags)[1])["model"]["bigbird_seed"] == 1234  # the trainer's --seed
    assert json.loads(run(capsys, "show", bigbird, *flags, "--seed", 7)[1])["model"]["bigbird_seed"] == 7


def test_set_keeps_the_files_permissions(capsys, config, tmp_path):
    config.chmod(0o640)
    assert run(capsys, "set", config, "zero_optimization.stage=2", *NO_DROPOUT)[0] == 0
    assert config.stat().st_mode & 0o777 == 0o640
    new = tmp_path / "new.json"
    assert run(capsys, "set", config, "zero_optimization.stage=1", "-o", new, *NO_DROPOUT)[0] == 0
    umask = os.umask(0)
    os.umask(umask)
    assert new.stat().st_mode & 0o777 == 0o666 & ~umask


def test_set_writes_through_a_symbolic_link(capsys, config, tmp_path):
    """`set link.json ...` (in place) and `-o link.json` edit the file the link names and keep the
    link, as `cp` and `> file` do (os.replace over the link made it a regular file and left its
    target as it was); relative links too, and a link to a link."""
    (tmp_path / "configs").mkdir()
    target = config.rename(tmp_path / "configs" / "real.json")
    target.chmod(0o640)
    link, chain = tmp_path / "link.json", tmp_path / "chain.json"
    link.symlink_to(Path("configs") / "real.json")
    chain.symlink_to("link.json")
    for given, stage in ((link, 2), (chain, 1)):
        assert run(capsys, "set", given, f"zero_optimization.stage={stage}", *NO_DROPOUT)[:2] == (0, f"{given}\n")
        assert link.is_symlink() and chain.is_symlink() and os.readlink(link) == str(Path("configs") / "real.json")
        assert json.loads(target.read_text())["zero_optimization"]["stage"] == stage
        assert target.stat().st_mode & 0o777 == 0o640
    assert run(capsys, "set", target, "zero_optimization.stage=0", "-o", link, *NO_DROPOUT)[0] == 0
    assert link.is_symlink() and json.loads(target.read_text())["zero_optimization"]["stage"] == 0
    assert sorted(path.name for path in tmp_path.rglob("*")) == ["chain.json", "configs", "link.json", "real.json"]


def shown_optimizer(path: Path, *flags) -> dict:
    """`show`'s optimizer section, from the real tool."""
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "ds_config.py"), "show", str(path), *NO_DROPOUT,
                             *flags], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return json.loads(result.stdout)["ds_config"]["optimizer"]


def trainer_optimizer(path: Path, monkeypatch, cuda: bool | None) -> dict:
    """The optimizer section training.deepspeed_settings hands DeepSpeed for that JSON, no optimizer flags
    given; `cuda` None: this machine's torch.cuda.is_available(). With CUDA, FusedAdam can be had (the
    trainer's fallback to torch's Adam where it cannot be built is beyond a tool that imports no torch)."""
    import torch

    from megatron.arguments import build_parser
    from megatron.parallel import device
    from megatron.training import deepspeed_settings

    if cuda is not None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(device, "fused_adam_problem", lambda: None, raising=False)
    return deepspeed_settings(build_parser().parse_args(["--deepspeed_config", str(path)]))["optimizer"]


def test_show_prints_the_optimizer_the_trainer_fills(monkeypatch):
    """The templates name no optimizer: the trainer's AdamW with its default params, and torch's Adam
    without CUDA (--no-cuda), DeepSpeed's FusedAdam with it (--cuda)."""
    defaults = {"lr": 1e-4, "weight_decay": 0.01, "betas": [0.9, 0.999], "eps": 1e-8}
    assert shown_optimizer(RING, "--no-cuda") == {"type": "AdamW", "params": {**defaults, "torch_adam": True}}
    assert shown_optimizer(RING, "--cuda") == {"type": "AdamW", "params": defaults}
    for cuda in (False, True):
        assert trainer_optimizer(RING, monkeypatch, cuda) == shown_optimizer(RING, "--cuda" if cuda else "--no-cuda")


def test_show_fills_a_partial_json_optimizer_as_the_trainer_does(tmp_path, monkeypatch):
    """The JSON's own type and params stay, the missing params come from the same defaults; without
    --cuda / --no-cuda the tool judges this machine as torch does (without importing it)."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({**json.loads(RING.read_text()), "optimizer": {
        "type": "Adam", "params": {"lr": 3e-4, "betas": [0.8, 0.95], "fused": True}}}))
    shown = shown_optimizer(path, "--no-cuda")
    assert shown == {"type": "Adam", "params": {"lr": 3e-4, "betas": [0.8, 0.95], "fused": True, "weight_decay": 0.01,
                                                "eps": 1e-8, "torch_adam": True}}
    assert trainer_optimizer(path, monkeypatch, False) == shown
    assert trainer_optimizer(path, monkeypatch, None) == shown_optimizer(path)  # this machine, either way


@pytest.mark.parametrize("assignment", ["zero_optimization..stage=1", "zero_optimization.=1",
                                        "zero_optimization.stage =1"])
def test_set_refuses_an_empty_or_space_padded_key(capsys, config, assignment):
    """these wrote "": {...} or "stage " into zero_optimization, which DeepSpeed refuses at the run's start."""
    before = config.read_bytes()
    code, out, err = run(capsys, "set", config, assignment, *NO_DROPOUT)
    assert code == 2 and out == "" and before == config.read_bytes()
    assert err.startswith(f"ds_config.py: error: {assignment.partition('=')[0]!r} in {assignment!r} has an empty or "
                          "space-padded key; write the key path without blanks"), err


def test_a_directory_is_not_called_missing(capsys, tmp_path):
    """a folder passed as CONFIG (or --deepspeed_config) was said not to exist."""
    code, _, err = run(capsys, "show", tmp_path)
    assert code == 2 and err.endswith(f"DeepSpeed config {tmp_path} is a directory; pass the JSON file itself as the "
                                      "config argument of ds_config.py show\n"), err
    code, _, err = run(capsys, "diff", RING, tmp_path / "missing.json")  # the second file: named as such
    assert code == 2 and err.endswith("pass an existing JSON file as the other argument of ds_config.py diff\n"), err


def test_a_repository_path_given_from_another_folder_is_named(capsys, tmp_path, monkeypatch):
    """The README's `ds_configs/ring_sp2.json`, run from another folder: "does not exist" alone left the
    user to find that the path is relative to the repository."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "validate", "ds_configs/ring_sp2.json", "--world-size", 2)
    assert code == 2 and err.endswith(f"(this repository has {ROOT / 'ds_configs' / 'ring_sp2.json'}: pass that path "
                                      "from this folder)\n"), err
    with pytest.raises(ds_config.ConfigError, match="^DeepSpeed config ds_configs/ring_sp2.json does not exist; pass "
                                                    "an existing JSON file to --deepspeed_config \\(this repository "
                                                    "has "):
        ds_config.read_ds_config("ds_configs/ring_sp2.json")  # the trainer's reader: its own flag


def validate_json(capsys, tmp_path, ds: dict) -> tuple:
    """`validate` of the JSON `ds` (a small single-rank layout): (exit code, stdout, stderr)."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, **ds}))
    return run(capsys, "validate", path, "--world-size", 1)


@pytest.mark.parametrize("key", sorted(__import__("megatron.ds_schema").ds_schema.REMOVED_KEYS))
def test_a_key_deepspeed_removed_is_named_with_what_to_set_instead(capsys, tmp_path, key):
    """DeepSpeed 0.19.8's own sentence for a removed feature named no key and ended in a generic fix ("...
    directly.; fix the setting it names"): one line naming the key, DeepSpeed's version and the replacement."""
    from megatron.ds_schema import REMOVED_KEYS

    feature, instead = REMOVED_KEYS[key]
    code, out, err = validate_json(capsys, tmp_path, {key: {"enabled": True}})
    assert (code, out) == (2, "")
    assert err == (f'ds_config.py: error: "{key}" in the DeepSpeed JSON: DeepSpeed 0.19.8 removed {feature} and '
                   f'refuses the key; remove "{key}"' + (f"; {instead}" if instead else "") + "\n")


def test_the_removed_keys_are_deepspeeds():
    from deepspeed.runtime.config import _REMOVED_TOP_LEVEL_CONFIG_KEYS
    from megatron.ds_schema import REMOVED_KEYS

    assert set(REMOVED_KEYS) == set(_REMOVED_TOP_LEVEL_CONFIG_KEYS)


def test_elasticity_names_the_batch_keys_to_set():
    """The fix of the elasticity key (the one of a launcher habit) names what replaces it here."""
    from megatron.ds_schema import REMOVED_KEYS

    fix = REMOVED_KEYS["elasticity"][1]
    assert "train_batch_size" in fix and "--global-batch-size" in fix


@pytest.mark.parametrize("section,form", [
    ({"enabled": True, "backend": "inductor"},
     " (compile.enabled is DeepSpeed 0.12-0.14's form, which 0.19.8 refuses)"),
    ({"deepcompile": True}, ""),
])
def test_a_compile_section_names_compile_mlp(capsys, tmp_path, section, form):
    """DeepSpeed reads "compile" in engine.compile() only, which the trainer never calls; its 0.12-0.14 form was
    refused in DeepSpeed's words alone, with no word of the trainer's own compilation."""
    assert validate_json(capsys, tmp_path, {"compile": {"deepcompile": False}})[0] == 0  # a template's defaults
    code, out, err = validate_json(capsys, tmp_path, {"compile": section})
    assert (code, out) == (2, "")
    assert err == ('ds_config.py: error: the DeepSpeed JSON\'s "compile" section is not used: DeepSpeed compiles only '
                   f"in engine.compile(), which this trainer does not call{form}; remove \"compile\"; this trainer "
                   "compiles each layer's MLP with --compile-mlp (torch.compile, inductor)\n")


@pytest.mark.parametrize("key", ["stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save"])
def test_gathering_a_16bit_model_at_save_is_a_note_at_zero_3(capsys, tmp_path, key):
    """At ZeRO 3 the key (common in ZeRO-3 templates) was accepted and did nothing, without a word: the trainer
    never calls save_16bit_model. A note names the export that gives the weights; below stage 3 it stays
    refused as a stage-3 setting."""
    from megatron.paths import in_repository

    code, out, err = validate_json(capsys, tmp_path, {"zero_optimization": {"stage": 3, key: True}})
    assert code == 0 and out.endswith("ZeRO stage 3\n"), out
    assert err == (f"note: zero_optimization.{key} writes nothing here: it sets how DeepSpeed's save_16bit_model() "
                   "gathers the weights, which the trainer never calls; export a checkpoint's weights with python "
                   f"{in_repository('tools/convert_checkpoint.py')} to-torch --load SAVE_DIR --output OUT.pt "
                   "(or to-hf)\n")
    code, out, err = validate_json(capsys, tmp_path, {"zero_optimization": {"stage": 2, key: True}})
    assert code == 2 and f"zero_optimization.{key} works at ZeRO stage 3 only and does nothing at stage 2" in err


def test_validate_prints_the_trainers_notes_of_json_settings_that_do_nothing(capsys, tmp_path):
    """number_checkpoints (read only with contiguous_memory_optimization) and steps_per_print (DeepSpeed's line
    hidden at its default log level): the trainer's start-up notes, on stderr."""
    code, out, err = validate_json(capsys, tmp_path, {"activation_checkpointing": {"number_checkpoints": 4},
                                                      "steps_per_print": 2})
    assert code == 0 and [line.split(" ", 2)[1] for line in err.splitlines()] == [
        "steps_per_print", "activation_checkpointing.number_checkpoints"], err
