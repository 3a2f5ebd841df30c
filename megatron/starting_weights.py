"""What the weights a run starts from or resumes give it: the model fields the flags leave out or
may not change (model_flags), and the state the model starts with (initial_weights). Read alike by
the run and by tools/extend_context.py."""
import os
import warnings

from megatron import checkpoint, checkpoint_compat, checkpoint_weights, hf_convert, hf_io, hf_modernbert, paths
from megatron.arguments import config_flags
from megatron.config import adjustable_start_fields, check_model_numbers, refuse_contradictions, section_values
from megatron.errors import ConfigError
from megatron.model.args import BertConfig
from megatron.model.attention.rules import refuse_local_layers
from megatron.model.bert import BertModel
from megatron.model.fields import weights_fixed
from megatron.parallel.launch_env import launcher_rank, print_warnings
from megatron.resume import given_attention, note_replaced_settings, note_taken_regime, take_regime
from megatron.start_plan import StartPlan


def model_flags(args, ds: dict, plan: StartPlan) -> dict:
    """BertConfig / TrainConfig field values from the flags, with the sizes of the weights the run
    starts from (--init-from-hf, weights-only --load) or resumes (--load: its whole model and
    --seq-length; and its optimizer's groups, decay_norms_and_biases) where the flags (a preset) leave them out;
    vocab_size None where neither gives it (the vocab file's, once it is read: a preset never sets it). Flags that
    contradict those weights are refused, as is linformer or bigbird over their local layers."""
    flags = config_flags(args)
    weights = starting_weights_fields(plan)
    resume = plan.resume
    start = initial_model_fields(weights, resume)
    if start and not (resume or plan.init_from_hf):  # a checkpoint's weights: the longest length they trained at
        start["max_position_embeddings"] = checkpoint.declared_positions(plan.load, checkpoint.latest_tag(plan.load))
    source = (f"the --init-from-hf folder {plan.init_from_hf}" if plan.init_from_hf
              else f"the checkpoint {plan.load}" if plan.finetune or resume
              else f"the weights-only checkpoint {plan.load}")
    adjustable = adjustable_start_fields(start, bool(plan.init_from_hf), resume)
    refuse_length_beyond_table(plan, flags, ds, start, source, adjustable)
    refuse_contradictions(start, source, flags, ds, adjustable)
    if args.no_position_extension and start.get("position_embedding_type") == "rope":
        raise ConfigError(f"--no-position-extension has no effect on {source}: its positions are rotary, with no "
                          "table to extend", "drop --no-position-extension")
    if "local_attention_window" in start:  # the weights have local layers (carried_fields), which no flag drops
        refuse_local_layers(given_attention(flags, ds), source)
    if not resume:  # a resume refuses them (refuse_contradictions)
        # a value refused after its note would leave a note on a run that never starts
        check_model_numbers({field: value for field, value in flags.items() if value is not None})
        note_replaced_settings(flags, start, source)
    for field, value in start.items():
        flags[field] = value if flags.get(field) is None else flags[field]
    if resume:  # its warning comes with the resume's others once the checkpoint has loaded (training.resume_or_start):
        take_regime(weights, flags, ds)  # a check that refuses the run after it would leave a line for nothing
        # the optimizer's groups as the checkpoint's run had them (a new run from weights: this trainer's)
        flags["decay_norms_and_biases"] = checkpoint_compat.decays_norms_and_biases(
            checkpoint.stored_config(plan.load, checkpoint.latest_tag(plan.load)))
    elif start:  # a new run from weights: their regime, not BertConfig's defaults, where no flag sets it
        note_taken_regime(take_regime(weights, flags, ds, "local_attention_window" in start)[0], source)
    if flags.get("seq_length") is None and start:
        flags["seq_length"] = start_length(plan, weights, flags)
    if start and not resume:
        trained = weights["max_position_embeddings" if plan.init_from_hf else "seq_length"]
        note_longer_than_trained(flags, start, trained, source)
    flags["bigbird_seed"] = args.seed  # BigBird's random blocks follow the run's seed
    return flags


def refuse_length_beyond_table(plan: StartPlan, flags: dict, ds: dict, start: dict, source: str,
                               adjustable: tuple) -> None:
    """A --seq-length beyond the learned position table of a checkpoint a run resumes or starts from, unpacked:
    BertConfig's line would advise a larger --max-position-embeddings, which those weights fix (refuse_contradictions
    then refuses it). Names what works from them: their length, shorter samples packed into the sequence, or a new run
    from their Hugging Face export, whose table --init-from-hf repeats to the new length."""
    positions, length = start.get("max_position_embeddings"), flags.get("seq_length")
    packed = flags.get("pack_samples")
    packed = section_values(ds).get("pack_samples") if packed is None else packed
    if (start.get("position_embedding_type", BertConfig.position_embedding_type) != "learned" or not positions
            or "max_position_embeddings" in adjustable or not length or length <= positions or packed):
        return
    raise ConfigError(f"--seq-length {length} exceeds the {positions} learned positions of {source}",
                      f"keep --seq-length {positions} or less, pack samples of up to {positions} tokens into "
                      f"{length} with --pack-samples, or start a new run with a longer table: "
                      f"{table_extension_route(plan.load, 'checkpoint', length)} --seq-length {length} and another "
                      "--save")


def table_extension_route(source: str, kind: str, positions) -> str:
    """The commands that take weights with a learned position table to `positions` rows: an HF folder through
    --init-from-hf (it repeats the table), a checkpoint of this trainer exported to one first (to-hf): a
    --load, --finetune included, keeps the table's size."""
    trainer = f"{paths.python_command()} {paths.in_repository('pretrain_bert.py')}"
    if kind == "hf":
        return f"{trainer} --init-from-hf {source} --max-position-embeddings {positions}"
    return (f"{paths.python_command()} {paths.in_repository('tools/convert_checkpoint.py')} to-hf --load {source} "
            f"--output HF, then {trainer} --init-from-hf HF --max-position-embeddings {positions}")


def note_longer_than_trained(flags: dict, start: dict, trained: int, source: str) -> None:
    """The line of a new run from rotary weights at a longer --seq-length than they trained at and at
    their own global theta: the model extrapolates (a choice, so not refused), where the recipe for a
    longer context also scales the theta (tools/extend_context.py). From the first rank."""
    if (start.get("position_embedding_type") != "rope" or not flags.get("seq_length") or not trained
            or flags["seq_length"] <= trained or flags.get("rotary_base") != start.get("rotary_base")):
        return
    if launcher_rank() == 0:
        print(f"note: --seq-length {flags['seq_length']} is {flags['seq_length'] / trained:g}x the {trained} tokens "
              f"{source} was trained at, with its global rope theta {start.get('rotary_base'):g}: the model "
              f"extrapolates; {paths.in_repository('tools/extend_context.py')} continues at a longer length with a "
              f"scaled theta ({paths.in_repository('docs/hugging-face.md')}), or pass --rotary-base", flush=True)


def start_length(plan: StartPlan, weights: dict, flags: dict) -> int:
    """The --seq-length a run from weights takes when the flag is left out: the default 512, or less
    where the weights reach less: a weights-only checkpoint's stored length (a from-hf one stores its
    folder's positions), an HF folder's positions as this run sets them (--max-position-embeddings).
    A resume goes on at the checkpoint's length (another one, given, is a warning: describe_sample_change)."""
    if plan.resume:
        return weights["seq_length"]
    if plan.init_from_hf:
        reach = flags.get("max_position_embeddings") or BertConfig.seq_length
    else:
        reach = weights["seq_length"]
    return min(BertConfig.seq_length, reach)


def starting_weights_fields(plan: StartPlan) -> dict:
    """The BertConfig fields of the weights a run starts from (--init-from-hf, a weights-only --load)
    or resumes (--load), read once."""
    if plan.init_from_hf:
        return hf_convert.bert_fields_from_hf(hf_io.read_hf_config(plan.init_from_hf))
    if plan.load:
        return checkpoint.stored_config(plan.load, checkpoint.latest_tag(plan.load))["model"]
    return {}


def initial_model_fields(fields: dict, resume: bool = False) -> dict:
    """Of the starting weights' fields (starting_weights_fields): the sizes and layout, which the flags
    may restate but not change; for a modern model (a ModernBERT folder) also its layer rule (rope
    thetas, window, global period), head and vocab padding, which the flags may change, the global
    period aside (config.refuse_contradictions). A resume takes the layer rule of any model: it keeps
    the whole model (checkpoint_compat.check_same_model), which the user then need not restate."""
    if not fields:
        return {}
    # the vocab padding and the sentence-order head: the layer rule's (hf_modernbert.layer_rule_fields)
    shaping = tuple(name for name in weights_fixed() if name not in ("make_vocab_size_divisible_by", "add_binary_head"))
    rule = hf_modernbert.layer_rule_fields(fields) if resume else hf_modernbert.carried_fields(fields)
    return {**{field: fields[field] for field in shaping if field in fields}, **rule}


def initial_weights(args, plan: StartPlan, config) -> dict | None:
    """BertModel state to start from (None: fresh init, or a full checkpoint that --load restores,
    whose model is checked here, before the data's index maps are built).
    Weights of another attention variant (a weights-only --load, --finetune) start the run as
    --init-from-hf does: Linformer's projections they lack initialised, those this run lacks dropped
    (check_model_shapes); a line names what is initialised, and one says when the weights were trained
    here with attention of other math, other BigBird blocks or other local layers (attention_change),
    or elsewhere (an HF folder, a from-hf checkpoint) with every layer global (local_layers_added)."""
    if plan.init_from_hf:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state = hf_convert.load_hf_as_bert_state(plan.init_from_hf, config.model,
                                                     extend_positions=not args.no_position_extension)
        notes = [str(warning.message) for warning in caught] + [checkpoint_compat.local_layers_added(
            f"the Hugging Face folder {plan.init_from_hf}", starting_weights_fields(plan), config.model)]
        print_warnings(notes)
        return state
    if not plan.load:
        return None
    load = plan.load
    tag = checkpoint.latest_tag(load)
    run_state = checkpoint.run_state(load, tag)
    stored = run_state["config"]["model"]
    if plan.resume:
        checkpoint_compat.check_same_model(stored, config.model, checkpoint.checkpoint_folder(load, tag))
        return None
    padding = {"make_vocab_size_divisible_by": config.model.make_vocab_size_divisible_by}  # the run's: padded again
    fresh, dropped = checkpoint_compat.check_model_shapes({**stored, **padding}, config.model,
                                                          os.path.join(load, tag), start=True)
    state = hf_convert.repadded_vocab(checkpoint_weights.bert_state_from_checkpoint(load, tag), config.model)
    checkpoint.refuse_non_finite(state, f"checkpoint {os.path.join(load, tag)}",
                                 "start from another checkpoint (an earlier one of the run that wrote it)")
    for name in dropped:
        del state[name]
    notes = [checkpoint_compat.local_layers_added(f"checkpoint {load}", stored, config.model)
             if run_state.get("weights_only")  # from-hf: as --init-from-hf; else trained here
             else checkpoint_compat.attention_change(f"checkpoint {load}", stored, vars(config.model))]
    if fresh:  # as --init-from-hf initialises them (hf_convert.completed)
        state.update({name: tensor for name, tensor in BertModel(config.model).state_dict().items()
                      if name in fresh})
        notes.append(f"not in checkpoint {load}, initialised: {', '.join(fresh)}")
    print_warnings(notes)
    return state
