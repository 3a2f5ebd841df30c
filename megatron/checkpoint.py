"""Checkpoints through DeepSpeed's engine, plus what resuming exactly needs beyond it.

`save` stores, under tag `iter_XXXXXXX`: DeepSpeed's model / optimizer / ZeRO files, the
resolved config, the iteration and consumed samples (client state), and each rank's torch RNG
state (`rng_rank{N}.pt`; DeepSpeed keeps only one rank's client state). `load` restores all of
it into an engine of the same layout.

`bert_state_from_checkpoint` reads the weights of any layout (plain model at any ZeRO stage, or
pipeline layer files) back into BertModel names, so a checkpoint can start a run with another
pipeline or sequence-parallel degree (weights only; SP never changes the parameters).
"""
import glob
import os
import re

import torch
import torch.distributed as dist

from megatron.config import TrainConfig
from megatron.errors import ConfigError
from megatron.model.pipe import pipe_layer_to_bert


def tag_for(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def save(engine, config: TrainConfig, save_dir: str, iteration: int, consumed_samples: int) -> str:
    tag = tag_for(iteration)
    client_state = {"config": config.to_dict(), "iteration": iteration, "consumed_samples": consumed_samples}
    engine.save_checkpoint(save_dir, tag=tag, client_state=client_state)
    torch.save(torch.get_rng_state(), os.path.join(save_dir, tag, f"rng_rank{dist.get_rank()}.pt"))
    dist.barrier()
    return tag


def latest_tag(load_dir: str) -> str:
    path = os.path.join(load_dir, "latest")
    if not os.path.isfile(path):
        raise ConfigError(f"no checkpoint in {load_dir} (missing 'latest')", "point --load at a directory written by --save")
    with open(path) as file:
        return file.read().strip()


def load(engine, load_dir: str) -> dict:
    """Restores engine state and this rank's RNG; returns the client state (iteration, ...)."""
    tag = latest_tag(load_dir)
    path, client_state = engine.load_checkpoint(load_dir, tag=tag)
    if path is None:
        raise ConfigError(f"checkpoint {load_dir}/{tag} could not be loaded", "check that the directory is complete")
    rng = os.path.join(load_dir, tag, f"rng_rank{dist.get_rank()}.pt")
    if os.path.isfile(rng):
        torch.set_rng_state(torch.load(rng))
    return client_state


def stored_config(load_dir: str, tag: str) -> dict:
    """The resolved config saved with the checkpoint (TrainConfig.to_dict())."""
    states = sorted(glob.glob(os.path.join(load_dir, tag, "*mp_rank_00_model_states.pt")))
    if not states:
        raise ConfigError(f"{load_dir}/{tag} has no model states file", "the checkpoint is incomplete")
    return torch.load(states[0], weights_only=False)["config"]


def bert_state_from_checkpoint(load_dir: str, tag: str | None = None) -> dict:
    """BertModel state dict from a checkpoint of any pipeline / SP degree / ZeRO stage."""
    tag = tag or latest_tag(load_dir)
    folder = os.path.join(load_dir, tag)
    # pipeline: one file per layer and seq rank, identical across seq ranks: take seq rank 0
    layer_files = sorted(glob.glob(os.path.join(folder, "layer_*-model_00-model_states.pt")))
    if layer_files:
        num_layers = stored_config(load_dir, tag)["model"]["num_layers"]
        state = {}
        for path in layer_files:
            layer = int(re.search(r"layer_(\d+)-", os.path.basename(path)).group(1))
            for key, tensor in torch.load(path, weights_only=False).items():
                state[pipe_layer_to_bert(layer, key, num_layers)] = tensor
        return state
    if os.path.isfile(os.path.join(folder, "zero_pp_rank_0_mp_rank_00_model_states.pt")):
        # ZeRO-3: the weights exist only as partitions in the optimizer files
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return get_fp32_state_dict_from_zero_checkpoint(load_dir, tag=tag)
    model_file = os.path.join(folder, "mp_rank_00_model_states.pt")
    if not os.path.isfile(model_file):
        raise ConfigError(f"{folder} holds no pipeline layer files and no model states",
                          "point at a checkpoint written by this trainer")
    return torch.load(model_file, weights_only=False)["module"]
