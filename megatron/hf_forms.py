"""Which Hugging Face form a model has (Bert, MegatronBert, ModernBERT, or none), without torch: the
export (hf_convert, hf_modernbert) refuses a model without one, and the trainer and tools/ds_config.py
say so at start-up (export_note), before a run trains a model that convert_checkpoint.py to-hf would
refuse. Reads only BertConfig's fields."""
from megatron.errors import ConfigError

LAYOUTS = {  # our layernorm_layout -> HF model_type, architecture with / without the SOP head
    "post": ("bert", "BertForPreTraining", "BertForMaskedLM"),
    "pre": ("megatron-bert", "MegatronBertForPreTraining", "MegatronBertForMaskedLM"),
}
# the layer options HF Bert / MegatronBert have only in their classic form
CLASSIC_LAYER = dict(position_embedding_type="learned", local_attention_window=None, mlp_type="gelu",
                     add_bias_linear=True, normalization="LayerNorm", first_layer_attention_norm=True)
ACTIVATIONS = {"gelu": "geglu", "silu": "swiglu", "swish": "swiglu"}  # ModernBERT's hidden_activation -> our mlp_type
# what a ModernBERT is, beyond its sizes (the layer options of BertConfig: args.py's preset agrees)
SHAPE = dict(position_embedding_type="rope", layernorm_layout="pre", embedding_layernorm=True,
             first_layer_attention_norm=False, normalization="LayerNorm", type_vocab_size=0)
# the trainer's flag that gives each field of SHAPE (and mlp_type) ModernBERT's value
SHAPE_FLAGS = dict(position_embedding_type="--position-embedding-type rope", layernorm_layout="--layernorm-layout pre",
                   embedding_layernorm="--embedding-layernorm",
                   first_layer_attention_norm="--no-first-layer-attention-norm",
                   normalization="--normalization LayerNorm", type_vocab_size="--type-vocab-size 0",
                   mlp_type="--mlp-type geglu")

# the trainer's flag that gives each field of CLASSIC_LAYER (and type_vocab_size) classic BERT's value
CLASSIC_FLAGS = dict(position_embedding_type="--position-embedding-type learned", mlp_type="--mlp-type gelu",
                     add_bias_linear="--add-bias-linear", normalization="--normalization LayerNorm",
                     first_layer_attention_norm="--first-layer-attention-norm", type_vocab_size="--type-vocab-size 2")


def classic_retrain(config) -> tuple[int, str]:
    """(how many flags, 'with FLAGS' and 'without --local-attention-window') that a retrain of `config`'s
    model needs to have a Hugging Face Bert / MegatronBert form: a model is exported as the one form its
    layers have, so for a modern model that form is a retrain away (a rope model has no learned positions
    to export)."""
    flags = [CLASSIC_FLAGS[field] for field, classic in CLASSIC_LAYER.items()
             if field in CLASSIC_FLAGS and getattr(config, field) != classic]
    flags += [CLASSIC_FLAGS["type_vocab_size"]] if config.type_vocab_size == 0 else []
    if config.embedding_layernorm != (config.layernorm_layout == "post"):  # HF Bert: post with it, pre without
        flags.append("--embedding-layernorm" if config.layernorm_layout == "post" else "--no-embedding-layernorm")
    parts = [f"with {' '.join(flags)}"] if flags else []
    parts += ["without --local-attention-window"] if config.local_attention_window is not None else []
    return len(flags) + (config.local_attention_window is not None), " and ".join(parts)


def is_modern(config) -> bool:
    """The adapter for `config`'s model: ModernBERT when any layer option is not classic BERT's."""
    return (config.type_vocab_size == 0
            or any(getattr(config, field) != classic for field, classic in CLASSIC_LAYER.items()))


def check_bert_exportable(config) -> None:
    """HF has no pre-LN BERT with an embedding LayerNorm, nor a post-LN one without it, and none
    with the modern layer options (rope, local layers, gated MLPs, no biases, RMSNorm, no token types)."""
    modern = [f"{field} {getattr(config, field)}" for field, classic in CLASSIC_LAYER.items()
              if getattr(config, field) != classic]
    modern += [f"type_vocab_size {config.type_vocab_size}"] if config.type_vocab_size == 0 else []
    if modern:
        raise ConfigError(f"a model with {', '.join(modern)} has no Hugging Face Bert or MegatronBert equivalent",
                          f"retrain {classic_retrain(config)[1]} to export a classic BERT")
    if config.embedding_layernorm != (config.layernorm_layout == "post"):
        model_type = LAYOUTS[config.layernorm_layout][0]
        raise ConfigError(
            f"layernorm_layout '{config.layernorm_layout}' with embedding_layernorm {config.embedding_layernorm} "
            f"has no Hugging Face equivalent (HF {model_type} has "
            f"{'an' if config.layernorm_layout == 'post' else 'no'} embedding LayerNorm)",
            "train with --no-embedding-layernorm for the pre layout (MegatronBert) or --embedding-layernorm for "
            "post (Bert); the weights cannot gain or lose the norm without a retrain")


def check_modernbert_exportable(config) -> None:
    """ModernBERT's layer options, all of them (sizes, thetas, the window and the period are free)."""
    differ = [field for field, value in SHAPE.items() if getattr(config, field) != value]
    differ += ["mlp_type"] if config.mlp_type not in ACTIVATIONS.values() else []
    wrong = [f"{field} {getattr(config, field)}" for field in differ]
    classic_but = [field for field, value in CLASSIC_LAYER.items() if getattr(config, field) != value]
    if wrong and classic_but == ["local_attention_window"] and config.type_vocab_size:  # what made it "modern"
        raise ConfigError(f"a classic BERT with local layers (local_attention_window {config.local_attention_window}, "
                          f"global_attention_every {config.global_attention_every}) has no Hugging Face equivalent: "
                          "HF Bert has no sliding-window attention, ModernBERT has it but not these layers "
                          f"({', '.join(wrong)})", "export a model trained with every layer global (without "
                          "--local-attention-window), or train a ModernBERT-shaped one "
                          "(--model-preset modernbert-base) for local layers")
    if wrong:
        flags = [SHAPE_FLAGS[field] for field in differ]
        changes, classic = classic_retrain(config)  # named where it is the nearer way out (rope alone over BERT)
        raise ConfigError(f"a model with {', '.join(wrong)} has no Hugging Face ModernBERT (nor Bert) equivalent "
                          "(a conversion cannot change the layers a model was trained with)",
                          f"retrain with {' '.join(flags)} (--model-preset modernbert-base sets them all) to export a "
                          "ModernBERT" + (f", or {classic} to export a classic BERT" if changes <= len(flags) else ""))


def export_problem(config) -> ConfigError | None:
    """What convert_checkpoint.py to-hf would refuse this model for (None: it exports): its layers, by
    the adapter its layer options choose, or Linformer's projections, which no HF model has."""
    try:
        (check_modernbert_exportable if is_modern(config) else check_bert_exportable)(config)
    except ConfigError as error:
        return error
    if config.attention == "linformer":
        return ConfigError("linformer attention's projections have no Hugging Face counterpart",
                           "train with another attention (ring, ulysses, hybrid, dense; bigbird exports as dense)")
    return None


def export_note(config, weights_from: str | None = None) -> str | None:
    """The start-up line of a model that to-hf would refuse: learnt before training, not after it. A run
    from existing weights (`weights_from`: the folder a resume or a start from weights reads) cannot take
    the fix's flags (the weights hold the layers), so its line says where the layers come from and keeps
    the fix a retrain."""
    problem = export_problem(config)
    if problem is None:
        return None
    if weights_from:
        return (f"note: convert_checkpoint.py to-hf will refuse this model, whose layers come from {weights_from}: "
                f"{problem.problem}; {problem.fix} (a new run from scratch)")
    return (f"note: convert_checkpoint.py to-hf will refuse this model: {problem.problem}; "
            f"{problem.fix.replace('retrain with', 'train with', 1)}")
