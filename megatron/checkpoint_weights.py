"""The fp32 weights of a checkpoint of any layout (pipeline / SP degree, ZeRO stage, precision) in
BertModel names, so that an export (tools/convert_checkpoint.py), fill-mask and a run starting from
the weights (--finetune, a weights-only checkpoint) get the same weights whatever layout wrote them.
They are read from the layout-free files for a bf16 / fp16 run and at ZeRO 3, else from the plain
model's or the pipeline's layer files.
"""
import contextlib
import glob
import io
import os
import re
import warnings

import torch

from megatron.checkpoint import RUN_STATE, checkpoint_folder, latest_tag, layout_free_paths, run_state, safe_load
from megatron.checkpoint_compat import decays_norms_and_biases, model_tensors, stored_bert_config
from megatron.ds_schema import precision
from megatron.errors import ConfigError, DataError
from megatron.model.pipe import pipe_layer_to_bert
from megatron.optimizer_state import in_group_order


def bert_state_from_checkpoint(load_dir: str, tag: str | None = None) -> dict:
    """BertModel state dict from a checkpoint of any pipeline / SP degree / ZeRO stage: the fp32 master
    weights, so that an export or a --finetune gets the same weights from every layout. DeepSpeed's model
    files hold them only for an fp32 run below ZeRO 3 (a bf16 / fp16 run's hold their rounded copies,
    ZeRO 3's none): otherwise the layout-free files give them, or at ZeRO 0, which writes none, the FP16
    optimizers' state (_zero0_masters; with a pipeline, each stage's: _pipeline_zero0_masters). Checked
    against the model the checkpoint's run_state.json describes (refuse_other_shapes)."""
    tag = tag or latest_tag(load_dir)
    folder = checkpoint_folder(load_dir, tag)
    stored = run_state(load_dir, tag)["config"]
    return refuse_other_shapes(_read_state(folder, stored, load_dir, tag), stored["model"], folder)


def refuse_other_shapes(state: dict, model: dict, folder: str) -> dict:
    """`state` (the weights of checkpoint `folder`) when they are the tensors of the model its run_state.json
    describes (`model`), which every reader builds: an edited or swapped run_state.json made to-hf export a
    config.json its tensors contradict and fill_mask.py end in load_state_dict's traceback. Else one line
    naming the first tensor that differs."""
    expected = model_tensors(stored_bert_config(model))
    fix = f"restore {os.path.join(folder, RUN_STATE)}, whose config.model must describe the weights beside it"
    described = f"the model {os.path.join(folder, RUN_STATE)} describes"
    for name, tensor in expected.items():
        if name not in state:
            raise DataError(f"checkpoint {folder} lacks tensor {name}, which {described} has", fix)
        if state[name].shape != tensor.shape:
            raise DataError(f"checkpoint {folder} holds tensor {name} of shape {list(state[name].shape)}, where "
                            f"{described} has {list(tensor.shape)}", fix)
    if extra := [name for name in state if name not in expected]:
        raise DataError(f"checkpoint {folder} holds tensor {extra[0]}, which {described} does not have", fix)
    return state


def _read_state(folder: str, stored: dict, load_dir: str, tag: str) -> dict:
    """bert_state_from_checkpoint's reading, by layout."""
    masters = layout_free_paths(folder, stored)
    exact = precision(stored["ds_config"]) == "fp32" and stored["zero_stage"] < 3
    if not exact and all(map(os.path.isfile, masters)):
        return {name: entry["fp32"] for path in masters for name, entry in safe_load(path)["params"].items()}
    # pipeline: one file per layer and seq rank, identical across seq ranks: take seq rank 0
    layer_files = sorted(glob.glob(os.path.join(folder, "layer_*-model_00-model_states.pt")))
    if layer_files:
        num_layers = stored["model"]["num_layers"]
        layers = [(int(re.search(r"layer_(\d+)-", os.path.basename(path)).group(1)), safe_load(path))
                  for path in layer_files]
        if not exact:
            layers = _pipeline_zero0_masters(folder, stored, layers) or layers
        state = {pipe_layer_to_bert(layer, key, num_layers): tensor for layer, tensors in layers
                 for key, tensor in tensors.items()}
        return state if exact or not _half_precision(state) else _rounded_copies(state, folder, stored)
    if os.path.isfile(os.path.join(folder, "zero_pp_rank_0_mp_rank_00_model_states.pt")):
        # ZeRO-3 written without layout-free files: the weights exist only as partitions in the optimizer files
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        # its progress report, on the stdout fill_mask.py answers on, and its tqdm bars on stderr before a tool's line
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return get_fp32_state_dict_from_zero_checkpoint(load_dir, tag=tag)
    model_file = os.path.join(folder, "mp_rank_00_model_states.pt")
    if not os.path.isfile(model_file):
        raise ConfigError(f"{folder} holds no pipeline layer files and no model states",
                          "point at a checkpoint written by this trainer")
    states = safe_load(model_file)
    if exact:
        return states["module"]
    masters = _zero0_masters(states, decays_norms_and_biases(stored))
    return masters if masters is not None else _rounded_copies(states["module"], folder, stored)


def _zero0_masters(model_states: dict, decay_norms_and_biases: bool) -> dict | None:
    """The fp32 masters DeepSpeed's FP16 optimizers save in a plain model's file at ZeRO 0 (a bf16 /
    fp16 run without layout-free files) beside the rounded module, in the order of the optimizer's
    parameter groups (optimizer_state.in_group_order, by the checkpoint's `decay_norms_and_biases`): a list
    per parameter group (FP16_UnfusedOptimizer) or one flat tensor per group (FP16_Optimizer). None where
    the file holds none, or none that can be the module's parameters in that order (not guessed at)."""
    module, flat = model_states["module"], _fp32_flat(model_states)
    ordered = in_group_order(list(module.items()), decay_norms_and_biases)
    sizes = [tensor.numel() for _, tensor in ordered]
    if flat is None or flat.numel() != sum(sizes):  # none, or not the trainer's groups of this module
        return None
    masters = {name: piece.view_as(tensor) for (name, tensor), piece in zip(ordered, flat.split(sizes))}
    return {name: masters[name] for name in module}


def _fp32_flat(model_states: dict) -> torch.Tensor | None:
    """The fp32 masters an FP16 optimizer of ZeRO 0 saves in a model-states file, as one flat tensor in
    its parameters' order (None at ZeRO 1-2, whose optimizer files hold them)."""
    optimizer = model_states.get("optimizer") or {}
    groups = optimizer.get("fp32_groups") or [[flat] for flat in optimizer.get("fp32_groups_flat", [])]
    return torch.cat([tensor.flatten() for group in groups for tensor in group]) if groups else None


def _pipeline_zero0_masters(folder: str, stored: dict, layers: list) -> list | None:
    """`layers` ([(layer index, its file's tensors)], in order: the stages' half-precision copies) with
    the fp32 masters of a pipeline run at ZeRO 0, which writes no layout-free files: each stage's FP16
    optimizer saves them in its model-states file (mp_rank_{stage x sp}: DeepSpeed's model-parallel rank
    of the stage's seq rank 0) in its module's order, the tied word embedding (layer 0's) first on the
    first and last stage, then its layers' tensors, group after group (in_group_order: the stage module's
    names are "layer.key"). None where the counts do not match (not guessed at)."""
    pipeline, sequence = stored["pipeline_parallel_size"], stored["sequence_parallel_size"]
    decay_all = decays_norms_and_biases(stored)
    tied = [(layers[0][0], key) for key in layers[0][1]] if layers and layers[0][0] == 0 else []
    queue = [(layer, key) for layer, tensors in layers for key in tensors if (layer, key) not in tied]
    copies = {(layer, key): tensor for layer, tensors in layers for key, tensor in tensors.items()}
    masters = {}
    for stage in range(pipeline):
        path = os.path.join(folder, f"mp_rank_{stage * sequence:02d}_model_states.pt")
        flat = _fp32_flat(safe_load(path)) if os.path.isfile(path) else None
        if flat is None:
            return None
        names = list(tied) if stage in (0, pipeline - 1) else []
        while sum(copies[name].numel() for name in names) < flat.numel() and queue:
            names.append(queue.pop(0))
        if sum(copies[name].numel() for name in names) != flat.numel():
            return None
        stage_names = {f"{layer}.{key}": (layer, key) for layer, key in names}  # as the stage's module names them
        ordered = [stage_names[name] for name, _ in in_group_order(
            [(name, copies[pair]) for name, pair in stage_names.items()], decay_all)]
        for name, piece in zip(ordered, flat.split([copies[name].numel() for name in ordered])):
            masters.setdefault(name, piece.view_as(copies[name]))
    if queue:
        return None
    return [(layer, {key: masters[(layer, key)] for key in tensors}) for layer, tensors in layers]


def _half_precision(state: dict) -> bool:
    return any(tensor.dtype in (torch.float16, torch.bfloat16) for tensor in state.values())


def _rounded_copies(state: dict, folder: str, stored: dict) -> dict:
    """A half-precision run's module copies where no fp32 master is read (fp16 with a pipeline at ZeRO 0,
    a checkpoint written before the layout-free files), said in one warning."""
    kind = precision(stored["ds_config"])
    warnings.warn(f"checkpoint {folder} ({kind}, pipeline {stored['pipeline_parallel_size']}, ZeRO "
                  f"{stored['zero_stage']}) holds no fp32 master weights read here: its {kind} copies are read")
    return state
