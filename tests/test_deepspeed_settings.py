"""The optimizer the trainer hands DeepSpeed (--clip-grad is resolve's: test_config.py): flags given over the
JSON over the defaults, the Adam implementation per device (DeepSpeed's FusedAdam on CUDA, torch's AdamW on
CPU), and a JSON scheduler refused (the trainer runs its own schedule)."""
import json

import pytest
import torch

from megatron.arguments import build_parser
from megatron.errors import ConfigError
from megatron.training import deepspeed_settings


def settings(*argv, monkeypatch=None, cuda=False):
    if monkeypatch is not None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    return deepspeed_settings(build_parser().parse_args(list(argv)))


def test_cpu_uses_torch_adamw_and_cuda_deepspeed_fused_adam(monkeypatch):
    cpu = settings(monkeypatch=monkeypatch, cuda=False)
    assert cpu["optimizer"]["type"] == "AdamW" and cpu["optimizer"]["params"]["torch_adam"] is True
    from megatron.parallel import device

    monkeypatch.setattr(device, "fused_adam_problem", lambda: None)  # prebuilt, or an nvcc of torch's CUDA
    gpu = settings(monkeypatch=monkeypatch, cuda=True)
    assert "torch_adam" not in gpu["optimizer"]["params"]  # DeepSpeed then builds its FusedAdam


def test_flags_fill_the_json_optimizer(tmp_path, monkeypatch):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {"lr": 1.0, "torch_adam": False,
                                                                          "amsgrad": True}},
                                "gradient_clipping": 5.0}))
    ds = settings("--deepspeed_config", str(path), "--lr", "3e-4", "--adam-beta2", "0.98", "--clip-grad", "0",
                  monkeypatch=monkeypatch, cuda=False)
    params = ds["optimizer"]["params"]
    assert params["lr"] == 3e-4 and params["betas"] == [0.9, 0.98] and params["amsgrad"] is True
    assert params["torch_adam"] is False  # the JSON's own choice stays
    assert ds["gradient_clipping"] == 5.0  # --clip-grad 0 wins in config.resolve, which names it in its errors


def test_only_given_flags_override_the_json_optimizer(tmp_path, monkeypatch):
    """Flags given > the JSON's optimizer.params > defaults: a flag's default never replaces a
    JSON value (--lr's default 1e-4 used to win over the JSON's lr)."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {
        "lr": 5e-4, "weight_decay": 0.1, "betas": [0.8, 0.95], "eps": 1e-6}}}))
    params = settings("--deepspeed_config", str(path), monkeypatch=monkeypatch)["optimizer"]["params"]
    assert (params["lr"], params["weight_decay"], params["betas"], params["eps"]) == (5e-4, 0.1, [0.8, 0.95], 1e-6)
    params = settings("--deepspeed_config", str(path), "--adam-beta2", "0.99", "--adam-eps", "1e-7",
                      monkeypatch=monkeypatch)["optimizer"]["params"]
    assert (params["lr"], params["weight_decay"], params["betas"], params["eps"]) == (5e-4, 0.1, [0.8, 0.99], 1e-7)
    path.write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {"weight_decay": 0.0}}}))
    params = settings("--deepspeed_config", str(path), monkeypatch=monkeypatch)["optimizer"]["params"]
    assert (params["lr"], params["weight_decay"], params["betas"], params["eps"]) == (1e-4, 0.0, [0.9, 0.999], 1e-8)


def test_json_scheduler_is_refused_in_one_line(tmp_path, monkeypatch):
    """DeepSpeed drops a JSON "scheduler" for the schedule the trainer hands it: say so."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}))
    with pytest.raises(ConfigError) as error:
        settings("--deepspeed_config", str(path), monkeypatch=monkeypatch)
    assert '"scheduler" section is not used' in str(error.value) and "--lr-warmup-fraction" in str(error.value)
    assert "\n" not in str(error.value)


def test_min_lr_above_the_json_lr_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {"lr": 1e-5}}}))
    with pytest.raises(ConfigError, match=r"--min-lr 0.0001 is above the JSON's optimizer.params.lr 1e-05"):
        settings("--deepspeed_config", str(path), "--min-lr", "1e-4", monkeypatch=monkeypatch)


@pytest.mark.parametrize("name", ["SGD", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "Rprop", "ASGD",
                                  "Adafactor", "Adam", "AdamW"])
def test_every_optimizer_type_gets_only_the_params_it_takes(tmp_path, monkeypatch, name):
    """The defaults fill only the params the type takes (SGD has no betas, no eps), torch_adam only for an
    Adam: the params the trainer hands DeepSpeed construct the torch class DeepSpeed builds on CPU."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"optimizer": {"type": name}}))
    params = dict(settings("--deepspeed_config", str(path), monkeypatch=monkeypatch)["optimizer"]["params"])
    cls = getattr(torch.optim, "AdamW" if params.pop("torch_adam", False) else name)
    assert params["lr"] == 1e-4
    cls([torch.nn.Parameter(torch.zeros(2))], **params)  # no TypeError


def test_optimizer_flags_are_refused_where_the_type_has_no_such_param(tmp_path, monkeypatch):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}}))
    assert settings("--deepspeed_config", str(path), "--weight-decay", "0.1", "--lr", "0.2",
                    monkeypatch=monkeypatch)["optimizer"]["params"] == {"lr": 0.2, "momentum": 0.9, "weight_decay": 0.1}
    for flag in ("--adam-beta1", "--adam-beta2", "--adam-eps"):
        with pytest.raises(ConfigError, match=f"{flag} 0.5 is given but optimizer.type SGD takes no "):
            settings("--deepspeed_config", str(path), flag, "0.5", monkeypatch=monkeypatch)


def json_file(tmp_path, ds: dict) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    return str(path)


@pytest.mark.parametrize("argv,ds,expected", [
    ([], {"steps_per_print": 1}, ['note: steps_per_print 1 prints nothing: DeepSpeed logs its step line at '
                                  '"log_level": "info" only; the trainer\'s own line (step, lr, loss) comes every '
                                  '--log-interval steps (now 10): pass --log-interval 1 for it every 1 steps']),
    (["--log-interval", "5"], {"steps_per_print": 5}, []),  # the progress the user asked for, every 5 steps
    ([], {"steps_per_print": 5, "log_level": "info"}, []),  # DeepSpeed's line shows
    ([], {"activation_checkpointing": {"number_checkpoints": 4}},
     ["note: activation_checkpointing.number_checkpoints 4 changes nothing: DeepSpeed reads it only for "
      "contiguous_memory_optimization, which this trainer refuses; the layers per checkpointed chunk are "
      "--checkpoint-num-layers"]),
    ([], {"comms_logger": {"enabled": True, "verbose": True}},
     ['note: comms_logger.verbose prints nothing: DeepSpeed logs each collective at "log_level": "info" only; the '
      "comms_logger summary is printed at the end of the run"]),
    ([], {}, []),  # the trainer's own steps_per_print (never) is no setting of the user's
])
def test_json_settings_that_show_or_change_nothing_get_a_note(tmp_path, monkeypatch, capsys, argv, ds, expected):
    """steps_per_print printed nothing (DeepSpeed's step line is an INFO log line, hidden at its default level)
    and number_checkpoints changed nothing, without a word. Said by the run's start-up checks (a tool that
    checks the run's flags first, extend_context.py, calls deepspeed_settings too, and said them twice)."""
    from megatron import start_plan, training

    monkeypatch.delenv("WORLD_SIZE", raising=False)  # no layout resolved before the rendezvous
    args = build_parser().parse_args(["--deepspeed_config", json_file(tmp_path, ds), *argv])
    deepspeed_settings(args)
    assert capsys.readouterr().out == ""
    training.check_before_rendezvous(args, start_plan.check_start(args))
    out, err = capsys.readouterr()
    assert (out.splitlines(), err) == (expected, "")


@pytest.mark.parametrize("ds,expected", [
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}, None),  # torch's AdamW: no build
    ({"optimizer": {"type": "AdamW", "params": {"torch_adam": False}},
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}, ("cpu_adam", "DeepSpeedCPUAdam")),
    ({"optimizer": {"type": "Adagrad"}, "zero_optimization": {"stage": 1, "cpu_offload": True}},
     ("cpu_adagrad", "DeepSpeedCPUAdagrad")),
    ({"optimizer": {"type": "AdamW", "params": {"torch_adam": False}}, "zero_optimization": {"stage": 2}}, None),
])
def test_the_jit_build_of_a_cpu_optimizer_is_said_before_it_runs(tmp_path, monkeypatch, ds, expected):
    """ZeRO offload with DeepSpeed's CPU Adam built cpu_adam for a minute in silence: one line says so, unless it
    is built already."""
    from deepspeed.git_version_info import installed_ops

    from megatron.parallel import device

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    for name in ("cpu_adam", "cpu_adagrad"):
        monkeypatch.setitem(installed_ops, name, False)
    ds = settings("--deepspeed_config", json_file(tmp_path, ds), monkeypatch=monkeypatch)
    note = device.cpu_optimizer_build_note(ds)
    if expected is None:
        assert note is None
        return
    op, optimizer = expected
    assert note == (f"note: building DeepSpeed's {op} op for {optimizer} (the offloaded optimizer) into "
                    f"{tmp_path / 'ext'}: a minute or more, once")
    (tmp_path / "ext" / op).mkdir(parents=True)
    (tmp_path / "ext" / op / f"{op}.so").write_bytes(b"")
    assert device.cpu_optimizer_build_note(ds) is None


def test_the_jit_build_of_the_cpu_all_reduce_op_is_said_before_it_runs(tmp_path, monkeypatch):
    """A first start on a machine without CUDA built DeepSpeed's shared-memory op for 30 s to minutes with nothing
    on screen: one line says so, unless it is built; a CUDA machine builds none."""
    from megatron.parallel import device

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setattr(device, "backend", lambda: "gloo")
    assert device.shm_build_note() == (f"note: building DeepSpeed's deepspeed_shm_comm op (its CPU all-reduce) into "
                                       f"{tmp_path / 'ext'}: a minute or more, once; an interrupted build is started "
                                       "again by the next run")
    (tmp_path / "ext" / "deepspeed_shm_comm").mkdir(parents=True)
    (tmp_path / "ext" / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").write_bytes(b"")
    assert device.shm_build_note() is None
    (tmp_path / "ext" / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").unlink()
    monkeypatch.setattr(device, "backend", lambda: "nccl")
    assert device.shm_build_note() is None


@pytest.mark.parametrize("section,kept", [({"enabled": False, "prof_all": True}, False), ({"prof_all": True}, False),
                                          ({"enabled": True}, True)])
def test_a_comms_logger_not_enabled_is_not_handed_to_deepspeed(tmp_path, monkeypatch, section, kept):
    """DeepSpeed 0.19.8 turns its comms logger on for any "comms_logger" section (it reads the key's presence,
    not its "enabled"), synchronising and timing every collective of a run that asked for none."""
    ds = settings("--deepspeed_config", json_file(tmp_path, {"comms_logger": section}), monkeypatch=monkeypatch)
    assert ("comms_logger" in ds) is kept
