"""Checkpoints: exact resume in the same layout, and weights read back from any layout."""
import re
import shutil
import warnings

import pytest
import torch

from bert_fixtures import padded_batch, small_model
from megatron import checkpoint, checkpoint_save, checkpoint_weights
from megatron.config import resolve
from megatron.errors import ConfigError
from megatron.engine import build_engine, train_step
from megatron.model.pipe import bert_to_pipe_name
from megatron.parallel import state
from megatron.parallel.spawn import run_on_ranks
from test_deepspeed_engine import GLOBAL_BATCH, ds_config, model_flags
from test_sequence_parallel_bert import REL_TOL, max_relative_diff

STEPS = 4


def step_batches(step: int, micro: int, gas: int) -> list:
    """This data rank's micro-batches of step `step` (a different global batch every step)."""
    batch = padded_batch(seed=100 + step)
    micro_batches = [batch.samples(i, i + micro) for i in range(0, GLOBAL_BATCH, micro)]
    return micro_batches[state.get_data_parallel_rank() * gas:][:gas]


def run(pipeline, sequence, zero_stage, directory, stop, save_at=None, resume=False, micro=2, dropout=0.0,
        clipping=None, compute_grad_norm=True) -> dict:
    """Trains to step `stop`, from scratch or resumed from `directory`; saves into `directory` after
    step `save_at`, or after each step of a dict {step: folder}. `dropout`: the hidden dropout;
    `clipping`: the JSON's gradient_clipping (None: ds_config's); `compute_grad_norm`: ZeRO's."""
    saves = save_at if isinstance(save_at, dict) else {save_at: directory}
    gas = GLOBAL_BATCH // micro // (torch.distributed.get_world_size() // (pipeline * sequence))
    ds = ds_config(micro, gas, zero_stage, sequence)
    ds = ds if clipping is None else {**ds, "gradient_clipping": clipping}
    if not compute_grad_norm:
        ds["zero_optimization"] = {**ds["zero_optimization"], "compute_grad_norm": False}
    config = resolve({**model_flags(), "pipeline_parallel_size": pipeline, "hidden_dropout": dropout}, ds,
                     torch.distributed.get_world_size())
    engine = build_engine(config, bert_state=small_model(config.model).state_dict())
    start = checkpoint.load(engine, directory, config)["iteration"] if resume else 0
    losses = []
    with warnings.catch_warnings(record=True) as caught:  # a building or loading op recorded by autograd
        warnings.simplefilter("always")
        for step in range(start, stop):
            losses.append(train_step(engine, step_batches(step, micro, gas)).loss)
            if step + 1 in saves:
                checkpoint_save.save(engine, config, saves[step + 1], iteration=step + 1,
                                consumed_samples=(step + 1) * GLOBAL_BATCH)
    params = {}
    if zero_stage < 3:
        params = {name: p.detach().clone() for name, p in engine.module.named_parameters()}
        if pipeline > 1:
            to_bert = {bert_to_pipe_name(n, config.model.num_layers): n for n in small_model(config.model).state_dict()}
            params = {to_bert[name]: p for name, p in params.items()}
    return {"losses": losses, "params": params, "autograd warnings": [str(w.message)[:60] for w in caught
                                                                     if "autograd kernel" in str(w.message)]}


def merged(results):
    out = {}
    for result in results:
        out.update(result["params"])
    return out


@pytest.mark.parametrize("pipeline,sequence,world", [(1, 2, 2), (2, 2, 4)])
def test_resume_continues_exactly(tmp_path, pipeline, sequence, world):
    """The uninterrupted run also saves after step 2, into a folder of its own; resumed from there, a
    run goes on bit for bit as it did (the save left it unchanged: test_launch_scripts' SIGTERM test
    compares with a run that saves at its end only). Hidden dropout 0.1: the resume restores the RNG."""
    midway, end = str(tmp_path / "b"), str(tmp_path / "a")
    straight = run_on_ranks(run, world, pipeline, sequence, 1, end, STEPS, {2: midway, STEPS: end}, dropout=0.1,
                            timeout=300)
    resumed = run_on_ranks(run, world, pipeline, sequence, 1, midway, STEPS, None, True, dropout=0.1, timeout=300)
    assert resumed[0]["losses"] == straight[0]["losses"][2:], "loss trajectory after resume"
    # the pipeline's load broadcasts the tied embedding: outside autograd, or every backward warns
    assert not any(r["autograd warnings"] for r in straight + resumed), [r["autograd warnings"] for r in resumed]
    for got, want in zip(resumed, straight):
        assert all(torch.equal(got["params"][n], want["params"][n]) for n in want["params"])
    # the stored weights read back in BertModel names, whatever the layout
    stored = checkpoint_weights.bert_state_from_checkpoint(str(tmp_path / "a"))
    assert max_relative_diff(stored, merged(straight), floor=1.0) == 0.0
    assert checkpoint.stored_config(str(tmp_path / "a"), "iter_0000004")["sequence_parallel_size"] == sequence


def test_sequence_parallel_checkpoint_resumes_at_another_degree(tmp_path):
    """ZeRO 0 keeps model and optimizer in files independent of SP: save at SP=2, go on at SP=1."""
    directory = str(tmp_path / "ckpt")
    run_on_ranks(run, 2, 1, 2, 0, directory, 2, 2, timeout=300)
    resumed = run_on_ranks(run, 1, 1, 1, 0, directory, STEPS, None, True, timeout=300)[0]
    straight = run_on_ranks(run, 1, 1, 1, 0, str(tmp_path / "ref"), STEPS, timeout=300)[0]
    assert resumed["losses"] == pytest.approx(straight["losses"][2:], rel=REL_TOL)
    assert max_relative_diff(resumed["params"], straight["params"], floor=1.0) <= REL_TOL


def test_a_resume_in_the_same_layout_clips_at_the_runs_gradient_clipping(tmp_path):
    """ZeRO 1's load restored the checkpoint's gradient_clipping with its state: lowered after a loss spike,
    the clipping stayed the checkpoint's (bit-identical weights) while config.json recorded the new value,
    and at ZeRO 0 or another layout the new value applied."""
    directory = str(tmp_path / "ckpt")
    run_on_ranks(run, 1, 1, 1, 1, directory, 2, 2, clipping=1.0, timeout=300)
    kept, lowered = (run_on_ranks(run, 1, 1, 1, 1, directory, STEPS, None, True, clipping=clipping, timeout=300)[0]
                     for clipping in (1.0, 1e-3))
    assert kept["params"] and any(not torch.equal(kept["params"][name], lowered["params"][name])
                                  for name in kept["params"])
    # DeepSpeed's load raised a ValueError into a run of compute_grad_norm false (no clipping): one line
    with pytest.raises(Exception, match=r"ConfigError: checkpoint \S+ was trained with gradient_clipping 1.0, and "
                                        r"DeepSpeed's ZeRO optimizer cannot load it with zero_optimization."
                                        r"compute_grad_norm false; drop compute_grad_norm false"):
        run_on_ranks(run, 1, 1, 1, 1, directory, STEPS, None, True, clipping=0.0, compute_grad_norm=False,
                     timeout=300)


@pytest.mark.parametrize("saved,loaded", [
    ((2, 1, 1), (1, 2, 1)),  # (pipeline, sequence, ZeRO stage), world 2: the PP=2 -> PP=1
    ((1, 2, 2), (2, 1, 1)),  # into a pipeline, out of ZeRO-2 partitions
    ((1, 2, 1), (1, 1, 0)),  # one rank, torch's own AdamW state
    ((1, 2, 1), (1, 1, 1)),  # only data x seq changes: ZeRO-1 shards of 2 ranks into one
])
def test_checkpoint_loads_in_another_layout(tmp_path, saved, loaded):
    """Weights, Adam moments and step, LR schedule travel through the layout-free files: the run
    goes on as a run in the new layout from the start would (same math, so within fp32 rounding)."""
    directory = str(tmp_path / "ckpt")
    world = lambda layout: layout[0] * layout[1]  # noqa: E731
    run_on_ranks(run, world(saved), *saved, directory, 2, 2, timeout=300)
    resumed = run_on_ranks(run, world(loaded), *loaded, directory, STEPS, None, True, timeout=300)
    straight = run_on_ranks(run, world(loaded), *loaded, str(tmp_path / "ref"), STEPS, timeout=300)
    for got, want in zip(resumed, straight):
        assert got["losses"] == pytest.approx(want["losses"][2:], rel=REL_TOL)
        assert got["params"] and max_relative_diff(got["params"], want["params"], floor=1.0) <= REL_TOL


def test_zero3_weights_read_back(tmp_path):
    directory = str(tmp_path / "ckpt")
    run_on_ranks(run, 2, 1, 2, 3, directory, 1, 1, timeout=300)
    reference = run_on_ranks(run, 2, 1, 2, 0, str(tmp_path / "ref"), 1, 1, timeout=300)[0]["params"]
    stored = checkpoint_weights.bert_state_from_checkpoint(directory)
    assert set(stored) == set(reference)
    assert max_relative_diff(stored, reference, floor=1.0) <= REL_TOL
    # the stage-0 checkpoint of the same layout cannot go on at stage 3 with its optimizer: the way on
    with pytest.raises(Exception, match="ZeRO stage 3 resumes only its own checkpoints .* this one was written at "
                                        "pipeline 1, ZeRO 0, data x seq 1 x 2; .* or pass --finetune"):
        run_on_ranks(run, 2, 1, 2, 3, str(tmp_path / "ref"), 2, None, True, timeout=300)


def test_missing_checkpoint_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(Exception, match="no checkpoint in .* \\(missing 'latest'\\); point --load"):
        checkpoint.latest_tag(str(tmp_path))
    # a run folder whose checkpoints lie one level down: named; and it is no Hugging Face folder
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "latest").write_text("iter_0000002")
    with pytest.raises(Exception, match=f"missing 'latest'\\); point --load at {tmp_path / 'run' / 'checkpoints'}, "):
        checkpoint.latest_tag(str(tmp_path / "run"))
    from megatron.hf_io import read_hf_config

    with pytest.raises(Exception, match="checkpoints is a checkpoint of this trainer, not a Hugging Face model folder; "
                                        "pass it to --load"):
        read_hf_config(tmp_path / "run" / "checkpoints")
    shutil.rmtree(tmp_path / "run")
    # one iter_* folder of a --save directory: the directory is what --load takes
    (tmp_path / "iter_0000002").mkdir()
    (tmp_path / "latest").write_text("iter_0000002")
    with pytest.raises(Exception, match=f"{tmp_path / 'iter_0000002'} is one checkpoint of the --save directory "
                                        f"{tmp_path}; point --load at {tmp_path} \\(its 'latest' names the "
                                        "checkpoint to read: write iter_0000002 into it to resume this one\\)$"):
        checkpoint.latest_tag(str(tmp_path / "iter_0000002"))
    # given relative, the directory is named relative, as the user wrote it (docs/errors.md); from inside the
    # --save directory it is named '.', not ''
    monkeypatch.chdir(tmp_path.parent)
    with pytest.raises(ConfigError) as refused:
        checkpoint.latest_tag(f"{tmp_path.name}/iter_0000002")
    assert str(refused.value) == (f"{tmp_path.name}/iter_0000002 is one checkpoint of the --save directory "
                                  f"{tmp_path.name}; point --load at {tmp_path.name} (its 'latest' names the checkpoint "
                                  "to read: write iter_0000002 into it to resume this one)")
    with pytest.raises(ConfigError, match=f"; pass --load {tmp_path.name} --tag iter_0000002$"):
        checkpoint.chosen_tag(f"{tmp_path.name}/iter_0000002", None)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="^iter_0000002 is one checkpoint of the --save directory .; point --load "
                                          "at . "):
        checkpoint.latest_tag("iter_0000002")
    monkeypatch.chdir(tmp_path / "iter_0000002")
    with pytest.raises(ConfigError, match=r"^\. is one checkpoint of the --save directory \.\.; point --load at \.\. "):
        checkpoint.latest_tag(".")


def test_a_latest_that_is_not_text_is_one_line(tmp_path):
    """`latest` holding bytes that are not UTF-8 (a disk error, a binary file copied over it) stopped the trainer
    and every tool with a UnicodeDecodeError traceback."""
    from megatron.errors import DataError

    (tmp_path / "iter_0000002").mkdir()
    (tmp_path / "iter_0000002" / "mp_rank_00_model_states.pt").touch()
    (tmp_path / "latest").write_bytes(b"\x00\xffgarbage")
    line = (f"{tmp_path / 'latest'} is not a checkpoint tag (it is not text); write the tag of a complete iter_* "
            f"folder of {tmp_path} into it (the newest: iter_0000002)")
    for read in (checkpoint.latest_tag, lambda folder: checkpoint.checkpoint_folder(folder, "iter_0000009")):
        with pytest.raises(DataError) as refused:
            read(str(tmp_path))
        assert str(refused.value) == line


def test_a_latest_that_is_no_file_is_named_with_a_fix_that_works(tmp_path):
    """`latest` a link to the iter_* folder (other frameworks' habit): the run said 'no latest' and advised
    writing the tag into it, which fails on a link to a folder (Is a directory). Named as a link, by the
    trainer's --save check and by every reader, with a fix that works; a link to nothing names the newest."""
    import subprocess

    from megatron.errors import DataError

    for tag in ("iter_0000002", "iter_0000004"):
        (tmp_path / tag).mkdir()
        (tmp_path / tag / "mp_rank_00_model_states.pt").touch()
    latest = tmp_path / "latest"
    latest.symlink_to("iter_0000002")
    for check in (checkpoint.latest_tag, checkpoint_save.refuse_unnamed_checkpoints):
        with pytest.raises(DataError) as refused:
            check(str(tmp_path))
        assert refused.value.problem == f"{latest} is a link to the folder iter_0000002, not a file holding the " \
                                        "tag of a checkpoint"
    assert refused.value.fix == f"replace it with a file naming iter_0000002: rm {latest} && echo iter_0000002 > " \
                                f"{latest}"
    subprocess.run(["bash", "-c", refused.value.fix.split(": ", 1)[1]], check=True)
    assert checkpoint.latest_tag(str(tmp_path)) == "iter_0000002"
    latest.unlink()
    latest.symlink_to("gone")
    with pytest.raises(DataError, match=f"is a link to gone, which does not exist, .*echo iter_0000004 > {latest}$"):
        checkpoint.latest_tag(str(tmp_path))


def test_a_tools_tag_after_a_rollback_names_latests_and_an_iteration_is_its_folder(tmp_path):
    """`latest` set back to iter 2 while iter 4 (the run rolled back from) stays: a wrong --tag is told the one
    `latest` names, not "the newest" abandoned one; reading iter 4 says whose it is; --tag 4 (Megatron's
    --ckpt-step habit) is iter_0000004."""
    import json

    from megatron.errors import DataError

    for iteration in (2, 4):
        folder = tmp_path / checkpoint.tag_for(iteration)
        folder.mkdir()
        (folder / "mp_rank_00_model_states.pt").write_bytes(b"x")
        (folder / checkpoint.RUN_STATE).write_text(json.dumps({"config": {"model": {}}, "iteration": iteration,
                                                               "consumed_samples": 0}))
    (tmp_path / checkpoint.LATEST).write_text("iter_0000002")
    with pytest.raises(DataError, match=re.escape(f"pass the tag of a complete iter_* folder of {tmp_path} (the one "
                                                  "'latest' names: iter_0000002)")):
        checkpoint.checkpoint_folder(str(tmp_path), checkpoint.chosen_tag(str(tmp_path), "iter_0000009"))
    assert checkpoint.chosen_tag(str(tmp_path), "4") == checkpoint.chosen_tag(str(tmp_path), "iter_4") == "iter_0000004"
    assert checkpoint.read_from(str(tmp_path), "iter_0000004") == (
        f"{tmp_path / 'iter_0000004'} (iteration 4; 'latest' names the older iter_0000002: this one is of the run "
        "rolled back from)")
    assert checkpoint.read_from(str(tmp_path), "iter_0000002") == f"{tmp_path / 'iter_0000002'} (iteration 2)"
    (tmp_path / checkpoint.LATEST).write_text("iter_0000004")
    assert checkpoint.read_from(str(tmp_path), "iter_0000004") == f"{tmp_path / 'iter_0000004'} (iteration 4)"
    assert checkpoint.newest_hint(str(tmp_path)) == " (the newest: iter_0000004)"


def test_a_resume_with_another_optimizer_type_is_refused():
    """SGD restoring AdamW's state stopped with KeyError 'momentum' in its first step; a type given in
    other case is the same optimizer (DeepSpeed reads it case-insensitively), and Adam keeps AdamW's
    state (the same moments)."""
    from megatron.checkpoint_compat import check_same_optimizer
    from megatron.errors import ConfigError

    stored = {"ds_config": {"optimizer": {"type": "AdamW", "params": {}}}}
    with pytest.raises(ConfigError, match="holds the state of optimizer.type AdamW, this run's is SGD; resume with "
                                          "optimizer.type AdamW, or pass --finetune and another --save"):
        check_same_optimizer(stored, {"optimizer": {"type": "SGD"}}, "ckpt/iter_0000002")
    check_same_optimizer(stored, {"optimizer": {"type": "adamw"}}, "ckpt/iter_0000002")
    check_same_optimizer(stored, {"optimizer": {"type": "Adam"}}, "ckpt/iter_0000002")
    check_same_optimizer(stored, {"optimizer": {"type": "AdamW", "params": {"adam_w_mode": False}}}, "ckpt")
    # the weight-decay rule: AdamW's into L2 kept the checkpoint's silently, L2 into AdamW's switched
    with pytest.raises(ConfigError, match=re.escape(
            "checkpoint ckpt was trained with AdamW's decoupled weight decay, this run's optimizer uses Adam's L2 "
            "weight decay (adam_w_mode false); resume with optimizer.type AdamW (or Adam without \"adam_w_mode\": "
            "false), or pass --finetune and another --save")):
        check_same_optimizer(stored, {"optimizer": {"type": "Adam", "params": {"adam_w_mode": False}}}, "ckpt")
    l2 = {"ds_config": {"optimizer": {"type": "Adam", "params": {"adam_w_mode": False}}}}
    with pytest.raises(ConfigError, match=re.escape(
            "checkpoint ckpt was trained with Adam's L2 weight decay (adam_w_mode false), this run's optimizer uses "
            "AdamW's decoupled weight decay; resume with optimizer.type Adam with \"adam_w_mode\": false in")):
        check_same_optimizer(l2, {"optimizer": {"type": "Adam"}}, "ckpt")
    check_same_optimizer(l2, {"optimizer": {"type": "adam", "params": {"adam_w_mode": False, "lr": 1e-3}}}, "ckpt")


def test_an_engine_of_other_optimizer_groups_is_refused_a_checkpoint():
    """The optimizer state restores group for group: an engine built without the checkpoint's grouping (the
    trainer takes it: starting_weights.model_flags) is one line, not torch's mismatch inside DeepSpeed's load."""
    from megatron.checkpoint_compat import check_same_grouping
    from megatron.config import TrainConfig
    from megatron.errors import ConfigError
    from megatron.model.bert import BertConfig

    new, old = (TrainConfig(model=BertConfig(), decay_norms_and_biases=decay) for decay in (False, True))
    written_before = {key: value for key, value in new.to_dict().items() if key != "decay_norms_and_biases"}
    with pytest.raises(ConfigError, match=r"checkpoint ckpt/iter_0000002 was trained with decay_norms_and_biases True "
                                          r"\(weight decay on biases and norm weights\), this run's config has False; "
                                          r"build the config with decay_norms_and_biases True"):
        check_same_grouping(written_before, new, "ckpt/iter_0000002")
    check_same_grouping(written_before, old, "ckpt/iter_0000002")
    check_same_grouping(new.to_dict(), new, "ckpt/iter_0000002")


GOOD_DATA = {"data": [[1.0, "0123"]], "data_path": ["a/corpus"], "split": [1.0, 0.0, 0.0], "split_flag": "1,0,0",
             "seed": 1234}


@pytest.mark.parametrize("record", [1, {"data": [[1.0, "0123"]]}, {"data": "a", "data_path": [], "split": [1.0],
                                                                    "split_flag": "1", "seed": 1},
                                    {**GOOD_DATA, "split": [0.5, 0.5]},  # 2 shares of a 3-part --split
                                    {**GOOD_DATA, "data_path": ["1", "a/corpus", "1", "b/corpus"]},  # 2 paths, 1 set
                                    {**GOOD_DATA, "mask_prob": "0.15"}])
def test_a_malformed_data_record_is_one_line(tmp_path, record):
    """The record a resume compares its data with (resume.describe_data_change) read a hand-edited
    run_state.json's "data" by key and stopped with a KeyError or TypeError."""
    import json

    from megatron.errors import DataError

    folder = tmp_path / "iter_0000001"
    folder.mkdir()
    (folder / "mp_rank_00_model_states.pt").touch()
    good = GOOD_DATA
    state = {"config": {"model": {}}, "iteration": 1, "consumed_samples": 2}
    (folder / "run_state.json").write_text(json.dumps({**state, "data": good}))
    assert checkpoint.run_state(str(tmp_path), "iter_0000001")["data"] == good
    (folder / "run_state.json").write_text(json.dumps({**state, "data": record}))
    with pytest.raises(DataError, match=r"as data(\.\w+)?, not the record of the data it trained on; restore it or "
                                        "resume from an earlier complete checkpoint, or delete its \"data\" entry"):
        checkpoint.run_state(str(tmp_path), "iter_0000001")


@pytest.mark.parametrize("key, value, kind", [("config.pipeline_parallel_size", [1], "an integer"),
                                              ("config.micro_batch_size", "2", "an integer"),
                                              ("config.ds_config", [], "an object"),
                                              ("config.model.hidden_size", [64], "an integer"),
                                              ("config.model.hidden_dropout", True, "a number"),
                                              ("schedule.train_iters", [2], "an integer"),
                                              ("schedule.lr", "1e-4", "a number"),
                                              ("weights_from.run_id", 5, None),
                                              ("logs.log_dir", ["a"], None)])
def test_a_hand_edited_run_state_field_of_another_type_is_one_line(tmp_path, key, value, kind):
    """A run_state.json edited by hand with a value its field cannot hold (a size as a list, a count as a string,
    an object as a list): a resume stopped with a TypeError in the layout or schedule arithmetic, or passed the
    value into its next checkpoint. Refused in one line naming the file and the field; a float field takes an
    integer, a field that takes None takes null."""
    import json

    from megatron.errors import DataError

    folder = tmp_path / "iter_0000001"
    folder.mkdir()
    (folder / "mp_rank_00_model_states.pt").touch()
    state = {"config": {"model": {"hidden_size": 64, "hidden_dropout": 0, "ffn_hidden_size": None},
                        "pipeline_parallel_size": 1, "micro_batch_size": 2, "ds_config": {}},
             "iteration": 1, "consumed_samples": 2, "schedule": {"train_iters": 2, "lr": 1e-4},
             "weights_from": {"from": None, "run_id": "abc"}, "logs": {"log_dir": "/l", "tensorboard_dir": None}}
    (folder / "run_state.json").write_text(json.dumps(state))
    assert checkpoint.run_state(str(tmp_path), "iter_0000001") == state
    *parents, leaf = key.split(".")
    node = state
    for part in parents:
        node = node[part]
    node[leaf] = value
    (folder / "run_state.json").write_text(json.dumps(state))
    shown = json.dumps(value)
    top = key.split(".")[0]  # a record checked whole (weights_from, logs): named whole
    expected = (f"checkpoint file {folder / 'run_state.json'} holds {shown} as {key}, not {kind}; restore it" if kind
                else f"holds {json.dumps(state[top])[:40]} as {top}, not the record")
    with pytest.raises(DataError, match=re.escape(expected)):
        checkpoint.run_state(str(tmp_path), "iter_0000001")


def test_a_checkpoint_copied_without_run_state_is_refused(tmp_path):
    """run_state.json missing from a checkpoint of a version that writes it (its client state holds the
    schedule, recorded since) resumed with no word, its recorded start unchecked; one saved before the
    file existed is still read from DeepSpeed's client state."""
    from megatron.errors import DataError

    folder = tmp_path / "iter_0000004"
    folder.mkdir()
    state = {"config": {}, "iteration": 4, "consumed_samples": 8}
    torch.save({"module": {}, **state}, folder / "mp_rank_00_model_states.pt")
    assert checkpoint.run_state(str(tmp_path), "iter_0000004") == state  # saved before run_state.json
    torch.save({"module": {}, **state, "schedule": {"lr": 1e-4}}, folder / "mp_rank_00_model_states.pt")
    with pytest.raises(DataError, match=f"^checkpoint file {folder / 'run_state.json'} is missing; restore it or "
                                        "resume from an earlier complete checkpoint$"):
        checkpoint.run_state(str(tmp_path), "iter_0000004")


def test_latest_naming_an_unfinished_save_is_refused(tmp_path):
    """`latest` edited to name a `.partial` folder: the start-up removed it as a killed save's, then said
    the folder does not exist; it is named for what it is, with the newest complete tag."""
    from megatron.errors import DataError

    for tag in ("iter_0000002", "iter_0000004.partial"):
        (tmp_path / tag).mkdir()
        (tmp_path / tag / "mp_rank_00_model_states.pt").touch()
    (tmp_path / "latest").write_text("iter_0000004.partial")
    with pytest.raises(DataError, match=f"^the 'latest' file of {tmp_path} names iter_0000004.partial, the folder of "
                                        f"a save or removal that did not finish, never a checkpoint; write the tag of "
                                        f"a complete iter_\\* folder of {tmp_path} into it \\(the newest: "
                                        "iter_0000002\\)$"):
        checkpoint.latest_tag(str(tmp_path))


def test_an_unfinished_save_is_never_read_and_is_named_for_what_it_is(tmp_path):
    """`--tag iter_N.partial` (or .removing) was read as a checkpoint (fill_mask predicted, to-hf exported an
    interrupted save), and a truncated one surfaced torch's miniz paragraph; a --save folder holding only a
    killed first save was 'missing latest; point --load at a directory written by --save'. Each names the
    unfinished folder and what to pass instead, for the trainer (start afresh) and for a reader."""
    from megatron.errors import DataError

    run = tmp_path / "run"
    for tag in ("iter_0000002", "iter_0000004.partial", "iter_0000003.removing"):
        (run / tag).mkdir(parents=True)
        (run / tag / "mp_rank_00_model_states.pt").write_bytes(b"PK\x03\x04 truncated")
    (run / "latest").write_text("iter_0000002")
    for tag, what in (("iter_0000004.partial", "save"), ("iter_0000003.removing", "--keep-last removal")):
        with pytest.raises(DataError, match=f"^--tag {tag} is a {what} that did not finish \\(interrupted\\), never a "
                                            f"checkpoint; pass --tag of a complete iter_\\* folder of {run} \\(the "
                                            "newest: iter_0000002\\)$"):
            checkpoint.chosen_tag(str(run), tag)
    with pytest.raises(DataError, match=f"^{run / 'iter_0000004.partial'} is a save that did not finish "
                                        f"\\(interrupted\\), not a checkpoint of the --save directory {run}; pass "
                                        f"--load {run} --tag iter_0000002$"):
        checkpoint.chosen_tag(str(run / "iter_0000004.partial"), None)
    assert checkpoint.chosen_tag(str(run), "iter_0000002") == "iter_0000002"
    with pytest.raises(DataError) as caught:  # a truncated file: torch's first sentence, not its paragraph
        checkpoint.safe_load(str(run / "iter_0000002" / "mp_rank_00_model_states.pt"))
    assert str(caught.value).count(";") == 1 and "miniz" not in str(caught.value)
    first = tmp_path / "first"  # a first save that was killed: no `latest`, nothing complete
    (first / "iter_0000002.partial").mkdir(parents=True)
    with pytest.raises(DataError, match=f"^no checkpoint in {first}: iter_0000002.partial is a save that did not "
                                        f"finish \\(interrupted\\); start without --load \\(a run with --save {first} "
                                        f"removes it at its start\\), or delete {first / 'iter_0000002.partial'}$"):
        checkpoint.latest_tag(str(first))
    with pytest.raises(DataError, match=f"; let the run that saves into {first} finish a save"):
        checkpoint.chosen_tag(str(first), None)
    with pytest.raises(DataError, match=f"--tag iter_0000002.partial is a save .*; {first} holds no complete "
                                        "checkpoint yet"):
        checkpoint.chosen_tag(str(first), "iter_0000002.partial")


def test_zero0_masters_are_placed_by_the_optimizers_order_or_not_at_all():
    """A bf16 / fp16 ZeRO-0 model file holds the fp32 masters flat beside the rounded module; they are
    read in the optimizer's order: its weights' group, then its biases' and norm weights' (a checkpoint
    of the one group that decayed them too: the module's order), and a flat buffer that cannot be the
    module's is not guessed at."""
    module = {"a": torch.zeros(2, 2, dtype=torch.bfloat16), "b": torch.zeros(3, dtype=torch.bfloat16),
              "c.weight": torch.zeros(1, 2, dtype=torch.bfloat16)}
    masters = torch.arange(9, dtype=torch.float32)
    states = {"module": module, "optimizer": {"fp32_groups_flat": [masters[:6], masters[6:]]}}
    state = checkpoint_weights._zero0_masters(states, decay_norms_and_biases=False)
    assert list(state) == list(module)
    assert (state["a"].tolist(), state["c.weight"].tolist(), state["b"].tolist()) == (
        [[0.0, 1.0], [2.0, 3.0]], [[4.0, 5.0]], [6.0, 7.0, 8.0])
    state = checkpoint_weights._zero0_masters({"module": module, "optimizer": {"fp32_groups_flat": [masters]}},
                                              decay_norms_and_biases=True)
    assert (state["a"].tolist(), state["b"].tolist(), state["c.weight"].tolist()) == (
        [[0.0, 1.0], [2.0, 3.0]], [4.0, 5.0, 6.0], [[7.0, 8.0]])
    short = {"module": module, "optimizer": {"fp32_groups_flat": [masters[:8]]}}
    assert checkpoint_weights._zero0_masters(short, False) is None
    assert checkpoint_weights._zero0_masters({"module": module, "optimizer": {}}, False) is None


def test_a_half_precision_checkpoint_without_readable_masters_says_it_gives_its_rounded_copies(tmp_path):
    """A bf16 checkpoint written before the layout-free files existed (ZeRO 1: the masters lie in its
    partitioned optimizer files): its module's bf16 copies are read, in one warning."""
    import dataclasses
    import json

    from bert_fixtures import small_config

    folder = tmp_path / "iter_0000001"
    folder.mkdir()
    model = small_config("dense")
    module = {name: tensor.to(torch.bfloat16) for name, tensor in small_model(model).state_dict().items()}
    torch.save({"module": module}, folder / "mp_rank_00_model_states.pt")
    config = {"ds_config": {"bf16": {"enabled": True}}, "zero_stage": 1, "pipeline_parallel_size": 1,
              "model": dataclasses.asdict(model)}
    (folder / "run_state.json").write_text(json.dumps({"config": config, "iteration": 1, "consumed_samples": 2}))
    (tmp_path / "latest").write_text("iter_0000001")
    with pytest.warns(UserWarning, match=r"\(bf16, pipeline 1, ZeRO 1\) holds no fp32 master weights read here: its "
                                         "bf16 copies are read"):
        assert checkpoint_weights.bert_state_from_checkpoint(str(tmp_path))["lm_head.bias"].dtype == torch.bfloat16


def test_the_recovery_scripts_left_in_a_pipeline_save_exit_2_with_one_line(tmp_path):
    """DeepSpeed's zero_to_fp32.py / zero_to_torch.py, replaced after a pipeline save, keep the error contract:
    one line on stderr and exit status 2 (sys.exit of the message exited 1)."""
    import subprocess
    import sys

    for name in checkpoint_save.RECOVERY_SCRIPTS:
        (tmp_path / name).write_text("print('DeepSpeed\\'s script')\n")
    checkpoint_save.replace_recovery_scripts(str(tmp_path))
    for name in checkpoint_save.RECOVERY_SCRIPTS:
        done = subprocess.run([sys.executable, str(tmp_path / name), str(tmp_path), str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout) == (2, ""), done
        assert done.stderr.splitlines() == [
            f"{name}: error: {tmp_path} holds pipeline checkpoints, which DeepSpeed's {name} cannot read; export a "
            f"plain state dict with {sys.executable} {checkpoint_save.CONVERT_TOOL} to-torch --load {tmp_path} "
            "--output OUT.pt"], done.stderr


def test_layout_free_files_of_an_earlier_version_name_the_layout_to_resume_in(tmp_path):
    """'resume in the layout it was written in' named neither that layout nor the other way on."""
    from megatron.errors import DataError

    stored = {"pipeline_parallel_size": 1, "zero_stage": 1, "data_parallel_size": 1, "sequence_parallel_size": 2,
              "ds_config": {"bf16": {"enabled": True}}}
    torch.save({"step": 2, "params": {}}, tmp_path / checkpoint.LAYOUT_FREE.format(stage=0))
    with pytest.raises(DataError, match=r"written without the optimizer's settings .* by an earlier version of this "
                                        r"trainer; resume in the layout it was written in \(pipeline 1, ZeRO 1, data x "
                                        r"seq 1 x 2, bf16\), or pass --finetune and another --save"):
        checkpoint._load_layout_free(None, None, str(tmp_path), stored)
