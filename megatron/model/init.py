"""Layout-independent initialisation: each parameter drawn from its own generator.

A parameter's generator is keyed by (seed, its BertModel name), so the values it gets do not
depend on which other parameters this rank builds or in what order: a pipeline stage, a seq or
data rank and the single process all draw bit-identical starting weights for the same seed.
A pipeline names its parameters differently; `bert_name` maps them back (model/pipe.py's name map).

Megatron's rules: N(0, std) for every Linear and Embedding weight, std / sqrt(2 * layers) for
the two projections that write into the residual stream (attention output, MLP output), so its
variance does not grow with depth; zero Linear biases. Any other module that owns parameters
(LayerNorm, the Linformer projections) runs its own `reset_parameters` under its key; parameters
of modules without one (the LM-head bias) keep their constant construction values.
"""
import hashlib
import math
import re

import torch
from torch import nn

RESIDUAL_OUTPUT = re.compile(r"layers\.\d+\.(attention\.dense|mlp\.dense_4h_to_h)\.weight")


def generator_for(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


@torch.no_grad()
def init_bert_weights(model: nn.Module, config, seed: int, bert_name=lambda name: name) -> None:
    """Initialises `model` (a BertModel, or a pipeline stage whose names `bert_name` maps to
    BertModel names) in place. Draws in fp32 on the CPU, then copies to the parameter's device
    and dtype. Parameters already partitioned by ZeRO 3 (`ds_id`) are skipped: theirs are loaded."""
    std = config.init_method_std
    for module_name, module in model.named_modules():
        own = [(f"{module_name}.{name}".lstrip("."), p) for name, p in module.named_parameters(recurse=False)
               if not hasattr(p, "ds_id")]
        if not own:
            continue
        if isinstance(module, (nn.Linear, nn.Embedding)):
            for name, param in own:
                name = bert_name(name)
                if name.endswith(".bias"):
                    param.zero_()
                    continue
                scale = std / math.sqrt(2.0 * config.num_layers) if RESIDUAL_OUTPUT.fullmatch(name) else std
                param.copy_(torch.empty(param.shape).normal_(0.0, scale, generator=generator_for(seed, name)))
        elif hasattr(module, "reset_parameters"):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(generator_for(seed, bert_name(own[0][0])).initial_seed())
                module.reset_parameters()
