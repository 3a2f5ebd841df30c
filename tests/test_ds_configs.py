"""Every ready config in ds_configs/ loads in DeepSpeed unchanged and resolves for its layout."""
from pathlib import Path

import pytest
from deepspeed.runtime.config import DeepSpeedConfig

from megatron.config import read_ds_config, resolve

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "ds_configs").glob("*.json"))
MODEL = dict(num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=1024, max_position_embeddings=1024,
             attention_dropout=0.0)


def test_there_is_a_config_per_variant_and_feature():
    names = {path.stem for path in CONFIGS}
    for expected in ("ring_sp2", "ulysses_sp2", "linformer_sp2", "bigbird_sp2", "zero2_ring_sp2", "zero3_ring_sp2",
                     "pipeline_zero1_ring_sp2", "bf16_ring_sp2", "fp16_ring_sp2", "checkpointing_ring_sp2"):
        assert expected in names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_loads_and_validates(path):
    ds = read_ds_config(path)
    assert DeepSpeedConfig(str(path)).train_micro_batch_size_per_gpu == ds["train_micro_batch_size_per_gpu"]
    pipeline = 2 if path.stem.startswith("pipeline") else 1
    world = 2 * ds["sequence_parallel"]["size"] * pipeline  # two data-parallel replicas
    config = resolve(MODEL, ds, world_size=world)  # the pipeline degree from the JSON's pipeline.stages
    assert config.data_parallel_size == 2 and config.pipeline_parallel_size == pipeline
    assert config.model.attention == ds["sequence_parallel"]["attention"]
    assert config.global_batch_size == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 2
    assert config.activation_checkpoint_interval == (1 if path.stem.startswith("checkpointing") else 0)
