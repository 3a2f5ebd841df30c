"""The tokenizer's identity that travels with data and checkpoints: written beside a dataset and into a
checkpoint folder, read back, and compared with a run's tokenizer (tokenizer.py builds the tokenizers).

Identity: a sha256 of the tokens in id order, and the settings of the text pipeline (normalizer,
pre-tokenizer, model: a BPE's merges, a Unigram's scores) that turns text into them. Preprocessing
writes both beside the data, a checkpoint stores them with a copy of its tokenizer file; training,
resume, fill-mask and export compare the tokens, and training and resume the data's pipeline (and a
flag's tokenizer.json the checkpoint's pipeline and special tokens) too: a shuffled vocab of the same
size, the same vocab cased where the data was lower-cased, or the same tokens with another mask token,
is refused, not trained on.
"""
import json
import warnings
from pathlib import Path

from megatron.data.tokenizer import (ADDED_TOKENS, HF_TOKENIZER, SPECIAL_NAMES, TOKENIZER_TYPES, TYPE_NAMES,
                                     BertWordPiece, HFTokenizer, build_tokenizer, case_warning, explicit_tokenizer,
                                     naming_flags, text_pipeline, wordpiece)
from megatron.errors import ConfigError, DataError
from megatron.paths import in_repository, json_text, write_json_atomic

CARRIED = "tokenizer_identity.json"  # in a checkpoint folder, beside its copy of the tokenizer file
CARRIED_FILES = {HF_TOKENIZER: "tokenizer.json", **{name: "vocab.txt" for name in TOKENIZER_TYPES}}
DATA_IDENTITY = ".vocab_identity.json"  # beside a dataset's .bin/.idx: <prefix>.vocab_identity.json


def _read_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataError(f"{path} is not valid JSON ({error.__class__.__name__}): truncated or overwritten",
                        "restore it (or remove it to skip the vocab check)") from None
    if not isinstance(record, dict) or not {"tokenizer_type", "vocab_sha256", "file"} <= set(record):
        raise DataError(f"{path} lacks tokenizer_type, vocab_sha256 or file",
                        "restore it (or remove it to skip the vocab check)")
    return record


def carry(tokenizer, folder) -> None:
    """Into a checkpoint folder being written: a copy of the tokenizer file and its identity record. The
    bytes read when the tokenizer was built: a resumed run's tokenizer is the file of the checkpoint it
    resumed from, which --keep-last may have removed since."""
    folder = Path(folder)
    (folder / CARRIED_FILES[tokenizer.type_name]).write_bytes(tokenizer.file_bytes)
    write_json_atomic(folder / CARRIED, tokenizer.record())


def carried_tokenizer(folder, stand_in=None):
    """The tokenizer a checkpoint folder carries, or None (written before checkpoints carried one). Where
    its copy of the file is gone, damaged or edited, `stand_in` (the flags' tokenizer, or None) takes its place
    if it is the tokenizer the identity record names (_standing_in)."""
    folder = Path(folder)
    if not (folder / CARRIED).is_file():
        _refuse_unrecorded_copy(folder, stand_in)
        return None
    record = _read_record(folder / CARRIED)
    name = record["tokenizer_type"]
    file = folder / CARRIED_FILES.get(name, "")
    if name not in TYPE_NAMES:
        raise DataError(f"checkpoint {folder} names tokenizer {name} in {CARRIED}, which is not a tokenizer type",
                        "restore the checkpoint folder")
    if not file.is_file():
        return _standing_in(folder, record, stand_in)
    try:
        tokenizer = _as_recorded(file, record)
    except DataError as error:  # a damaged copy: the fix is that file back, or the flags' copy of it, not a new one
        return _standing_in(folder, record, stand_in, f"its {file.name} cannot be used ({error.problem})")
    if tokenizer.identity != record["vocab_sha256"]:
        return _standing_in(folder, record, stand_in, f"its {file.name} is not the tokenizer {CARRIED} records "
                            "(edited after the save?)")
    return tokenizer


def _refuse_unrecorded_copy(folder: Path, stand_in) -> None:
    """A checkpoint folder holding its copy of the tokenizer file without the record carry() writes with it
    (lost since, in a copy of the folder): the record holds the copy's case (its type) and special tokens, so the
    copy is not used alone, and no other vocab (a tool's default) silently takes its place; the flags' tokenizer
    `stand_in` is used where its tokens are the copy's."""
    copy = next((folder / name for name in sorted(set(CARRIED_FILES.values())) if (folder / name).is_file()), None)
    if copy is None:  # saved before checkpoints carried their tokenizer
        return
    hf = copy.name == CARRIED_FILES[HF_TOKENIZER]
    problem = f"checkpoint {folder} holds {copy.name} but not {CARRIED}, the record of the tokenizer it trained with"
    flags = f"--tokenizer-file {copy}" if hf else f"--vocab-file {copy} with the --tokenizer-type it was trained with"
    fix = f"restore {CARRIED} into it, or pass {flags}"
    if stand_in is None:
        raise DataError(problem, fix)
    copied = HFTokenizer(copy) if hf else BertWordPiece(copy, lower_case=True)  # the tokens alone are compared
    if copied.identity != stand_in.identity:
        raise DataError(f"{problem}, and {stand_in.file} is another vocab (sha256 {stand_in.identity[:12]} vs "
                        f"{copied.identity[:12]})", fix)


def _as_recorded(file, record: dict):
    """The tokenizer of `file` built as a checkpoint's record says (its type, its special tokens)."""
    name = record["tokenizer_type"]
    return (HFTokenizer(file, record.get("special_tokens")) if name == HF_TOKENIZER
            else BertWordPiece(file, TOKENIZER_TYPES[name]))


def _standing_in(folder: Path, record: dict, stand_in, damage: str | None = None):
    """For a checkpoint that lacks its copy of the tokenizer file (or whose copy is `damage`d: it cannot be
    built, or is not the recorded one): the flags' tokenizer `stand_in`, built as the record says, when its
    tokens, text pipeline and special tokens are the record's (one warning line says so); otherwise an error
    whose fix names the file the record names (a vocab built anew would not fit the trained weights)."""
    name = record["tokenizer_type"]
    lacks = (f"checkpoint {folder} names tokenizer {name} in {CARRIED} but "
             f"{damage or f'lacks its {CARRIED_FILES[name]}'}")
    fix = (f"restore the checkpoint folder, or pass the tokenizer it was trained with "
           f"({naming_flags(name, record['file'])}, sha256 {record['vocab_sha256'][:12]})")
    if stand_in is None:
        raise DataError(lacks, fix)
    same_kind = CARRIED_FILES[stand_in.type_name] == CARRIED_FILES[name]  # both a vocab.txt or a tokenizer.json
    tokenizer = _as_recorded(stand_in.file, record) if same_kind else stand_in
    recorded = _recorded_pipeline(record)
    differ = _pipeline_differences(recorded, tokenizer.pipeline) if recorded is not None else []
    if tokenizer.identity != record["vocab_sha256"]:
        raise DataError(f"{lacks}, and {stand_in.file} is another vocab (sha256 {tokenizer.identity[:12]})", fix)
    if differ:
        raise DataError(f"{lacks}, and {stand_in.file} splits text into its tokens another way "
                        f"({_first_three(differ)})", fix)
    other_specials = _special_differences(record.get("special_tokens") or tokenizer.special_tokens(),
                                          stand_in.special_tokens())
    if other_specials:
        raise DataError(f"{lacks}, and {stand_in.file} names other special tokens ({', '.join(other_specials)})",
                        fix)
    warnings.warn(f"{lacks}; using {stand_in.file}, the tokenizer its record names (sha256 "
                  f"{record['vocab_sha256'][:12]}, the same text pipeline)", stacklevel=2)
    return tokenizer


def choose_tokenizer(explicit, carried, checkpoint: str, flag_type: str | None = None, same_pipeline: bool = True,
                     hf_folder: bool = False):
    """The run's tokenizer: the one the flags name, else the one `checkpoint` carries (None: neither;
    `hf_folder`: it is a Hugging Face folder, not a checkpoint). Flags naming another vocab, or a
    tokenizer that splits text another way (a tokenizer.json, or a vocab.txt of the case
    --tokenizer-type names; unless `same_pipeline` is False: the flags' type overrides an HF
    folder's), or that names other special tokens (a tokenizer_config.json beside a tokenizer.json naming
    another mask token), or only another --tokenizer-type, are refused."""
    if carried is None:
        return explicit
    if explicit is not None and explicit.identity != carried.identity:
        holder = "folder" if hf_folder else "checkpoint"
        named = f"the Hugging Face folder {checkpoint}" if hf_folder else f"checkpoint {checkpoint}"
        raise DataError(f"the vocab {explicit.file} differs from {carried.file}, the one {named} was trained with (its "
                        f"tokens or their order differ: sha256 {explicit.identity[:12]} vs {carried.identity[:12]})",
                        f"drop --vocab-file/--tokenizer-file (the {holder} carries its tokenizer) or pass the one it "
                        "was trained with")
    other_specials = _special_differences(carried.special_tokens(), explicit.special_tokens()) if explicit else []
    if other_specials:  # the same tokens, another one written where a word is masked (or padded, or the ends)
        raise DataError(f"the tokenizer {explicit.file} names other special tokens than {carried.file}, which "
                        f"{checkpoint} carries ({', '.join(other_specials)})", "drop the tokenizer flags (the "
                        f"tokenizer {checkpoint} carries is used) or pass one naming its special tokens (a "
                        "tokenizer_config.json or special_tokens_map.json beside a tokenizer.json names them)")
    if explicit is not None and (isinstance(explicit, HFTokenizer) or flag_type):  # a vocab.txt's case: the type's
        differ = _pipeline_differences(carried.pipeline, explicit.pipeline) if same_pipeline else []
        if differ:  # a BERT tokenizer.json and a vocab.txt of the same case are one pipeline: not refused
            raise DataError(f"the tokenizer {explicit.file} splits text into the tokens of {carried.file}, which "
                            f"{checkpoint} carries, another way ({_first_three(differ)})",
                            f"drop the tokenizer flags (the tokenizer {checkpoint} carries is used) or pass that one")
    elif flag_type and flag_type != carried.type_name:
        raise ConfigError(f"--tokenizer-type {flag_type} differs from {carried.type_name}, which checkpoint "
                          f"{checkpoint} was trained with", "drop --tokenizer-type (the checkpoint carries it)")
    return carried  # the same tokens; its case (WordPiece) is the checkpoint's, not --tokenizer-type's default


def checkpoint_tokenizer(args, folder, fallback_vocab=None):
    """A tool's tokenizer for checkpoint `folder`: the flags', else the one it carries, else the
    `fallback_vocab` (WordPiece), else an error asking for the flag."""
    explicit = explicit_tokenizer(args)
    carried = carried_tokenizer(folder, explicit)
    tokenizer = choose_tokenizer(explicit, carried, folder, args.tokenizer_type)
    if tokenizer is None and fallback_vocab:
        tokenizer = build_tokenizer(args.tokenizer_type, fallback_vocab)
    if tokenizer is None:
        raise ConfigError(f"checkpoint {folder} carries no tokenizer",
                          "pass the --vocab-file (or --tokenizer-file) the model was trained with")
    if carried is None and (warning := case_warning(tokenizer, args.tokenizer_type)):  # the flags' choice
        warnings.warn(warning, stacklevel=2)
    return tokenizer


def data_identity_path(prefix: str) -> Path:
    return Path(str(prefix) + DATA_IDENTITY)


def recorded_tokenizer(prefixes) -> tuple | None:
    """(tokenizer type, file) that the first of the datasets `prefixes` with a vocab record was made with, as
    the record names them (the file's path where it was preprocessed); None: no dataset has one. What a fix
    that asks for the data's tokenizer names."""
    for prefix in prefixes:
        path = data_identity_path(prefix)
        if path.is_file():
            record = _read_record(path)
            return record["tokenizer_type"], record["file"]
    return None


def unrecorded_data_warning(prefixes, tokenizer_file) -> str | None:
    """The warning for datasets without their vocab record (copied as .bin/.idx alone, or made by another
    tool): the vocab check passes them unchecked, and a tokenizer of another vocab of the same size trains on
    ids that mean other tokens without a word (ids beyond its size stop the first step). A prefix without
    data is left to the dataset's own error."""
    unrecorded = [str(prefix) for prefix in prefixes
                  if Path(f"{prefix}.idx").is_file() and not data_identity_path(prefix).is_file()]
    if not unrecorded:
        return None
    names = ", ".join(Path(prefix).name + DATA_IDENTITY for prefix in unrecorded)
    return (f"the data {', '.join(unrecorded)} {'lacks' if len(unrecorded) == 1 else 'lack'} {names}, which "
            f"{in_repository('tools/preprocess_data.py')} writes beside the .bin/.idx: the tokenizer it was "
            f"preprocessed with cannot be checked against the run's {tokenizer_file}; copy that file beside the "
            ".bin/.idx (it is part of the dataset), or preprocess again with this tokenizer")


def unchecked_added_tokens_warning(prefixes, tokenizer) -> str | None:
    """The warning for datasets whose record predates added-token records (tools/preprocess_data.py before
    they were part of the text pipeline): the run's tokenizer matches added tokens in text as one id each,
    and whether the data was split with them is unknown."""
    run = [token for path, token in tokenizer.pipeline.items()
           if path.startswith(f"{ADDED_TOKENS}.") and path.endswith(".content")]
    if not run:
        return None
    unchecked = [str(prefix) for prefix in prefixes if data_identity_path(prefix).is_file()
                 and not _records_added_tokens(_read_record(data_identity_path(prefix)))]
    if not unchecked:
        return None
    return (f"the vocab record of the data {', '.join(unchecked)} was written before records held the added "
            f"tokens: whether its text was split with the run's {json.dumps(run[:3], ensure_ascii=False)}"
            f"{' ...' if len(run) > 3 else ''} (matched as one id each) is not checked; preprocess it again "
            "with this tokenizer to have it checked")


def _records_added_tokens(record: dict) -> bool:
    pipeline = record.get("text_pipeline")
    return ADDED_TOKENS in record or not isinstance(pipeline, dict) or ADDED_TOKENS in pipeline


def write_data_identity(tokenizer, prefix: str) -> None:
    """Beside the .bin/.idx of `prefix`: which vocab made its ids (the default dataset, built before records)."""
    write_json_atomic(data_identity_path(prefix), tokenizer.record())


def data_identity(tokenizer, prefix: str) -> dict:
    """{path: text} of that record, for the builder to stage with the .bin/.idx (preprocessing: all or none
    of the three are replaced)."""
    return {data_identity_path(prefix): json_text(tokenizer.record())}


def _recorded_pipeline(record: dict) -> dict | None:
    """A record's text pipeline; in one written before records held it, a WordPiece type's own (its case
    is the type), and None (unknown) for a tokenizer.json."""
    if isinstance(record.get("text_pipeline"), dict):  # the added tokens apart, where recorded (Tokenizer.record)
        return {**record["text_pipeline"], **(record.get(ADDED_TOKENS) or {})}
    lower_case = TOKENIZER_TYPES.get(record["tokenizer_type"])
    return None if lower_case is None else text_pipeline(wordpiece({"[UNK]": 0}, lower_case))


def check_data_vocab(tokenizer, prefixes, fixed_by: str | None = None) -> None:
    """Each dataset's recorded vocab and text pipeline (data made before the record existed: size checks
    only) is the run's. `fixed_by`: the weights the run starts from or resumes ('checkpoint DIR'), which
    fix its tokenizer (choose_tokenizer refuses another), so preprocessing again is the one fix."""
    rerun = f"rerun {in_repository('tools/preprocess_data.py')} with the run's tokenizer"
    if fixed_by:
        rerun = f"{rerun} ({naming_flags(tokenizer.type_name, tokenizer.file)}, the one {fixed_by} was trained with)"
    for prefix in prefixes:
        path = data_identity_path(prefix)
        if not path.is_file():
            continue
        record = _read_record(path)
        if record["vocab_sha256"] != tokenizer.identity:
            raise DataError(f"the data {prefix} was preprocessed with the vocab {record['file']}, whose tokens "
                            f"differ from the run's {tokenizer.file} (sha256 {record['vocab_sha256'][:12]} vs "
                            f"{tokenizer.identity[:12]})", rerun if fixed_by else "pass the --vocab-file/--tokenizer-"
                            f"file the data was made with, or rerun {in_repository('tools/preprocess_data.py')} "
                            "with this one")
        recorded = _recorded_pipeline(record)
        differ = _pipeline_differences(recorded, tokenizer.pipeline) if recorded is not None else []
        if differ:
            made_with = naming_flags(record["tokenizer_type"], record["file"])
            raise DataError(f"the data {prefix} was preprocessed with the {record['tokenizer_type']} {record['file']}, "
                            f"whose text pipeline differs from the run's {tokenizer.type_name} {tokenizer.file} "
                            f"({_first_three(differ)}): the same tokens, "
                            "split from text another way", rerun if fixed_by else f"pass {made_with} (what the "
                            f"data was made with), or {rerun}")


def _first_three(differences: list) -> str:
    return ", ".join(differences[:3]) + (", ..." if len(differences) > 3 else "")


def _special_differences(recorded: dict, run: dict) -> list[str]:
    """The special tokens (kind -> token) in which two tokenizers of one vocab differ, as 'kind: run, not recorded'."""
    return [f"{kind}: {run.get(kind)!r}, not {recorded.get(kind)!r}" for kind in SPECIAL_NAMES
            if recorded.get(kind) != run.get(kind)]


def _pipeline_differences(recorded: dict, run: dict) -> list[str]:
    """The settings in which two pipelines differ, as 'path: recorded vs run' (the topmost only: a changed type
    is one difference). A field only one side has, in an object both have, is another tokenizers version's
    field, not a difference; a part only the run has was not recorded by the version that wrote the record."""
    run = {path: value for path, value in run.items() if path.partition(".")[0] in recorded}
    retyped = {path.rpartition(".")[0] for path in recorded.keys() & run.keys()
               if path.endswith(".type") and recorded[path] != run[path]}  # another kind of object: one difference
    differ = []
    for path in [*recorded, *(path for path in run if path not in recorded)]:
        parent = path.rpartition(".")[0]
        if parent in differ or path in retyped:
            differ.append(path)  # (under) a difference named once
        elif path in recorded and path in run:
            if recorded[path] != run[path]:
                differ.append(path)
        elif not (recorded.get(parent) == {} == run.get(parent)):
            differ.append(path)

    def shown(flat, path):  # an object by its type, a list by its length, the added tokens by their text
        value = flat.get(path)
        if value == {}:
            return json.dumps(flat.get(f"{path}.type", "an object"))
        if path == ADDED_TOKENS:
            return json.dumps([flat.get(f"{path}.{index}.content") for index in range(value[0])], ensure_ascii=False)
        return f"a list of {value[0]}" if isinstance(value, list) else json.dumps(value)

    def named(path):
        return f"{path} (matched in text as one id; a special one is encoded as its characters)" \
            if path == ADDED_TOKENS else path

    return [f"{named(path)}: {shown(recorded, path)} vs {shown(run, path)}" for path in differ
            if path.rpartition(".")[0] not in differ]
