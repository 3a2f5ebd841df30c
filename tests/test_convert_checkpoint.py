"""tools/convert_checkpoint.py end to end: a checkpoint saved by a pipeline 2 x sequence-parallel 2
run -> Hugging Face folder -> equal logits to the single-process model holding the run's weights;
and back (from-hf) to a checkpoint whose weights are the same."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from unittest import mock
from pathlib import Path

import pytest
import torch
import transformers

from bert_fixtures import padded_batch, small_config, small_model
from megatron import checkpoint, checkpoint_save, checkpoint_weights, hf_convert, hf_io
from megatron.config import resolve
from megatron.engine import build_engine, train_step
from megatron.errors import ConfigError
from megatron.model.bert import BertConfig, BertModel
from megatron.model.pipe import bert_to_pipe_name
from megatron.parallel import state
from megatron.parallel.spawn import run_on_ranks
from test_deepspeed_engine import GLOBAL_BATCH, ds_config, micro_batches, model_flags
from test_hf_convert import assert_same_logits, assert_same_weights, hf_model, write_vocab_file

TOOL = Path(__file__).resolve().parents[1] / "tools" / "convert_checkpoint.py"
MICRO = 2


BF16 = {"bf16": {"enabled": True}}
FP16 = {"fp16": {"enabled": True, "initial_scale_power": 8}}  # a scale the first step does not overflow


def fp32_masters(engine) -> dict:
    """engine.module's fp32 master weights by its parameter names: DeepSpeed's ZeRO / bf16 optimizers
    link each parameter to its own (collective), the FP16 optimizers of ZeRO 0 keep them in groups."""
    from deepspeed.utils import safe_get_full_fp32_param

    names = {param: name for name, param in engine.module.named_parameters()}
    optimizer = engine.optimizer
    if hasattr(optimizer, "fp32_groups") and not hasattr(next(engine.module.parameters()), "_hp_mapping"):
        # each group's masters pair with its half-precision parameters (the groups: engine.optimizer_groups)
        return {names[half]: master.detach().clone() for halves, masters in zip(optimizer.fp16_groups,
                                                                                optimizer.fp32_groups)
                for half, master in zip(halves, masters)}
    return {name: safe_get_full_fp32_param(p).clone() for name, p in engine.module.named_parameters()}


def train_and_save(directory: str, zero_stage: int = 1, precision: dict = BF16) -> dict:
    """One step in bf16 (or `precision`) at pipeline 2 x sequence 2 (ZeRO 1, or `zero_stage`: 0 without
    clipping, which a pipeline refuses there), saved; returns this stage's fp32 master weights in BertModel
    names. Pre-LayerNorm without embedding LayerNorm: MegatronBert's layout. fp16: DeepSpeed's CPU
    accelerator is told it has fp16 kernels (torch's CPU ops run fp16; DeepSpeed asks oneDNN)."""
    from deepspeed.accelerator import get_accelerator

    if "fp16" in precision:
        get_accelerator().is_fp16_supported = lambda: True
    flags = {**model_flags(), "embedding_layernorm": False, "pipeline_parallel_size": 2}
    clip = {"clip": 0.0} if zero_stage == 0 else {}
    config = resolve(flags, {**ds_config(MICRO, GLOBAL_BATCH // MICRO, zero_stage, 2, **clip), **precision},
                     torch.distributed.get_world_size())
    engine = build_engine(config, bert_state=small_model(config.model).state_dict())
    train_step(engine, micro_batches(MICRO)[state.get_data_parallel_rank() * 2:][:2])
    checkpoint_save.save(engine, config, directory, iteration=1, consumed_samples=GLOBAL_BATCH)
    to_bert = {bert_to_pipe_name(name, config.model.num_layers): name for name in small_model(config.model).state_dict()}
    return {to_bert[name]: weight for name, weight in fp32_masters(engine).items()}


def rounded_by_bf16(weights: dict, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether the weights differ from their bf16 (or `dtype`) rounding (so that reading the rounded
    copies fails)."""
    return any(not torch.equal(w, w.to(dtype).float()) for w in weights.values())


def train_and_save_zero3(directory: str) -> dict:
    """One step at sequence 2 with ZeRO 3 (weights only as partitions), BERT's post-LayerNorm
    layout, into `directory`/zero3; then the same step in bf16 at ZeRO 1 and at ZeRO 0 (DeepSpeed's
    FP16 optimizer, no layout-free files), into bf16-zero1 and bf16-zero0. Returns {folder: the
    gathered weights; the fp32 masters for bf16}."""
    import deepspeed

    weights = {}
    for folder, zero_stage, precision in (("zero3", 3, {}), ("bf16-zero1", 1, BF16), ("bf16-zero0", 0, BF16)):
        state.destroy()  # fresh groups for each engine
        config = resolve({**model_flags(), "layernorm_layout": "post"},
                         {**ds_config(MICRO, GLOBAL_BATCH // MICRO, zero_stage, 2), **precision},
                         torch.distributed.get_world_size())
        engine = build_engine(config, bert_state=small_model(config.model).state_dict())
        train_step(engine, micro_batches(MICRO))
        checkpoint_save.save(engine, config, f"{directory}/{folder}", iteration=1, consumed_samples=GLOBAL_BATCH)
        if zero_stage == 3:
            with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
                weights[folder] = {name: p.detach().clone() for name, p in engine.module.named_parameters()}
        else:
            weights[folder] = fp32_masters(engine)
    return weights


def convert(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=120)


def test_pipeline_sequence_parallel_checkpoint_to_hf_and_back(tmp_path):
    """bf16: the export holds the fp32 masters (the layout-free files'), not the stages' bf16 copies."""
    trained = {}
    for stage in run_on_ranks(train_and_save, 4, str(tmp_path / "ckpt"), timeout=300):
        trained.update(stage)
    assert rounded_by_bf16(trained)
    stored = checkpoint.stored_config(str(tmp_path / "ckpt"), checkpoint.tag_for(1))["model"]
    config = BertConfig(**{**stored, "attention": "dense"})
    reference = BertModel(config).eval()
    reference.load_state_dict(trained)  # strict: the stages together hold every weight
    vocab = write_vocab_file(tmp_path / "vocab.txt")

    done = convert("to-hf", "--load", tmp_path / "ckpt", "--vocab-file", vocab, "--output", tmp_path / "hf")
    assert done.returncode == 0, done.stderr
    hf = transformers.MegatronBertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    assert hf.dtype == torch.float32
    assert_same_logits(reference, hf, padded_batch(), "pp2 x sp2 checkpoint -> HF")

    done = convert("from-hf", "--hf-dir", tmp_path / "hf", "--save", tmp_path / "back",
                   "--make-vocab-size-divisible-by", config.make_vocab_size_divisible_by)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    assert_same_weights(checkpoint_weights.bert_state_from_checkpoint(str(tmp_path / "back")), trained)
    # a plain state dict (DeepSpeed's zero_to_fp32.py fails on pipeline checkpoints: the scripts it left
    # name this export instead)
    done = convert("to-torch", "--load", tmp_path / "ckpt", "--output", tmp_path / "bert.pt")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert_same_weights(torch.load(tmp_path / "bert.pt"), trained)
    for script in checkpoint_save.RECOVERY_SCRIPTS:
        done = subprocess.run([sys.executable, str(tmp_path / "ckpt" / script), str(tmp_path / "ckpt"),
                               str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stderr.splitlines() == [
            f"{script}: error: {tmp_path / 'ckpt'} holds pipeline checkpoints, which DeepSpeed's {script} cannot "
            f"read; export a plain state dict with {sys.executable} {TOOL} to-torch --load {tmp_path / 'ckpt'} --output "
            "OUT.pt"], done.stderr
    assert not (tmp_path / "out").exists()
    back_config = checkpoint.stored_config(str(tmp_path / "back"), checkpoint.tag_for(0))["model"]
    for field in ("hidden_size", "num_layers", "num_attention_heads", "vocab_size", "layernorm_layout",
                  "embedding_layernorm", "layernorm_epsilon", "max_position_embeddings"):
        assert back_config[field] == stored[field], field


def test_an_fp16_pipeline_checkpoint_at_zero_0_reads_as_its_stages_fp32_masters(tmp_path):
    """fp16 with a pipeline at ZeRO 0 writes no layout-free files: each stage's FP16 optimizer keeps its
    fp32 masters in that stage's model-states file, which the export and --finetune read (they read the
    stages' fp16 copies, said in a warning), with no warning now."""
    trained = {}
    for stage in run_on_ranks(train_and_save, 4, str(tmp_path / "ckpt"), 0, FP16, timeout=300):
        trained.update(stage)
    assert rounded_by_bf16(trained, torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same_weights(checkpoint_weights.bert_state_from_checkpoint(str(tmp_path / "ckpt")), trained)


def test_zero3_sequence_parallel_checkpoint_to_hf(tmp_path):
    """And the weights of bf16 checkpoints read back as their fp32 masters, at ZeRO 1 (layout-free
    files) and ZeRO 0 (the FP16 optimizer's state), not as the model files' bf16 copies."""
    weights = run_on_ranks(train_and_save_zero3, 2, str(tmp_path), timeout=300)[0]
    for folder in ("bf16-zero1", "bf16-zero0"):
        assert rounded_by_bf16(weights[folder])
        assert_same_weights(checkpoint_weights.bert_state_from_checkpoint(str(tmp_path / folder)), weights[folder])
    trained = weights["zero3"]
    stored = checkpoint.stored_config(str(tmp_path / "zero3"), checkpoint.tag_for(1))["model"]
    reference = BertModel(BertConfig(**{**stored, "attention": "dense"})).eval()
    reference.load_state_dict(trained)
    # as written before layout-free files: read by DeepSpeed's zero_to_fp32, whose report stays off stdout and
    # its tqdm bars off stderr
    (tmp_path / "zero3" / checkpoint.tag_for(1) / checkpoint.LAYOUT_FREE.format(stage=0)).unlink()
    done = convert("to-hf", "--load", tmp_path / "zero3", "--vocab-file", write_vocab_file(tmp_path / "vocab.txt"),
                   "--output", tmp_path / "hf")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("wrote BertForPreTraining") and "zero checkpoint" not in done.stdout
    assert "shards" not in done.stderr and "Gathering" not in done.stderr, done.stderr
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    assert_same_logits(reference, hf, padded_batch(), "zero3 x sp2 checkpoint -> HF")


def test_tool_errors_are_one_line(tmp_path):
    done = convert("from-hf", "--hf-dir", tmp_path / "missing", "--save", tmp_path / "out")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"convert_checkpoint.py: error: {tmp_path / 'missing' / 'config.json'} does not exist; "
        "point at a Hugging Face model folder (config.json + weights)"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv,line", [
    (["to-hf", "--load", "CK", "--save", "HF"], "to-hf: error: --save is from-hf's (the checkpoint it writes); to-hf "
     "writes the Hugging Face folder to --output DIR"),
    (["to-hf", "--load", "CK", "--hf-dir=HF"], "to-hf: error: --hf-dir is from-hf's (the Hugging Face folder it "
     "reads); to-hf writes the Hugging Face folder to --output DIR"),
    (["from-hf", "--hf-dir", "HF", "--output", "CK"], "from-hf: error: --output is to-hf's (the Hugging Face folder it "
     "writes); from-hf writes the checkpoint to --save DIR"),
    (["from-hf", "--load", "HF", "--save", "CK"], "from-hf: error: --load is to-hf's (the checkpoint it reads); "
     "from-hf reads the Hugging Face folder from --hf-dir DIR")])
def test_the_other_directions_flag_names_this_ones(capsys, argv, line):
    """A user who just ran from-hf types --save for to-hf's output (and the other way round): one line naming
    the flag this direction takes, not argparse's 'the following arguments are required: --output'. --save
    stays this trainer's checkpoint folder in every tool, --output a file or folder of another format."""
    with pytest.raises(SystemExit, match="^2$"):
        tool_module().main(argv)
    assert capsys.readouterr().err.splitlines() == [f"convert_checkpoint.py {line}; see convert_checkpoint.py "
                                                    f"{argv[0]} --help"]


@pytest.mark.filterwarnings("ignore:.*holds no vocab.txt")  # the damaged folders have no tokenizer either
def test_from_hf_refuses_a_damaged_folder_and_to_hf_asks_for_a_missing_tokenizer(tmp_path):
    """In-process: an unreadable tokenizer, integer weights and a config.json without model_type stop
    from-hf writing nothing; a folder without any tokenizer converts with a warning, and to-hf then asks
    for one (no reason the checkpoint does not have)."""
    spec = importlib.util.spec_from_file_location("convert_checkpoint", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    config = small_config("dense", layernorm_layout="post", embedding_layernorm=True)
    folder = tmp_path / "hf"
    hf_convert.save_hf_folder(folder, small_model(config).state_dict(), config, write_vocab_file(tmp_path / "v.txt"))
    (folder / "vocab.txt").unlink()
    weights, settings = folder / "model.safetensors", folder / "config.json"
    tensors, hf_config = hf_io.read_safetensors(weights), json.loads(settings.read_text())
    integers = {name: tensor.to(torch.int32) for name, tensor in tensors.items()}
    untyped = {key: value for key, value in hf_config.items() if key != "model_type"}
    damages = [("tokenizer.json", "{oops", "the tokenizer of the Hugging Face folder"),
               ("model.safetensors", integers, "is int32, not floating point"),
               ("config.json", untyped, "config.json has no model_type")]
    for name, damaged, message in damages:
        if name == "model.safetensors":
            hf_io.write_safetensors(weights, damaged)
        else:
            (folder / name).write_text(damaged if isinstance(damaged, str) else json.dumps(damaged))
        with pytest.raises(ConfigError, match=message):
            tool.main(["from-hf", "--hf-dir", str(folder), "--save", str(tmp_path / "ckpt")])
        assert not (tmp_path / "ckpt").exists()
        (folder / "tokenizer.json").unlink(missing_ok=True)
        hf_io.write_safetensors(weights, tensors)
        settings.write_text(json.dumps(hf_config))
    with pytest.warns(UserWarning, match="holds no vocab.txt or tokenizer.json, so the checkpoint carries no"):
        tool.main(["from-hf", "--hf-dir", str(folder), "--save", str(tmp_path / "ckpt")])
    with pytest.raises(ConfigError, match=r"iter_0000000 carries no tokenizer; pass the --vocab-file"):
        tool.main(["to-hf", "--load", str(tmp_path / "ckpt"), "--output", str(tmp_path / "back")])


@pytest.mark.filterwarnings("ignore:.*holds no vocab.txt")
def test_from_hf_stores_the_folders_length_and_refuses_what_contradicts_it(tmp_path):
    """In-process. The stored seq_length is the length the model was trained at (extend_context scales
    rope from it): a ModernBERT folder's max_position_embeddings, unless --seq-length sets a shorter one; a
    --seq-length beyond the folder's positions (rope: no table was stretched, also under
    --max-position-embeddings), a rope folder's --max-position-embeddings beyond them (to-hf would declare it), 0,
    a shorter table and a --save in the folder are refused, nothing written. to-hf --tag of no
    checkpoint does not blame 'latest'."""
    from test_hf_modernbert import hf_folder

    spec = importlib.util.spec_from_file_location("convert_checkpoint", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    _, folder = hf_folder(tmp_path, "geglu-every3")  # 512 positions, rope
    files, save = sorted(folder.rglob("*")), tmp_path / "ckpt"
    declares = f"the 512 positions {folder / 'config.json'} declares"
    for flags, save_dir, message in [
            (["--max-position-embeddings", "256"], save, f"--max-position-embeddings 256 is below {declares}"),
            (["--seq-length", "1024"], save, f"--seq-length 1024 is above {declares}"),
            (["--seq-length", "1024", "--max-position-embeddings", "768"], save,
             f"--seq-length 1024 is above {declares}, the length its rotary model was trained at"),
            (["--seq-length", "600", "--max-position-embeddings", "1024"], save,
             f"--seq-length 600 is above {declares}, the length its rotary model was trained at (the stored "
             f"length, which tools/extend_context.py scales the rope theta from, and the export declares); drop "
             f"--seq-length; to train "
             f"longer, pass --seq-length 600 to the run, or continue with tools/extend_context.py --from {folder} "
             "--seq-length 600"),
            (["--max-position-embeddings", "1024"], save,
             f"--max-position-embeddings 1024 is above {declares}, the length its rotary model was trained at (the "
             "stored length, which tools/extend_context.py scales the rope theta from, and the export declares); "
             "drop --max-position-embeddings; to train longer, pass --seq-length 1024 to the run"),
            (["--seq-length", "0"], save, "--seq-length 0 must be >= 1; pass --seq-length 1 or more, or drop it"),
            ([], folder, f"--save {folder} is the --hf-dir folder: the checkpoint would be written into"),
            ([], folder / "ck", f"--save {folder / 'ck'} is inside the --hf-dir folder")]:
        with pytest.raises(ConfigError) as error:
            tool.main(["from-hf", "--hf-dir", str(folder), "--save", str(save_dir), *flags])
        assert str(error.value).startswith(message), str(error.value)
        assert not save.exists() and sorted(folder.rglob("*")) == files
    tool.main(["from-hf", "--hf-dir", str(folder), "--save", str(save), "--max-position-embeddings", "512"])
    stored = checkpoint.stored_config(str(save), "iter_0000000")["model"]
    assert (stored["max_position_embeddings"], stored["seq_length"]) == (512, 512)
    # learned positions: a stretched table may declare the length runs from it train at, up to its size
    _, bert = hf_model("megatron-bert", tmp_path, max_position_embeddings=20)
    with pytest.raises(ConfigError, match="--seq-length 40 is above --max-position-embeddings 30"):
        tool.main(["from-hf", "--hf-dir", str(bert), "--save", str(tmp_path / "bert"), "--seq-length", "40",
                   "--max-position-embeddings", "30"])
    tool.main(["from-hf", "--hf-dir", str(bert), "--save", str(tmp_path / "bert"), "--seq-length", "40",
               "--max-position-embeddings", "40"])
    stored = checkpoint.stored_config(str(tmp_path / "bert"), "iter_0000000")["model"]
    assert (stored["max_position_embeddings"], stored["seq_length"]) == (40, 40)

    # a run from the weights without --seq-length takes their trained length, not the default 512
    from megatron.arguments import build_parser
    from megatron.start_plan import StartPlan
    from megatron.starting_weights import model_flags

    def seq_length(*argv) -> int:
        args = build_parser().parse_args(list(argv))
        return model_flags(args, {}, StartPlan.given(args))["seq_length"]

    tool.main(["from-hf", "--hf-dir", str(folder), "--save", str(tmp_path / "at256"), "--seq-length", "256"])
    with mock.patch.object(checkpoint, "safe_load", side_effect=AssertionError("weights loaded for the header")):
        assert StartPlan.at(str(tmp_path / "at256"), None, False).weights_only  # from run_state.json, no weights
        assert seq_length("--load", str(tmp_path / "at256")) == 256
    assert seq_length("--load", str(tmp_path / "at256"), "--seq-length", "64") == 64
    short = tmp_path / "short"  # an HF folder of 128 positions (rope: no table to cut)
    short.mkdir()
    for file in folder.iterdir():
        (short / file.name).write_bytes(file.read_bytes())
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 128}))
    assert seq_length("--init-from-hf", str(short)) == 128
    assert seq_length("--init-from-hf", str(short), "--max-position-embeddings", "256") == 256  # the run's positions
    assert seq_length("--init-from-hf", str(folder)) == 512  # 512 at most
    with pytest.raises(ConfigError) as error:
        tool.main(["to-hf", "--load", str(save), "--tag", "iter_0000099", "--output", str(tmp_path / "out")])
    assert str(error.value) == (f"checkpoint folder {save / 'iter_0000099'} does not exist; pass the tag of a "
                                f"complete iter_* folder of {save} (the newest: iter_0000000)")


def test_to_hf_of_a_bigbird_model_says_the_export_attends_densely(tmp_path):
    """The weights carry over whole, the block-sparse pattern does not: the export's outputs differ from
    the trained model's, said in one warning line (Linformer, whose projections have no place, is refused)."""
    from megatron.data.tokenizer import BertWordPiece

    spec = importlib.util.spec_from_file_location("convert_checkpoint", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    config = small_config("bigbird", seq_length=64, bigbird_block_size=8, layernorm_layout="post",
                          embedding_layernorm=True)
    tokenizer = BertWordPiece(str(write_vocab_file(tmp_path / "vocab.txt")))
    hf_convert.save_weights_only_checkpoint(tmp_path / "ck", small_model(config).state_dict(), config, tokenizer)
    with pytest.warns(UserWarning, match=r"trained with BigBird's block-sparse attention \(bigbird\); the Hugging "
                                         r"Face model uses attention to every token \(dense\), so its outputs differ"):
        tool.main(["to-hf", "--load", str(tmp_path / "ck"), "--output", str(tmp_path / "hf")])
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "bert"


def test_heads_the_folder_lacked_are_recorded_and_named_by_to_hf_and_fill_mask(tmp_path, capsys):
    """from-hf of a BertModel folder (no MLM head, no sentence-order classifier) records the tensors it
    initialised in the checkpoint's run state; to-hf and fill_mask.py (the MLM head only) name them in
    one warning line, where they passed silently after from-hf's warning. A training run's checkpoint
    records none (checkpoint_save.save writes its own run state). In-process."""
    from test_hf_convert import hf_model

    tools = {}
    for name in ("convert_checkpoint", "fill_mask"):
        spec = importlib.util.spec_from_file_location(name, TOOL.parent / f"{name}.py")
        tools[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tools[name])
    _, folder = hf_model("bert", tmp_path, heads=False)
    write_vocab_file(folder / "vocab.txt")
    with pytest.warns(UserWarning, match="not in the Hugging Face folder, initialised"):
        tools["convert_checkpoint"].main(["from-hf", "--hf-dir", str(folder), "--save", str(tmp_path / "ck")])
    head = ["lm_head.bias", "lm_head.dense.bias", "lm_head.dense.weight", "lm_head.layernorm.bias",
            "lm_head.layernorm.weight"]
    recorded = checkpoint.run_state(str(tmp_path / "ck"), checkpoint.tag_for(0))[hf_convert.INITIALISED]
    assert recorded == ["binary_head.classifier.bias", "binary_head.classifier.weight", *head]
    untrained = f"{tmp_path / 'ck'} was converted from a Hugging Face folder without"
    with pytest.warns(UserWarning) as caught:
        tools["convert_checkpoint"].main(["to-hf", "--load", str(tmp_path / "ck"), "--output", str(tmp_path / "hf")])
    assert [str(w.message) for w in caught] == [
        f"{untrained} {', '.join(recorded)}: they are initialised at random, never trained; the export carries "
        "them as they are (train from the checkpoint first, or convert a Hugging Face folder that has them)"]
    capsys.readouterr()
    tools["fill_mask"].main(["--load", str(tmp_path / "ck"), "--text", "tok5 [MASK]"])
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {untrained} {', '.join(head)}: they are initialised at random, never trained; these predictions "
        "are random (train from the checkpoint first, or convert a Hugging Face folder with its masked-LM head)"]


def test_from_hf_names_a_filled_save_or_a_larger_tokenizer_before_any_warning(tmp_path, capsys):
    """from-hf of a folder lacking heads printed its 'initialised' warning, then refused the --save that holds
    a checkpoint or the tokenizer larger than the model: both are checked before the weights are read, and
    the folder's warnings come once the checkpoint is written (an error stays the only line). In-process."""
    from test_hf_convert import VOCAB, hf_model

    tool = tool_module()
    _, folder = hf_model("bert", tmp_path, heads=False)
    write_vocab_file(folder / "vocab.txt")
    (tmp_path / "filled").mkdir()
    (tmp_path / "filled" / "latest").write_text("iter_0000000")
    with warnings.catch_warnings(record=True) as caught, mock.patch.object(hf_convert, "load_hf_weights") as read:
        warnings.simplefilter("always")
        with pytest.raises(ConfigError, match=f"^{tmp_path / 'filled'} already holds a checkpoint; choose a new "):
            tool.main(["from-hf", "--hf-dir", str(folder), "--save", str(tmp_path / "filled")])
        (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                                    + [f"tok{i}" for i in range(VOCAB + 10)]) + "\n")
        with pytest.raises(ConfigError, match=f"has {VOCAB + 15} tokens, the model's vocab_size is {VOCAB}"):
            tool.main(["from-hf", "--hf-dir", str(folder), "--save", str(tmp_path / "new")])
    assert not read.called and not caught and not (tmp_path / "new").exists()
    write_vocab_file(folder / "vocab.txt")
    with pytest.warns(UserWarning, match="not in the Hugging Face folder, initialised"):
        tool.main(["from-hf", "--hf-dir", str(folder), "--save", str(tmp_path / "new")])
    assert (tmp_path / "new" / "latest").is_file()


def tool_module(name: str = "convert_checkpoint"):
    """tools/<name>.py loaded as a module, for in-process calls of its main()."""
    spec = importlib.util.spec_from_file_location(name, TOOL.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def full_disk_for(name: str):
    """The staging folders the writers make (tempfile.mkdtemp) hold `name` as a link to /dev/full: its
    writes fail as on a full disk (ENOSPC from the OS, no file name), the rest of the output is written."""
    make = tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        folder = make(*args, **kwargs)
        os.symlink("/dev/full", os.path.join(folder, name))
        return folder
    return mock.patch.object(tempfile, "mkdtemp", mkdtemp)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("command,full", [("from-hf", "mp_rank_00_model_states.pt"), ("from-hf", "run_state.json"),
                                          ("to-hf", "model.safetensors"), ("to-hf", "config.json")])
def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys, command, full):
    """Was torch's 'unexpected pos' traceback with an empty --save folder left (from-hf), and an OSError
    traceback (to-hf): a write's ENOSPC names no file. Now one line naming the output and the fix; the
    folders the tool created are removed, a --save folder that existed stays as it was (empty)."""
    from megatron.errors import run_tool
    from test_hf_modernbert import hf_folder, vocab_of

    tool = tool_module()
    _, folder = hf_folder(tmp_path, "geglu-every3")
    vocab_of(tmp_path, 100).rename(folder / "vocab.txt")
    tool.main(["from-hf", "--hf-dir", str(folder), "--save", str(tmp_path / "ck")])
    source = ["--hf-dir", str(folder)] if command == "from-hf" else ["--load", str(tmp_path / "ck")]
    flag, what = ("--save", "the checkpoint") if command == "from-hf" else ("--output", "the Hugging Face folder")
    (tmp_path / "empty").mkdir()
    capsys.readouterr()
    for target in [tmp_path / "new" / "out", *([tmp_path / "empty"] if command == "from-hf" else [])]:
        with full_disk_for(full):
            assert run_tool("convert_checkpoint.py", lambda: tool.main([command, *source, flag, str(target)])) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"convert_checkpoint.py: error: cannot write {what} {target} (No space left on device): the disk is full; "
            f"free space there or pass a {flag} directory on another disk"]
    assert not (tmp_path / "new").exists() and list((tmp_path / "empty").iterdir()) == []


def test_from_hf_refuses_a_tokenizer_larger_than_the_models_vocab_before_writing(tmp_path):
    """Was a checkpoint that fill_mask.py, to-hf and the trainer each refuse (the tokenizer has more tokens
    than the model has embedding rows): now from-hf refuses the folder, nothing written, naming its
    tokenizer as what to replace (from-hf has no tokenizer flag to pass)."""
    from test_hf_modernbert import hf_folder, vocab_of

    _, folder = hf_folder(tmp_path, "geglu-every3")  # vocab_size 100
    vocab_of(tmp_path, 200).rename(folder / "vocab.txt")
    with pytest.raises(ConfigError) as error:
        tool_module().main(["from-hf", "--hf-dir", str(folder), "--save", str(tmp_path / "ck")])
    assert str(error.value) == (f"the tokenizer {folder / 'vocab.txt'} has 200 tokens, the model's vocab_size is 100; "
                                f"put the model's own tokenizer in {folder} (one of at most 100 tokens, the rows of "
                                "its embedding)")
    assert not (tmp_path / "ck").exists()


@pytest.mark.filterwarnings("ignore:.*holds no vocab.txt")
def test_from_hf_of_local_layers_with_attention_dropout_stores_none(tmp_path):
    """A ModernBERT folder with attention_dropout 0.1 (a fine-tuning config) was refused with 'set
    --attention-dropout 0', a flag from-hf does not have. A rate shapes no weight: the checkpoint stores 0,
    which local layers support, and one warning line says so; every layer global keeps the folder's rate."""
    from test_hf_modernbert import hf_folder

    _, folder = hf_folder(tmp_path, "geglu-every3")
    settings = folder / "config.json"
    config = json.loads(settings.read_text())
    settings.write_text(json.dumps({**config, "attention_dropout": 0.1}))
    with pytest.warns(UserWarning, match=f"^{settings} sets attention_dropout 0.1, which local layers do not support "
                                         r"\(their tiles are recomputed exactly in backward\): the checkpoint stores "
                                         r"attention_dropout 0 \(dropout changes no weight\)$"):
        tool_module().main(["from-hf", "--hf-dir", str(folder), "--save", str(tmp_path / "ck")])
    assert checkpoint.stored_config(str(tmp_path / "ck"), "iter_0000000")["model"]["attention_dropout"] == 0.0
    settings.write_text(json.dumps({**config, "attention_dropout": 0.1, "global_attn_every_n_layers": 1,
                                    "layer_types": None}))
    tool_module().main(["from-hf", "--hf-dir", str(folder), "--save", str(tmp_path / "global")])
    assert checkpoint.stored_config(str(tmp_path / "global"), "iter_0000000")["model"]["attention_dropout"] == 0.1


@pytest.mark.parametrize("origin, stored, seq_length, exported", [
    ({"from": None}, 8192, 64, 64),  # a preset run from scratch stored before runs stored their length
    ("scratch", 8192, 64, 8192),  # a run from scratch now: --max-position-embeddings 8192, given on purpose
    ({"from": "/models/modernbert", "kind": "hf"}, 8192, 64, 8192),  # a ModernBERT fine-tuned shorter
    ({"from": "/runs/short", "kind": "checkpoint"}, 64, 128, 128)])  # weights continued at a longer length
def test_to_hf_of_a_rotary_checkpoint_declares_the_length_it_trained_at(tmp_path, origin, stored, seq_length,
                                                                         exported):
    """A rotary model has no position table: its export's max_position_embeddings declares the longest
    length known trained, not a preset's 8192 that a run from scratch stored (said in one warning); the
    8192 of a run from scratch that records its start as runs do now was given by its flag: exported."""
    from megatron.data.tokenizer import BertWordPiece
    from megatron.start_plan import StartPlan, weights_origin
    from test_hf_modernbert import modern_config

    if origin == "scratch":
        origin = weights_origin(StartPlan(load=None, init_from_hf=None, finetune=False, weights_only=False))

    config = modern_config(seq_length=seq_length, max_position_embeddings=seq_length)
    tokenizer = BertWordPiece(str(write_vocab_file(tmp_path / "vocab.txt")))
    hf_convert.save_weights_only_checkpoint(tmp_path / "ck", small_model(config).state_dict(), config, tokenizer)
    run_state = tmp_path / "ck" / "iter_0000000" / "run_state.json"
    header = json.loads(run_state.read_text())
    header["config"]["model"]["max_position_embeddings"] = stored
    run_state.write_text(json.dumps({**header, checkpoint.ORIGIN: origin}))
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        tool_module().main(["to-hf", "--load", str(tmp_path / "ck"), "--output", str(tmp_path / "hf")])
    preset = [str(warning.message) for warning in warned if "max_position_embeddings" in str(warning.message)]
    assert preset == ([f"{tmp_path / 'ck'} stores max_position_embeddings 8192 (a --model-preset's, stored before "
                       "runs from scratch stored their length), which its rotary model never trained at: the export "
                       "declares its --seq-length 64"] if exported < stored else [])
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["max_position_embeddings"] == exported
    assert checkpoint.declared_positions(str(tmp_path / "ck"), "iter_0000000") == exported


def test_an_output_the_tool_cannot_make_is_named_as_given_and_a_link_to_a_missing_folder_kept(tmp_path, capsys):
    """--save / --output a link to a folder not made yet (a scratch folder, an unmounted file system): was
    '(File exists)' and the user's link deleted as a folder the tool had made. A folder the tool may not
    write in: was named by the hidden staging folder the user never gave ('.out.x1y2')."""
    from megatron.errors import run_tool
    from test_hf_modernbert import hf_folder, vocab_of

    tool = tool_module()
    _, folder = hf_folder(tmp_path, "geglu-every3")
    vocab_of(tmp_path, 100).rename(folder / "vocab.txt")
    (tmp_path / "ck_link").symlink_to(tmp_path / "scratch" / "ck")
    (tmp_path / "out_link").symlink_to(tmp_path / "scratch" / "out")
    capsys.readouterr()
    for argv, link in ((["from-hf", "--hf-dir", str(folder), "--save", str(tmp_path / "ck_link")], "ck_link"),
                       (["to-hf", "--load", str(folder.parent / "ck"), "--output", str(tmp_path / "out_link" / "m")],
                        "out_link")):
        if argv[0] == "to-hf":
            tool.main(["from-hf", "--hf-dir", str(folder), "--save", str(folder.parent / "ck")])
            capsys.readouterr()
        assert run_tool("convert_checkpoint.py", lambda: tool.main(argv)) == 2
        target = tmp_path / "scratch" / link.removesuffix("_link")
        assert capsys.readouterr().err.splitlines() == [
            f"convert_checkpoint.py: error: {tmp_path / link} is a link to {target}, which does not exist (a scratch "
            f"folder not made yet, a file system not mounted); create it (mkdir -p {target}), or pass another folder"]
        assert (tmp_path / link).is_symlink()

    def refused(*args, prefix, dir, **kwargs):
        raise PermissionError(1, "Operation not permitted", os.path.join(dir, f"{prefix}x1y2"))

    with mock.patch.object(tempfile, "mkdtemp", refused):
        assert run_tool("convert_checkpoint.py", lambda: tool.main(
            ["to-hf", "--load", str(folder.parent / "ck"), "--output", str(tmp_path / "kernel" / "export")])) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"convert_checkpoint.py: error: cannot write the Hugging Face folder {tmp_path / 'kernel' / 'export'} "
        "(Operation not permitted); pass a --output this user can write"]
    assert not (tmp_path / "kernel").exists()


def test_an_output_where_no_file_can_go_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    """to-torch ended in torch's traceback for every output it could not write ('Parent directory ... does not
    exist', 'invalid file name: .partial', 'open file failed'); to-hf and from-hf said '(File exists)' of a
    file where their folder goes. Now a missing folder is made, as to-hf makes it, and the rest is one line
    naming the flag: a file on the path, '', a folder's name, a folder this user may not write; nothing
    left behind."""
    from megatron.data.tokenizer import BertWordPiece
    from megatron.errors import run_tool

    tool = tool_module()
    config = small_config("dense")
    tokenizer = BertWordPiece(str(write_vocab_file(tmp_path / "vocab.txt")))
    hf_convert.save_weights_only_checkpoint(tmp_path / "ck", small_model(config).state_dict(), config, tokenizer)
    hf_convert.save_hf_folder(tmp_path / "hf", small_model(config).state_dict(), config, tmp_path / "vocab.txt")
    (tmp_path / "afile").touch()
    source = ["--load", str(tmp_path / "ck")]

    def refused(argv: list) -> str:
        capsys.readouterr()
        assert run_tool("convert_checkpoint.py", lambda: tool.main(argv)) == 2
        return capsys.readouterr().err.splitlines()[-1].removeprefix("convert_checkpoint.py: error: ")

    under = f"lies under {tmp_path / 'afile'}, which is a file, not a directory"
    assert refused(["to-torch", *source, "--output", str(tmp_path / "afile" / "x.pt")]) == (
        f"--output {tmp_path / 'afile' / 'x.pt'} {under}; pass another --output, or move that file")
    monkeypatch.chdir(tmp_path)  # a relative path is named as written, the file in the way too (docs/errors.md)
    assert refused(["to-torch", *source, "--output", "afile/x.pt"]) == (
        "--output afile/x.pt lies under afile, which is a file, not a directory; pass another --output, or move "
        "that file")
    assert refused(["to-hf", *source, "--output", str(tmp_path / "afile" / "sub")]) == (
        f"--output {tmp_path / 'afile' / 'sub'} {under}; pass another --output, or move that file")
    assert refused(["from-hf", "--hf-dir", str(tmp_path / "hf"), "--save", str(tmp_path / "afile")]) == (
        f"--save {tmp_path / 'afile'} is a file, not a directory; pass another --save, or move that file")
    assert refused(["to-torch", *source, "--output", ""]) == (
        "--output is given an empty value (''); pass --output a value (an unset shell variable gives '': --output "
        "\"$DIR\")")
    assert refused(["to-torch", *source, "--output", f"{tmp_path / 'new'}/"]) == (
        f"--output {tmp_path / 'new'}/ names a folder, and to-torch writes one file; pass a file path, e.g. "
        f"--output {tmp_path / 'new' / 'bert.pt'}")

    def read_only(value, path):
        raise PermissionError(1, "Operation not permitted", str(path))

    with mock.patch.object(tool, "torch_save", read_only):
        assert refused(["to-torch", *source, "--output", str(tmp_path / "ro" / "x.pt")]) == (
            f"cannot write {tmp_path / 'ro' / 'x.pt'} (Operation not permitted); pass a --output this user can write")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["afile", "ck", "hf", "vocab.txt"]
    tool.main(["to-torch", *source, "--output", str(tmp_path / "made" / "bert.pt")])
    assert torch.load(tmp_path / "made" / "bert.pt").keys() == small_model(config).state_dict().keys()
    assert os.listdir(tmp_path / "made") == ["bert.pt"]


def test_weights_their_run_state_does_not_describe_are_refused_by_every_reader(tmp_path):
    """A run_state.json whose config.model contradicts the weights beside it (edited, or copied from another
    checkpoint): to-hf wrote an export whose config.json its tensors contradict ('hidden 96', exit 0) and
    fill_mask.py ended in load_state_dict's size-mismatch traceback; one without config.model was a KeyError
    traceback in both. The shared reader (checkpoint_weights.bert_state_from_checkpoint) names the tensor and
    the file; nothing is written."""
    from megatron.data.tokenizer import BertWordPiece
    from megatron.errors import DataError

    config = small_config("dense")
    tokenizer = BertWordPiece(str(write_vocab_file(tmp_path / "vocab.txt")))
    fill_mask = tool_module("fill_mask")
    for edit, message in [
            (lambda model: model.update(hidden_size=48), "holds tensor embeddings.word_embeddings.weight of shape "
             "[112, 32], where the model {state} describes has [112, 48]{fix}"),
            (lambda model: model.update(num_layers=3), "lacks tensor layers.2.attention_layernorm.weight, which the "
             "model {state} describes has{fix}"),
            (lambda model: model.update(add_binary_head=False), "holds tensor binary_head.pooler.weight, which the "
             "model {state} describes does not have{fix}"),
            (None, "checkpoint file {state} holds nothing as config.model, not the object of the model's settings; "
             "restore it or resume from an earlier complete checkpoint")]:
        ck = tmp_path / "ck"
        hf_convert.save_weights_only_checkpoint(ck, small_model(config).state_dict(), config, tokenizer)
        state = ck / "iter_0000000" / "run_state.json"
        header = json.loads(state.read_text())
        if edit is None:
            del header["config"]["model"]
        else:
            edit(header["config"]["model"])
        state.write_text(json.dumps(header))
        expected = message.format(state=state, fix=f"; restore {state}, whose config.model must describe the "
                                  "weights beside it")
        for run in (lambda: tool_module().main(["to-hf", "--load", str(ck), "--output", str(tmp_path / "hf")]),
                    lambda: tool_module().main(["to-torch", "--load", str(ck), "--output", str(tmp_path / "t.pt")]),
                    lambda: fill_mask.main(["--load", str(ck), "--text", "a [MASK]"])):
            with pytest.raises(DataError) as error:
                run()
            assert str(error.value).endswith(expected), str(error.value)
        assert sorted(path.name for path in tmp_path.iterdir()) == ["ck", "vocab.txt"]
        shutil.rmtree(ck)
