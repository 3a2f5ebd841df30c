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
