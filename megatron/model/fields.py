"""What each BertConfig / TrainConfig field is, stated once beside the field (`meta`) and asked here:
whether it shapes the weights or only trains them, whether a resume keeps it, its flag and JSON key,
the attention variant that alone reads it, its bounds. The checks that name a field (config.py,
checkpoint_compat.py, resume.py, arguments.py, tools/extend_context.py) read these facts, so a new
field is one declaration, and a test (test_config.py) makes it answer each question. No torch."""
import dataclasses
import enum
import functools
import typing
from dataclasses import dataclass


class Role(enum.Enum):
    """What a field decides about the model; a field may hold two (the local window)."""
    SIZE = "size"  # shapes a tensor, or whether one exists: the weights fix it
    MATH = "math"  # no shape, but the function the weights compute (heads, the norm's epsilon)
    WEIGHTLESS = "weightless"  # shapes no weight; a new run from the weights may change it (rope thetas, window)
    VISIBILITY = "visibility"  # which keys a query sees (BigBird's blocks, local layers)
    REGIME = "regime"  # trains the model, shapes none of it (dropout, init)
    RUN = "run"  # free per run (sequence length, parallel layout, the attention variant)


@dataclass(frozen=True)
class Field:
    roles: frozenset  # of Role
    flag: str | None = None  # the flag that takes the value ("--block-size"); None: none does
    dest: str | None = None  # its argparse destination where that is not the field's name (block_size)
    on_flag: str | None = None  # the flag that sets a bool True ("--add-bias-linear")
    off_flag: str | None = None  # the flag that sets a bool False ("--disable-bias-linear")
    json: str | None = None  # its key in the JSON's sequence_parallel section ("size", "bigbird.block_size")
    variant: str | None = None  # the attention variant that alone reads it
    resume_order: int | None = None  # a resume keeps it; check_same_model compares in this order (None: may change)
    # a run from an HF folder's weights may set it otherwise (config.adjustable_start_fields)
    adjustable_start: bool = False
    positive: bool = False  # the value must be an integer >= 1 (BertConfig.__post_init__)
    above: float | None = None  # the value must be finite and > above (config.check_model_numbers)
    at_most: float | None = None  # ... and <= at_most (config.check_model_numbers)
    said_as: str | None = None  # how a note names its setting ("global rope theta")


def meta(default=dataclasses.MISSING, *, roles, **facts) -> dataclasses.Field:
    """A dataclass field with its Field facts (`roles`: a Role or a set of them)."""
    roles = frozenset({roles} if isinstance(roles, Role) else roles)
    return dataclasses.field(default=default, metadata={"facts": Field(roles=roles, **facts)})


def _classes() -> tuple:
    """BertConfig and TrainConfig, the dataclasses whose fields carry facts."""
    from megatron.config import TrainConfig  # imported here: config.py imports this module's users
    from megatron.model.args import BertConfig

    return BertConfig, TrainConfig


@functools.cache
def _facts() -> dict:
    """Field name -> Field, BertConfig's then TrainConfig's, in declaration order."""
    return {field.name: field.metadata["facts"] for cls in _classes() for field in dataclasses.fields(cls)
            if "facts" in field.metadata}


def info(name: str) -> Field:
    """The facts of field `name`."""
    return _facts()[name]


_ANY = object()


@functools.cache
def fields_with(*, role: Role | None = None, variant=_ANY, adjustable_start: bool | None = None,
                has_json: bool | None = None) -> tuple:
    """The fields (in declaration order) that have `role`, are read by `variant` alone (None: by every
    variant), are adjustable at a start or not, have a JSON key or not; an argument left out: any."""
    return tuple(name for name, facts in _facts().items()
                 if (role is None or role in facts.roles) and (variant is _ANY or facts.variant == variant)
                 and (adjustable_start is None or facts.adjustable_start == adjustable_start)
                 and (has_json is None or (facts.json is not None) == has_json))


@functools.cache
def resume_kept() -> tuple:
    """The fields a resume keeps, in the order check_same_model compares them: the sizes first, the layout
    and norm before the biases and embedding norm they imply, so that the line names the cause."""
    kept = [(facts.resume_order, name) for name, facts in _facts().items() if facts.resume_order is not None]
    return tuple(name for _, name in sorted(kept))


@functools.cache
def weights_fixed() -> tuple:
    """The fields that shape the weights or what they compute (SIZE, MATH) for every attention variant, in
    declaration order: a run from weights takes them and may not change them."""
    return tuple(name for name, facts in _facts().items()
                 if facts.roles & {Role.SIZE, Role.MATH} and facts.variant is None)


def flag_of(name: str) -> str:
    """The flag that takes field `name`'s value; a field without one is a programming error."""
    flag = info(name).flag
    if flag is None:
        raise ValueError(f"field {name} has no valued flag")
    return flag


@functools.cache
def dest_to_field() -> dict:
    """argparse destination -> field, for the fields that a flag sets."""
    return {facts.dest or name: name for name, facts in _facts().items()
            if facts.flag or facts.on_flag or facts.off_flag}


@functools.cache
def json_options(variant: str) -> dict:
    """The keys of the JSON section's `variant` sub-section -> their fields ({"k": "linformer_k", ...})."""
    prefix = f"{variant}."
    return {facts.json[len(prefix):]: name for name, facts in _facts().items()
            if facts.json and facts.json.startswith(prefix)}


@functools.cache
def variants_with_options() -> tuple:
    """The attention variants with a sub-section of their own in the JSON section: ('linformer', 'bigbird')."""
    return tuple(dict.fromkeys(facts.json.split(".")[0] for _, facts in _facts().items()
                               if facts.json and "." in facts.json))


def _declared_type(name: str):
    """Field `name`'s annotation (`int | None`)."""
    return next(field.type for cls in _classes() for field in dataclasses.fields(cls) if field.name == name)


@functools.cache
def value_type(name: str) -> type:
    """The type of a value of field `name`, None aside (`int | None`: int)."""
    kinds = [kind for kind in typing.get_args(_declared_type(name)) if kind is not type(None)]
    return kinds[0] if kinds else _declared_type(name)


def may_be_none(name: str) -> bool:
    """Field `name` takes None (`int | None`): its default or 'not set'."""
    return type(None) in typing.get_args(_declared_type(name))
