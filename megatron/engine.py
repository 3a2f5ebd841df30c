"""DeepSpeed engine construction and one optimizer step, for both paths.

pipeline size 1: the plain BertModel through deepspeed.initialize with megatron.parallel.state
as mpu, so ZeRO 1/2/3 shard over data x seq and DeepSpeed reduces gradients over data x seq,
dividing by the data degree only: SUM over seq, MEAN over data, as our loss shares need.
pipeline size > 1: SeqParallelPipe (parallel/pipeline.py: BertModelPipe with the seq-group sums) under
DeepSpeed's pipeline engine.
"""
import functools
from dataclasses import dataclass

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from megatron.config import TrainConfig
from megatron.ds_schema import precision
from megatron.errors import ConfigError
from megatron.flops import real_training_flops
from megatron.data.batch import BertBatch
from megatron.model.bert import BertModel, TransformerLayer
from megatron.model.loss import bert_batch_loss
from megatron.optimizer_state import exempt_from_decay
from megatron.parallel import state
from megatron.parallel.device import to_device
from megatron.parallel.grads import sum_sequence_grads_in_zero3_reduce_scatter
from megatron.parallel.reduce import sum_over_sequence


def initialize_parallel(config: TrainConfig) -> None:
    """The process groups of the run's layout. Hybrid attention's Ulysses degree (its ulysses_size) at SP 1 is 1:
    one rank per sequence runs plain attention whatever the JSON's ulysses_size says (hybrid.py, rules.py); the
    groups refused the JSON's 2 there, after the data's index maps were built."""
    if not state.is_initialized():
        ulysses = (config.model.ulysses_size or 1) if config.sequence_parallel_size > 1 else 1  # hybrid's only
        state.initialize(pipeline=config.pipeline_parallel_size, sequence=config.sequence_parallel_size,
                         ulysses=ulysses)


def build_engine(config: TrainConfig, bert_state: dict | None = None, lr_scheduler=None):
    """-> DeepSpeed engine. `bert_state`: a BertModel state dict to start from (else fresh init);
    `lr_scheduler`: a callable optimizer -> scheduler, stepped by DeepSpeed at every optimizer step."""
    check_precision_supported(config.ds_config)
    initialize_parallel(config)
    if config.activation_checkpoint_interval:
        # the JSON's "activation_checkpointing" settings (cpu_checkpointing, profile, ...), read by DeepSpeed's
        # own config: deepspeed.initialize does not apply them, and without this call they were dropped
        deepspeed.checkpointing.configure(state, deepspeed_config=config.ds_config)
    if config.pipeline_parallel_size > 1:
        from megatron.model.pipe import load_bert_state
        from megatron.parallel.pipeline import SeqParallelPipe

        model = SeqParallelPipe(config.model, activation_checkpoint_interval=config.activation_checkpoint_interval,
                                activation_checkpoint_func=checkpoint_in_autocast)
        if bert_state is not None:
            load_bert_state(model, bert_state)
        if config.compile_mlp:
            compile_mlp_sublayers(model)
        engine, *_ = deepspeed.initialize(model=model, config=config.ds_config, lr_scheduler=lr_scheduler,
                                          model_parameters=optimizer_groups(model, config.decay_norms_and_biases))
        return engine
    model = BertModel(config.model)
    if bert_state is not None:
        model.load_state_dict(bert_state)
    if config.zero_stage == 3:
        model = _zero3_model(config, model.state_dict())
    if config.compile_mlp:
        compile_mlp_sublayers(model)
    if config.activation_checkpoint_interval:
        checkpoint_layers(model, config.activation_checkpoint_interval)
    engine, *_ = deepspeed.initialize(model=model, config=config.ds_config, mpu=state, lr_scheduler=lr_scheduler,
                                      model_parameters=optimizer_groups(model, config.decay_norms_and_biases))
    keep_clipped_grad_norm(engine)
    unscale_autocast_grad_norm(engine)
    if config.zero_stage == 3:
        sum_sequence_grads_in_zero3_reduce_scatter(engine.optimizer)
    return engine


def optimizer_groups(model: torch.nn.Module, decay_norms_and_biases: bool = False) -> list[dict]:
    """The optimizer's parameter groups, each parameter once: [weights at the optimizer's weight_decay, biases and
    norm weights at 0.0] (optimizer_state.exempt_from_decay; under ZeRO 3 a parameter's own tensor is an empty
    stand-in, its shape is ds_shape). The tied word embedding (the LM head's decoder) is one 2-D parameter
    (a pipeline's first and last stages each hold a copy, updated alike): decayed, once, as the embedding it is.
    `decay_norms_and_biases`: the one group of every parameter at the optimizer's weight_decay, how runs trained
    before the exemption (TrainConfig.decay_norms_and_biases): their checkpoints resume with the optimizer they
    saved, group for group (DeepSpeed's files and the layout-free ones keep one group's settings)."""
    named = list(model.named_parameters())
    if decay_norms_and_biases:
        return [{"params": [param for _, param in named]}]
    spared = [exempt_from_decay(name, getattr(param, "ds_shape", param.shape)) for name, param in named]
    groups = [{"params": [param for (_, param), exempt in zip(named, spared) if not exempt]},
              {"params": [param for (_, param), exempt in zip(named, spared) if exempt], "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]  # a stage may hold no 1-D parameter: no empty group


def keep_clipped_grad_norm(engine) -> None:
    """The gradient norm of an fp32 run without ZeRO, for the log: DeepSpeed's engine clips its gradients
    itself (clip_fp32_gradients, at gradient_clipping > 0) but drops the norm that clipping computed, so
    get_global_grad_norm() stayed None there while its ZeRO, bf16 and fp16 optimizers report it. Without
    clipping (--clip-grad 0) nothing computes the norm, and the log leaves it out rather than pay for it; nor
    with a pipeline, whose fp32 clipping sees one stage's gradients (not the model's norm)."""
    def clip_and_keep_norm():
        engine._global_grad_norm = clip_grads(engine.module.parameters(), engine.gradient_clipping())
    engine.clip_fp32_gradients = clip_and_keep_norm


def unscale_autocast_grad_norm(engine) -> None:
    """The gradient norm of fp16 torch_autocast under ZeRO 1-3, for the log: DeepSpeed's ZeRO optimizers report the
    norm of the loss-scaled gradients there (their own loss scale is 1; the GradScaler that scaled the loss unscales
    the gradients inside its step), some 65536 times the gradients' own. Divided here by the scale the gradients
    carried, read before the step (whose GradScaler update may change it) without a host sync. (ZeRO 0's GradScaler
    unscales before the norm; with clipping, ZeRO 1-3 are refused: ds_schema.check_fp16_autocast.)"""
    optimizer = engine.optimizer
    scaler = getattr(optimizer, "torch_autocast_gradscaler", None)
    if scaler is None:
        return
    step = optimizer.step

    @functools.wraps(step)  # keeps the LR scheduler's mark on the step (skip_nonfinite_updates)
    def step_then_unscale_norm(*args, **kwargs):
        scale = scaler._get_scale_async().clone()  # a tensor, updated in place by the step
        result = step(*args, **kwargs)
        if optimizer._global_grad_norm is not None:
            optimizer._global_grad_norm = optimizer._global_grad_norm / scale
        return result

    optimizer.step = step_then_unscale_norm


def clip_grads(parameters, max_norm: float) -> torch.Tensor:
    """Scales the gradients to a norm of at most `max_norm` (the factor DeepSpeed's and torch's clipping
    use) and returns their norm before, from sums of squares: torch's CPU norm kernels (norm, vector_norm,
    _foreach_norm, which DeepSpeed's clip_grad_norm_ calls per tensor) lose about 1e-3 of the norm of an
    fp32 tensor of BERT-base's embedding size (torch 2.13), so the norm and the clip factor at ZeRO 0
    differed from ZeRO 1-3's. At ZeRO 0 every rank holds the same reduced gradients: the local norm is the
    model's, with no communication."""
    parameters = [p for p in parameters if p.grad is not None]
    norm = torch.stack([p.grad.detach().float().square().sum() for p in parameters]).sum().sqrt()
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return norm


def check_precision_supported(ds_config: dict) -> None:
    """fp16 on a CPU whose oneDNN has no fp16 kernels: DeepSpeed refuses it deep inside
    deepspeed.initialize with a traceback; say so in one line before any rank starts work."""
    accelerator = get_accelerator()
    if precision(ds_config) == "fp16" and not accelerator.is_fp16_supported():
        raise ConfigError(f"fp16.enabled is true but DeepSpeed does not support fp16 on this "
                          f"{accelerator.device_name()} "
                          "device (no fp16 kernels)", 'use "bf16": {"enabled": true} or fp32, or run on a GPU')


def skip_nonfinite_updates(engine) -> None:
    """Gives a plain torch optimizer (fp32 at ZeRO 0) DeepSpeed's overflow rule: a step whose
    gradients hold NaN/inf changes no parameter and counts as skipped, without an LR-scheduler
    step (DeepSpeed reads `optimizer.overflow` after the step). DeepSpeed's fp16, bf16 and ZeRO
    optimizers already carry that flag and skip such steps themselves. The guard wraps the step as
    the LR scheduler left it (functools.wraps keeps the scheduler's mark on it, without which torch
    warns on every run that the step was overridden after the scheduler was built)."""
    optimizer = engine.optimizer
    if hasattr(optimizer, "overflow"):
        return
    step = optimizer.step

    @functools.wraps(step)
    def step_if_finite(*args, **kwargs):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        finite = torch.stack([torch.isfinite(grad).all() for grad in grads]).all().float().reshape(1)
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)  # pipeline stages hold different parameters
        optimizer.overflow = not finite.item()
        return None if optimizer.overflow else step(*args, **kwargs)

    optimizer.overflow = False
    optimizer.step = step_if_finite


def checkpoint_layers(model: BertModel, interval: int = 1) -> None:
    """Recomputes the transformer layers in backward, `interval` consecutive layers per chunk
    (DeepSpeed's activation checkpointing).

    Applied from outside: the first layer of each chunk runs the whole chunk under
    checkpoint_in_autocast (DeepSpeed's checkpoint, recomputed under the forward's autocast), which
    keeps only the chunk's input; the chunk's other layers then pass their input through. The ring's
    and Ulysses' communication is replayed in the recompute, in the same order on every seq rank. (A
    pipeline checkpoints its chunks through PipelineModule's activation_checkpoint_interval instead.)
    """
    forwards = [type(layer).forward.__get__(layer) for layer in model.layers]

    def run_chunk(start, x, segment_ids, position_ids):
        for forward in forwards[start:start + interval]:
            x = forward(x, segment_ids, position_ids)
        return x

    for index, layer in enumerate(model.layers):
        if index % interval == 0:
            layer.forward = functools.partial(checkpoint_in_autocast, functools.partial(run_chunk, index))
        else:
            layer.forward = _computed_in_its_chunk


def _computed_in_its_chunk(x, segment_ids, position_ids):
    return x


def checkpoint_in_autocast(function, *inputs):
    """deepspeed.checkpointing.checkpoint whose recompute runs under the autocast state of the forward.
    DeepSpeed 0.19.8 recomputes under the backward's state, no autocast: a bf16-autocast forward was
    recomputed in fp32 (fp32 GEMMs, fp32 attention kernels), slower and not the activations the
    forward used (torch.utils.checkpoint restores it; DeepSpeed's does not)."""
    device_type = next((x.device.type for x in inputs if torch.is_tensor(x)), "cpu")
    enabled, dtype = torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    cache = torch.is_autocast_cache_enabled()

    def under_forwards_autocast(*args):
        with torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache):
            return function(*args)
    return deepspeed.checkpointing.checkpoint(under_forwards_autocast, *inputs)


def compile_mlp_sublayers(model: torch.nn.Module) -> None:
    """torch.compile of every transformer layer's MLP sublayer (LayerNorm, GEMM, bias-GELU, GEMM,
    bias-dropout-add): inductor fuses the elementwise passes between the GEMMs. The attention
    sublayer stays eager: its cores communicate inside autograd Functions."""
    for layer in model.modules():
        if isinstance(layer, TransformerLayer):
            layer.mlp_sublayer = torch.compile(layer.mlp_sublayer)


def _zero3_model(config: TrainConfig, full_state: dict) -> BertModel:
    """The model with its parameters partitioned over data x seq, holding `full_state`.

    DeepSpeed converts a plain module's parameters with mpu.get_data_parallel_group() only
    (runtime/zero/parameter_offload.py, _convert_to_zero_parameters), which would leave the
    seq ranks out of the partition and of the gradient reduction; building the module under
    zero.Init with the data x seq group gets it right.
    """
    with deepspeed.zero.Init(data_parallel_group=state.get_sequence_data_parallel_group(),
                             config_dict_or_path=config.ds_config, mpu=state):
        model = BertModel(config.model)
    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
        if dist.get_rank() == 0:
            model.load_state_dict(full_state)
    # the LM head reads the word embedding outside the module that owns it
    deepspeed.zero.register_external_parameter(model.lm_head, model.embeddings.word_embeddings.weight)
    return model


def _pipeline_item(chunk: BertBatch) -> tuple:
    cls_mask = chunk.cls_mask
    inputs = (chunk.tokens, chunk.token_types, chunk.position_ids, chunk.segment_ids, chunk.loss_mask, cls_mask)
    labels = (chunk.labels, chunk.loss_mask, chunk.sop_labels, cls_mask)
    return inputs, labels


@dataclass
class StepResult:
    loss: float  # the whole-sequence loss, averaged over micro-batches and data-parallel ranks
    mlm: float  # its MLM and SOP parts
    sop: float | None  # None without the sentence-order head
    grad_norm: float | None
    mlm_accuracy: float  # masked tokens predicted right
    real_token_share: float = 1.0  # non-padding tokens / tokens of the global batch
    segments_per_sample: float = 1.0  # packed samples hold several
    real_flops_per_sample: float = 0.0  # flops.real_training_flops of the global batch, per sample


def _chunks(micro_batches: list, device) -> list:
    """This seq rank's slices of the (host) micro-batches, on `device` (pinned, non-blocking copies)."""
    seq_rank, seq_size = state.get_sequence_parallel_rank(), state.get_sequence_parallel_world_size()
    return [to_device(batch.sequence_chunk(seq_rank, seq_size), device) for batch in micro_batches]


def _whole(values: torch.Tensor, average_data: bool) -> torch.Tensor:
    """Per-rank loss shares -> whole-sequence values (sum over seq), averaged over data ranks."""
    sum_over_sequence(values)
    if average_data and state.get_data_parallel_world_size() > 1:
        dist.all_reduce(values, group=state.get_data_parallel_group())
        values /= state.get_data_parallel_world_size()
    return values


def _last_stage_parts(engine) -> torch.Tensor:
    """The step's mean (mlm, sop, mlm accuracy) shares, which only the last pipeline stage computes,
    on every stage of this rank's pipeline."""
    parts = engine.module.loss_fn.parts
    mean = torch.stack(parts).mean(0) if parts else torch.zeros(3, device=engine.device)
    dist.broadcast(mean, src=engine.grid.stage_to_global(engine.num_stages - 1),
                   group=state.get_pipe_parallel_group())
    return mean


def train_step(engine, micro_batches: list) -> StepResult:
    """One optimizer step over this data-parallel rank's micro-batches (full-length BertBatch)."""
    chunks = _chunks(micro_batches, engine.device)
    statistics = _batch_statistics(engine, micro_batches)
    if state.get_pipe_parallel_world_size() > 1:
        engine.module.loss_fn.parts.clear()
        share = engine.train_batch(data_iter=iter([_pipeline_item(chunk) for chunk in chunks])).detach().clone()
        loss = _whole(share.reshape(1), average_data=False).item()
        mlm, sop, accuracy, *statistics = _whole(torch.cat([_last_stage_parts(engine).float(), statistics]),
                                                 average_data=True).tolist()
    else:
        parts = torch.zeros(4, device=engine.device)  # on the device: NCCL reduces it, no sync per micro-batch
        for chunk in chunks:
            loss = bert_batch_loss(*engine(*chunk.model_inputs()), chunk, sum_over_sequence)
            engine.backward(loss.total)
            engine.step()
            parts += torch.stack([loss.total.detach(), loss.mlm, loss.sop, loss.mlm_accuracy]).float()
        # the step's logged-loss sync
        loss, mlm, sop, accuracy, *statistics = _whole(torch.cat([parts / len(chunks), statistics]),
                                                       average_data=True).tolist()
    if not engine.module.config.add_binary_head:  # no sentence-order head: no "sop 0.0000" in the log
        sop = None
    norm = engine.get_global_grad_norm()
    real_token_share, segments_per_sample, flops_per_sample = statistics
    return StepResult(loss=loss, mlm=mlm, sop=sop, grad_norm=None if norm is None else float(norm),
                      mlm_accuracy=accuracy, real_token_share=real_token_share, segments_per_sample=segments_per_sample,
                      real_flops_per_sample=flops_per_sample)


def _batch_statistics(engine, micro_batches: list) -> torch.Tensor:
    """[real-token share, segments per sample, real flops per sample] of this data rank's (host) micro-batches, on
    the device, for the reduction of the step's losses to carry (_whole: a sum over the seq group, a mean over the
    data ranks, whose micro-batches are as many and as long): the global batch's, where the log had rank 0's data
    rank's alone, with no collective of its own. Seq rank 0 holds them, the others zeros: every seq rank reads the
    same samples."""
    if state.get_sequence_parallel_rank():
        return torch.zeros(3, device=engine.device)
    values = (sum(b.real_token_share() for b in micro_batches) / len(micro_batches),
              sum(b.segments_per_sample() for b in micro_batches) / len(micro_batches),
              real_flops_per_sample(engine.module.config, micro_batches))
    return to_device(torch.tensor(values, dtype=torch.float32), engine.device)


def real_flops_per_sample(config, micro_batches: list) -> float:
    """flops.real_training_flops of the (host) micro-batches, per sample: the run log's real TFLOP/s."""
    flops = sum(real_training_flops(config, batch.segment_lengths(), int(batch.loss_mask.sum()), batch.tokens.numel())
                for batch in micro_batches)
    return flops / sum(batch.tokens.shape[0] for batch in micro_batches)


@torch.no_grad()
def eval_step(engine, micro_batches: list) -> float:
    """Whole-sequence loss on these micro-batches, averaged over them and the data ranks."""
    chunks = _chunks(micro_batches, engine.device)
    if state.get_pipe_parallel_world_size() > 1:
        share = engine.eval_batch(data_iter=iter([_pipeline_item(chunk) for chunk in chunks])).detach().clone()
        return _whole(share.reshape(1).float(), average_data=False).item()
    engine.module.eval()
    total = torch.zeros(1, device=engine.device)
    for chunk in chunks:
        total += bert_batch_loss(*engine(*chunk.model_inputs()), chunk, sum_over_sequence).total.float()
    engine.module.train()
    return _whole(total / len(chunks), average_data=True).item()
