"""The optimizer and clipping the trainer hands DeepSpeed: flags over the JSON, and the Adam
implementation per device (DeepSpeed's FusedAdam on CUDA, torch's AdamW on CPU)."""
import json

import torch

from megatron.arguments import build_parser
from megatron.training import deepspeed_settings


def settings(*argv, monkeypatch=None, cuda=False):
    if monkeypatch is not None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    return deepspeed_settings(build_parser().parse_args(list(argv)))


def test_cpu_uses_torch_adamw_and_cuda_deepspeed_fused_adam(monkeypatch):
    cpu = settings(monkeypatch=monkeypatch, cuda=False)
    assert cpu["optimizer"]["type"] == "AdamW" and cpu["optimizer"]["params"]["torch_adam"] is True
    gpu = settings(monkeypatch=monkeypatch, cuda=True)
    assert "torch_adam" not in gpu["optimizer"]["params"]  # DeepSpeed then builds its FusedAdam


def test_flags_fill_the_json_optimizer_and_clipping(tmp_path, monkeypatch):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {"lr": 1.0, "torch_adam": False,
                                                                          "fused": True}},
                                "gradient_clipping": 5.0}))
    ds = settings("--deepspeed_config", str(path), "--lr", "3e-4", "--adam-beta2", "0.98", "--clip-grad", "0",
                  monkeypatch=monkeypatch, cuda=False)
    params = ds["optimizer"]["params"]
    assert params["lr"] == 3e-4 and params["betas"] == [0.9, 0.98] and params["fused"] is True
    assert params["torch_adam"] is False  # the JSON's own choice stays
    assert ds["gradient_clipping"] == 0
    assert settings("--deepspeed_config", str(path), monkeypatch=monkeypatch)["gradient_clipping"] == 5.0
