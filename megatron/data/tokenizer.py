"""Tokenizers: BERT WordPiece over a standard `vocab.txt` and any Hugging Face `tokenizer.json`,
both backed by HF `tokenizers` (Rust).

Megatron's names are kept (`BertWordPieceLowerCase`, `BertWordPieceCase`) so existing launch
scripts work; `HFTokenizer` reads a `tokenizer.json` (or the folder holding one). Special ids
come from the vocab file or tokenizer itself, never from constants. Each tokenizer computes its
own identity (`identity`, `pipeline`, `record()`); tokenizer_identity.py carries it with data and
checkpoints and compares it.
"""
import functools
import hashlib
import itertools
import json
import os
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tokenizers.models import WordPiece
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer, ByteLevel

from megatron.errors import ConfigError, DataError, refuse_lfs_pointer
from megatron.paths import in_repository

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TOKENIZER_TYPES = {"BertWordPieceLowerCase": True, "BertWordPieceCase": False}  # name -> lower_case
HF_TOKENIZER = "HFTokenizer"
TYPE_NAMES = (*TOKENIZER_TYPES, HF_TOKENIZER)  # every --tokenizer-type
# the names each special token the samples need goes by (BERT / ModernBERT, RoBERTa, XLNet / ALBERT)
SPECIAL_NAMES = {"cls": ("[CLS]", "<s>", "<cls>"), "sep": ("[SEP]", "</s>", "<sep>"), "mask": ("[MASK]", "<mask>"),
                 "pad": ("[PAD]", "<pad>")}
BYTE_LEVEL_BYTES = {chr(byte): byte for byte in [*range(33, 127), *range(161, 173), *range(174, 256)]}
BYTE_LEVEL_BYTES |= {chr(256 + n): byte
                     for n, byte in enumerate(sorted(set(range(256)) - {*BYTE_LEVEL_BYTES.values()}))}
# a byte-level BPE's character for each byte (GPT-2's: printable Latin-1 as itself, the rest from U+0100 on)
ADDED_TOKENS = "added_tokens"
PIPELINE_PARTS = ("normalizer", "pre_tokenizer", "model", ADDED_TOKENS)  # what turns text into tokens


class _Tokenizer:
    """What both tokenizers share: text -> ids without special tokens ([CLS]/[SEP] are added by the
    sample builder), the special ids, the vocab's identity and the record that carries it."""

    type_name: str
    file: str  # the vocab.txt or tokenizer.json a checkpoint carries
    tokens: list  # token of each id
    ids: dict  # kind (cls, sep, mask, pad) -> id
    _rust: Tokenizer

    def tokenize(self, text: str) -> list[int]:
        return self._rust.encode(text, add_special_tokens=False).ids

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        # the _fast variant skips character offsets, which nothing here needs (~25% faster)
        return [encoding.ids for encoding in self._rust.encode_batch_fast(texts, add_special_tokens=False)]

    def tokenize_flat(self, texts: list[str], dtype) -> tuple[np.ndarray, np.ndarray]:
        """(all ids of `texts` in one array of `dtype`, int32 count of each text's ids): 2-4 bytes a token
        instead of a Python int list's ~36 (preprocessing holds a whole document's)."""
        ids = self.tokenize_batch(texts)
        sizes = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
        return np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=int(sizes.sum())), sizes

    def read_specials_as_text(self) -> None:
        """From now on a special token spelled out in the text (`<mask>`, `</s>`, `[SEP]` of a tokenizer.json) is
        encoded as the characters it is, not as the special id: corpora hold such strings (HTML, code, papers on
        tokenizers), and the samples place the special ids themselves. Added tokens that are not special stay
        words of their own."""
        self._rust.encode_special_tokens = True

    @functools.cached_property
    def unknown_id(self) -> int | None:
        """The id of the token the model writes for text it has no token for ([UNK], <unk>), None where it has none."""
        token = _unknown_token(self.settings(), self._rust.get_vocab(with_added_tokens=True)).get("unk")
        return None if token is None else self._rust.token_to_id(token)

    def decode_one(self, token_id: int) -> str:
        """One id as the text it stands for (byte-level 'Ġhave' -> ' have'; WordPiece: the token); a byte-level
        piece of a character (a byte of 'é') as its bytes' escapes ('\\xc3'), not as the U+FFFD that every
        such piece decodes to."""
        text = self._rust.decode([int(token_id)], skip_special_tokens=False)
        token = self._rust.id_to_token(int(token_id)) or ""
        if "\ufffd" in text and "\ufffd" not in token and set(token) <= BYTE_LEVEL_BYTES.keys():
            return bytes(BYTE_LEVEL_BYTES[character] for character in token).decode("utf-8", "backslashreplace")
        return text

    def settings(self) -> dict:
        """The pipeline's settings as its tokenizer.json holds them (words.word_rule reads its rule there)."""
        return json.loads(self._rust.to_str())

    def own_word_ids(self) -> set:
        """Ids whole-word masking takes as a word of their own: the reserved ids and every added token."""
        return self.reserved_ids() | set(self._rust.get_added_tokens_decoder())

    cls = property(lambda self: self.ids["cls"])  # the special ids, as the tokenizer names them
    sep = property(lambda self: self.ids["sep"])
    pad = property(lambda self: self.ids["pad"])
    mask = property(lambda self: self.ids["mask"])

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @property
    def eod(self) -> int:
        """End of document, appended by `--append-eod`; BERT has none of its own, so [SEP] as in Megatron."""
        return self.sep

    @functools.cached_property
    def identity(self) -> str:
        """sha256 of the tokens in id order: equal sizes are not equal vocabs (computed once: every save
        and check reads it)."""
        return hashlib.sha256(json.dumps(self.tokens, ensure_ascii=False).encode("utf-8")).hexdigest()

    @functools.cached_property
    def pipeline(self) -> dict:
        """The settings of the text pipeline (text_pipeline): equal tokens are not equal ids for a text (a cased
        and a lower-cased WordPiece share their vocab)."""
        return text_pipeline(self._rust)

    def record(self) -> dict:
        """The identity record; the added tokens' part of the pipeline under a key of its own ("added_tokens"),
        which versions that compare the text pipeline part by part, written before the part, pass over."""
        added = {path: value for path, value in self.pipeline.items() if path.partition(".")[0] == ADDED_TOKENS}
        return {"tokenizer_type": self.type_name, "file": os.path.abspath(self.file), "vocab_size": self.vocab_size,
                "vocab_sha256": self.identity, ADDED_TOKENS: added,
                "text_pipeline": {path: value for path, value in self.pipeline.items() if path not in added},
                "special_tokens": self.special_tokens()}


class BertWordPiece(_Tokenizer):
    """A BERT vocab.txt: the line number is the id, the special tokens are [CLS] [SEP] [MASK] [PAD]."""

    def __init__(self, vocab_file: str, lower_case: bool = True):
        self.file = str(vocab_file)
        self.lower_case = lower_case
        self.type_name = next(name for name, lower in TOKENIZER_TYPES.items() if lower == lower_case)
        self.vocab = read_vocab(vocab_file)
        self.file_bytes = Path(vocab_file).read_bytes()  # what a checkpoint carries, even once the file is gone
        missing = [token for token in SPECIAL_TOKENS if token not in self.vocab]
        if missing:
            raise DataError(f"vocab file {vocab_file} lacks the special tokens {' '.join(missing)}",
                            f"use a BERT vocab.txt (or build one with {in_repository('tools/build_vocab.py')})")
        self._rust = wordpiece(self.vocab, lower_case)
        self.inv_vocab = {index: token for token, index in self.vocab.items()}
        self.tokens = list(self.vocab)
        self.ids = {kind: self.vocab[token] for kind, token in self.special_tokens().items()}

    def __getstate__(self):  # workers rebuild from the file rather than pickling the Rust object
        return {"vocab_file": self.file, "lower_case": self.lower_case}

    def __setstate__(self, state):
        self.__init__(state["vocab_file"], state["lower_case"])

    def special_tokens(self) -> dict:
        return {kind: names[0] for kind, names in SPECIAL_NAMES.items()}

    def reserved_ids(self) -> set:
        """Ids masking never draws as a random replacement: [PAD], [CLS], [unused0], ... (BERT's rule)."""
        return {index for token, index in self.vocab.items() if token.startswith("[") and token.endswith("]")}

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.inv_vocab[int(index)] for index in ids]


class HFTokenizer(_Tokenizer):
    """Any Hugging Face fast tokenizer (BPE, Unigram, WordPiece, WordLevel) from its tokenizer.json.

    Text is encoded without the tokenizer's own template, truncation or padding. The special tokens
    come from `special_tokens` (a checkpoint's record), else the tokenizer_config.json beside the
    file, else the post-processor's template, else the tokenizer's tokens by their usual names; one
    that cannot be found is an error."""

    type_name = HF_TOKENIZER

    def __init__(self, path, special_tokens: dict | None = None):
        path = Path(path)
        self.file = str(path / "tokenizer.json" if path.is_dir() else path)
        self._rust = _read_tokenizer_json(path)
        self.file_bytes = Path(self.file).read_bytes()  # what a checkpoint carries, even once the file is gone
        ids = self._rust.get_vocab(with_added_tokens=True)
        if not ids:
            raise DataError(f"tokenizer {self.file} has no tokens", "pass a trained tokenizer.json")
        self.tokens = [""] * (max(ids.values()) + 1)  # an id no token has (none in practice) stays ""
        for token, index in ids.items():
            self.tokens[index] = token
        self.special = special_tokens or _find_special_tokens(self._rust, Path(self.file))
        if "unk" not in self.special:  # a checkpoint's record from before records named it: the model's
            self.special = {**self.special, **_unknown_token(self.settings(), ids)}
        self.ids = {}
        for kind in SPECIAL_NAMES:
            token = self.special.get(kind)
            if token is None or token not in ids:
                where = f"names {token!r}, which is not one of its tokens" if token else "has no such token"
                raise DataError(f"tokenizer {self.file} {where}: no {kind} token ({' or '.join(SPECIAL_NAMES[kind])})",
                                f"add the {kind} token to the tokenizer as a special token, or name it as "
                                f"\"{kind}_token\" in a tokenizer_config.json beside the tokenizer.json")
            self.ids[kind] = ids[token]
        self._refuse_shared_specials()
        self._refuse_ordinary_mask()

    def _refuse_shared_specials(self) -> None:
        """A mask token that is also the pad, cls, sep or unknown token: masking would write a token the text holds
        anyway, and fill-mask would take every padding position for a mask. A pad token that is also the cls, sep
        or unknown token (a tokenizer_config.json's pad_token "</s>" or "<unk>", as LLaMA-style folders have): the
        export's pad_token_id is transformers' padding_idx, whose embedding fine-tuning would never update, and
        every unknown word of the text would read as padding."""
        # unk: _unknown_token's
        for kind, others in (("mask", ("pad", "cls", "sep", "unk")), ("pad", ("cls", "sep", "unk"))):
            token = self.special[kind]
            same = [other for other in others if self.special.get(other) == token]
            if same:
                names = " or ".join(SPECIAL_NAMES[kind])
                raise DataError(f"tokenizer {self.file}'s {kind} token {token!r} is also its {same[0]} token",
                                f"name a token of its own as {kind}_token (e.g. {names}) in the "
                                "tokenizer_config.json or special_tokens_map.json beside it (adding it to the "
                                "tokenizer as a special token where it has none)")

    def _refuse_ordinary_mask(self) -> None:
        """A mask token that is an ordinary token of the vocab (a word such as 'the', named as mask_token in a
        tokenizer_config.json): the text holds it too, so masked positions could not be told from real ones.
        Real tokenizers make it an added special token (RoBERTa's <mask>, ModernBERT's and BERT's tokenizer.json
        [MASK]); the names [MASK] and <mask> pass as plain tokens too, as a vocab.txt holds [MASK] (text that
        spells them out is meant as a mask)."""
        mask = self.special["mask"]
        if mask in SPECIAL_NAMES["mask"] or mask in self.added_specials().values():
            return
        raise DataError(f"tokenizer {self.file}'s mask token {mask!r} is an ordinary token of its vocab, not a special "
                        "token: masked positions could not be told from the text's own",
                        "name an added special token as mask_token (e.g. <mask> or [MASK]) in the "
                        "tokenizer_config.json or special_tokens_map.json beside it, or add it to the tokenizer "
                        "as a special token")

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        """As _Tokenizer's; where the model has no unknown token and no byte fallback (_missing_fallback), a text
        holding a character it has no token for is a DataError naming the character: such a model raises an
        exception of the Rust side (Unigram, WordPiece, WordLevel) or leaves the character out of the ids (BPE)."""
        if self._alphabet is not None:
            self._alphabet.refuse_missing(texts, self)
        try:
            return super().tokenize_batch(texts)
        except Exception as error:  # the Rust side raises plain Exceptions
            if type(error) is not Exception or self.lacks_fallback is None:
                raise
            raise DataError(f"the tokenizer {self.file} cannot encode a word of this text ({error}): "
                            f"{self.lacks_fallback}", RETRAIN_WITH_UNK) from None

    @functools.cached_property
    def lacks_fallback(self) -> str | None:
        """What the model lacks to encode any text (_missing_fallback), None where it can."""
        return _missing_fallback(self.settings(), self._rust.get_vocab(with_added_tokens=True))

    @functools.cached_property
    def _alphabet(self):
        """The _Alphabet that checks texts for a model that lacks a fallback (not WordLevel: it knows words, not
        characters), else None."""
        if self.lacks_fallback is None or self.settings()["model"].get("type") == "WordLevel":
            return None
        return _Alphabet(self._rust, self.settings()["model"])

    def added_specials(self) -> dict:
        """{id: token} of the tokens added to the tokenizer as special (<s>, <mask>, [MASK], ...)."""
        return {index: token.content for index, token in self._rust.get_added_tokens_decoder().items() if token.special}

    def __getstate__(self):
        return {"file": self.file, "special": self.special}

    def __setstate__(self, state):
        self.__init__(state["file"], state["special"])

    def special_tokens(self) -> dict:
        return dict(self.special)

    def reserved_ids(self) -> set:
        """Ids masking never draws as a random replacement: the special tokens (<s>, <mask>, ... and any
        other added special token) and ids no token has."""
        unused = {index for index, token in enumerate(self.tokens) if not token}
        return set(self.added_specials()) | set(self.ids.values()) | unused

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.tokens[int(index)] for index in ids]


RETRAIN_WITH_UNK = ("retrain it with an unknown token (the model's unk_token, one of the trainer's special_tokens) or "
                    "byte_fallback, or remove such characters from the corpus")


def _missing_fallback(settings: dict, vocab: dict) -> str | None:
    """'its BPE model has no unknown token (unk_token) and no byte fallback' for a model that has no way to write
    a character outside its vocab; None for one that has (an unknown token of the vocab, byte fallback, a
    byte-level BPE holding all 256 byte characters) or a model type not known here."""
    model = settings.get("model") or {}
    kind = model.get("type")
    if kind not in ("BPE", "Unigram", "WordPiece", "WordLevel") or model.get("byte_fallback"):
        return None
    if _unknown_token(settings, vocab):
        return None
    if kind == "BPE" and _is_byte_level(settings.get("pre_tokenizer")) and set(ByteLevel.alphabet()) <= vocab.keys():
        return None
    field = "unk_id" if kind == "Unigram" else "unk_token"
    return f"its {kind} model has no unknown token ({field})" + (" and no byte fallback" if kind != "WordPiece" and
                                                                kind != "WordLevel" else "")


def _is_byte_level(pre_tokenizer: dict | None) -> bool:
    """Whether a pre-tokenizer's settings are ByteLevel, or a Sequence holding one."""
    pre_tokenizer = pre_tokenizer or {}
    return pre_tokenizer.get("type") == "ByteLevel" or any(
        _is_byte_level(part) for part in pre_tokenizer.get("pretokenizers") or [])


class _Alphabet:
    """The characters a model without a fallback has a token for (its one-character tokens, a subword prefix or
    suffix taken off), and the check of texts against them: as the model sees a text, normalized and
    pre-tokenized (a Metaspace's ▁, a byte-level's byte characters). Characters seen to pass are remembered, so
    a text of known characters costs one set()."""

    def __init__(self, rust: Tokenizer, model: dict):
        self.rust = rust
        prefix, suffix = model.get("continuing_subword_prefix") or "", model.get("end_of_word_suffix") or ""
        bare = (token.removeprefix(prefix).removesuffix(suffix) for token in rust.get_vocab(with_added_tokens=False))
        self.characters = {token for token in bare if len(token) == 1}
        self.drops = model.get("type") == "BPE"  # a BPE leaves out what it has no token for; the others raise
        self.passed = set()  # characters of the raw text seen to be encodable

    def model_view(self, text: str) -> set:
        """The characters of `text` as the model receives them."""
        if self.rust.normalizer is not None:
            text = self.rust.normalizer.normalize_str(text)
        if self.rust.pre_tokenizer is None:
            return set(text)
        return {character for piece, _ in self.rust.pre_tokenizer.pre_tokenize_str(text) for character in piece}

    def refuse_missing(self, texts: list[str], tokenizer) -> None:
        """DataError naming the first character of `texts` the model has no token for. Each new character is
        checked alone, and a text with one that fails is checked whole (normalization may join it to its
        neighbour, as a combining accent)."""
        for text in texts:
            failed = [character for character in set(text) - self.passed if not self._passes(character)]
            missing = failed and self.model_view(text) - self.characters
            if missing:  # named: the first failed character whose own view holds what the text's lacks
                character = min((character for character in failed if self.model_view(character) & missing),
                                key=text.index, default=min(failed, key=text.index))
                drops = "would leave it out of the ids" if self.drops else "fails on it"
                named = f"{character!r} (U+{ord(character):04X})"
                seen = "".join(sorted(self.model_view(character) & missing))
                if seen and seen != character:  # a normalizer's: 'Z' lower-cased to a 'z' the vocab lacks
                    named = f"{seen!r}, what its normalizer makes of {named},"
                raise DataError(f"the tokenizer {tokenizer.file} has no token for {named} and {drops}: "
                                f"{tokenizer.lacks_fallback}", RETRAIN_WITH_UNK)

    def _passes(self, character: str) -> bool:
        if self.model_view(character) <= self.characters:
            self.passed.add(character)
            return True
        return False


def naming_flags(type_name: str, file) -> str:
    """The flags that name a tokenizer to the trainer and tools/preprocess_data.py."""
    if type_name == HF_TOKENIZER:
        return f"--tokenizer-file {file}"
    return f"--tokenizer-type {type_name} --vocab-file {file}"


def check_fits(tokenizer, vocab_size: int,
               fix: str = "pass the --vocab-file (or --tokenizer-file) the model was trained with") -> None:
    """Every token id has an embedding row of a model of `vocab_size`. Names the tokenizer file, which
    may be a folder's or a checkpoint's rather than a flag's (the trainer, fill_mask, to-hf, from-hf)."""
    if tokenizer.vocab_size > vocab_size:
        raise ConfigError(f"the tokenizer {tokenizer.file} has {tokenizer.vocab_size} tokens, the model's vocab_size "
                          f"is {vocab_size}", fix)


def sample_template(cls: tuple[str, int], sep: tuple[str, int]) -> dict:
    """A tokenizer.json's post-processor (TemplateProcessing, as tokenizers writes it) that frames text as the
    training samples are framed (bert_sample.build_segment): `cls A sep`, and `cls A sep B sep` with token type 1
    from B on; `cls`, `sep`: (token, id). Written as settings, not parsed from a template string, so a token
    holding a space or a ':' stays one token."""
    def piece(kind: str, name: str, type_id: int) -> dict:
        return {kind: {"id": name, "type_id": type_id}}

    single = [piece("SpecialToken", cls[0], 0), piece("Sequence", "A", 0), piece("SpecialToken", sep[0], 0)]
    return {"type": "TemplateProcessing", "single": single,
            "pair": [*single, piece("Sequence", "B", 1), piece("SpecialToken", sep[0], 1)],
            "special_tokens": {token: {"id": token, "ids": [index], "tokens": [token]} for token, index in (cls, sep)}}


def frames_as_samples(post_processor: dict | None, cls: tuple[str, int], sep: tuple[str, int]) -> bool:
    """Whether a tokenizer.json's post-processor frames text as sample_template does: that template, BERT's
    BertProcessing of the same tokens, or a Sequence of one such and ByteLevel ones (which trim offsets only)."""
    post_processor = post_processor or {}
    if post_processor.get("type") == "Sequence":
        framing = [part for part in post_processor.get("processors") or () if part.get("type") != "ByteLevel"]
        return len(framing) == 1 and frames_as_samples(framing[0], cls, sep)
    if post_processor.get("type") == "BertProcessing":
        return post_processor.get("cls") == list(cls) and post_processor.get("sep") == list(sep)
    return post_processor == sample_template(cls, sep)


def wordpiece(vocab: dict, lower_case: bool) -> Tokenizer:
    """BERT's WordPiece: its normalizer lower-cases and strips accents, or keeps both."""
    rust = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    rust.normalizer = BertNormalizer(lowercase=lower_case, strip_accents=lower_case)
    rust.pre_tokenizer = BertPreTokenizer()
    return rust


def text_pipeline(rust: Tokenizer) -> dict:
    """path ("normalizer.lowercase") -> setting, for each part of the text pipeline (PIPELINE_PARTS): an
    object as {}, a list as [its length], a long value (a precompiled charsmap) as its sha256. The model's
    vocab is left out (the identity covers the tokens), but not what splits a word into them: a BPE's
    merges in order (as pairs, whichever way a tokenizers version writes them) and a Unigram's scores,
    each as one sha256. BertNormalizer's strip_accents None ("as lowercase") is written out, so that a
    BERT tokenizer.json and a vocab.txt of the same case are one pipeline. The added tokens matched in text
    (the non-special ones: special ones are encoded as their characters) are a part too, each with how it
    matches (single_word, lstrip, rstrip, normalized): equal tokens, another split."""
    settings = json.loads(rust.to_str())
    settings[ADDED_TOKENS] = [{key: value for key, value in token.items() if key not in ("id", "special")}
                              for token in settings.get(ADDED_TOKENS) or () if not token.get("special")]
    model = settings["model"]
    settings["model"] = {key: value for key, value in model.items() if key not in ("vocab", "merges")}
    if "merges" in model:
        settings["model"]["merges"] = _sha256([merge.split(" ") if isinstance(merge, str) else merge
                                               for merge in model["merges"]])
    if model.get("type") == "Unigram":
        settings["model"]["scores"] = _sha256([score for _, score in model["vocab"]])
    flat = {}
    pending = [(part, settings[part]) for part in PIPELINE_PARTS]
    while pending:
        path, value = pending.pop(0)
        if isinstance(value, dict) and value.get("type") == "BertNormalizer" and value.get("strip_accents") is None:
            value["strip_accents"] = value.get("lowercase")
        if isinstance(value, (dict, list)):
            flat[path] = {} if isinstance(value, dict) else [len(value)]
            items = value.items() if isinstance(value, dict) else enumerate(value)
            pending[:0] = [(f"{path}.{key}", item) for key, item in items]  # depth first: a part reads in order
        else:
            text = json.dumps(value, ensure_ascii=False)
            flat[path] = value if len(text) <= 80 else _sha256(value)
    return flat


def _sha256(value) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(value, ensure_ascii=False).encode("utf-8")).hexdigest()


def _read_tokenizer_json(path: Path) -> Tokenizer:
    fix = "pass a Hugging Face tokenizer.json (or the model folder holding one) with --tokenizer-file"
    file = path / "tokenizer.json" if path.is_dir() else path
    if path.is_dir() and not file.is_file():
        raise DataError(f"tokenizer folder {path} has no tokenizer.json",
                        f"{fix}; a folder with only a vocab.txt is read with --vocab-file")
    if not file.is_file():
        raise DataError(f"tokenizer file {file} does not exist", fix)
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as error:  # the Rust side raises plain Exceptions (serde's message)
        refuse_lfs_pointer(file)
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataError(f"tokenizer file {file} is not a Hugging Face tokenizer.json ({reason})",
                        f"{fix}; a BERT vocab.txt is read with --vocab-file") from None
    # published files often keep the truncation (max_length 512) and padding they were saved with:
    # documents are cut into samples by the dataset, never by the tokenizer, and pad ids are no text
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def _find_special_tokens(rust: Tokenizer, file: Path) -> dict:
    """kind -> token string from, in order: the model folder's files beside `file` (transformers'
    reading: tokenizer_config.json, and over it special_tokens_map.json where the config has no
    added_tokens_decoder: folders saved before transformers 4.34), the post-processor
    (TemplateProcessing: first and last special of the single template; Roberta/Bert: cls, sep),
    the tokenizer's tokens by the names in SPECIAL_NAMES (added special tokens first). A token a
    file names that the tokenizer lacks is an error naming that file. "unk": _unknown_token's."""
    vocab = rust.get_vocab(with_added_tokens=True)
    settings = json.loads(rust.to_str())
    config = _folder_settings(file.parent / "tokenizer_config.json")
    found = _named_tokens(config, file.parent / "tokenizer_config.json", vocab, file)
    named = dict(config)  # the folder's settings, for the unknown token
    if "added_tokens_decoder" not in config:
        legacy = file.parent / "special_tokens_map.json"
        legacy_settings = _folder_settings(legacy)
        found.update(_named_tokens(legacy_settings, legacy, vocab, file))
        named.update(legacy_settings)
    processors = [settings.get("post_processor") or {}]
    while processors:
        processor = processors.pop(0)
        processors += processor.get("processors") or []
        if processor.get("type") in ("RobertaProcessing", "BertProcessing"):
            found.setdefault("cls", processor["cls"][0])
            found.setdefault("sep", processor["sep"][0])
        elif processor.get("type") == "TemplateProcessing":
            specials = [piece["SpecialToken"]["id"] for piece in processor.get("single", []) if "SpecialToken" in piece]
            if len(specials) >= 2:
                found.setdefault("cls", specials[0])
                found.setdefault("sep", specials[-1])
    added = [token.content for token in rust.get_added_tokens_decoder().values() if token.special]
    for kind, names in SPECIAL_NAMES.items():
        if kind not in found:
            found[kind] = next((name for name in names if name in added), None) or next(
                (name for name in names if name in vocab), None)
    special = {kind: token for kind, token in found.items() if token is not None}
    return {**special, **_unknown_token(settings, vocab, named)}


def _unknown_token(settings: dict, vocab: dict, named: dict | None = None) -> dict:
    """{"unk": token} for the token the model writes for text it has no token for, as the tokenizer.json's
    `settings` name it (a BPE's, WordPiece's or WordLevel's unk_token, a Unigram's unk_id), else as a folder's
    settings files `named` name it (ModernBERT's tokenizer_config.json names [UNK], its byte-level BPE none):
    transformers reads it from tokenizer_config.json alone, so the export names it. {} where neither names a
    token of `vocab`."""
    model = settings.get("model") or {}
    unk, index = model.get("unk_token"), model.get("unk_id")
    if model.get("type") == "Unigram" and isinstance(index, int) and 0 <= index < len(model.get("vocab") or []):
        unk = model["vocab"][index][0]  # [piece, score]
    if unk not in vocab:
        unk = (named or {}).get("unk_token")
        unk = unk.get("content") if isinstance(unk, dict) else unk
    return {"unk": unk} if isinstance(unk, str) and unk in vocab else {}


def _folder_settings(path: Path) -> dict:
    """A model folder's JSON settings file ({} where there is none)."""
    if not path.is_file():
        return {}
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataError(f"{path} is not valid JSON ({error})", "fix or remove it") from None
    if not isinstance(settings, dict):
        raise DataError(f"{path} is not a JSON object of settings", "fix or remove it")
    return settings


def _named_tokens(settings: dict, path: Path, vocab: dict, file: Path) -> dict:
    """kind -> the token `settings` (read from `path`) names as "<kind>_token" (a string or an
    added-token record); one the tokenizer lacks is an error naming `path`, the file to fix."""
    found = {}
    for kind in SPECIAL_NAMES:
        value = settings.get(f"{kind}_token")
        value = value.get("content") if isinstance(value, dict) else value
        if value is None:
            continue
        if not isinstance(value, str):
            raise DataError(f"{path}'s {kind}_token = {json.dumps(value)} is not a token",
                            f"write {kind}_token as a string or an added-token record, or remove it")
        if value not in vocab:
            raise DataError(f"{path} names {value!r} as {kind}_token, which is not a token of {file}",
                            f"set \"{kind}_token\" to one of its tokens ({' or '.join(SPECIAL_NAMES[kind])} "
                            "usually), or remove it to use the tokenizer's own")
        found[kind] = value
    return found


def read_vocab(vocab_file) -> dict[str, int]:
    """One token per line; the line number is the id (the BERT `vocab.txt` convention)."""
    path = Path(vocab_file)
    if path.is_dir():
        if not (path / "vocab.txt").is_file() and (path / "tokenizer.json").is_file():  # an HF folder of BPE
            raise DataError(f"vocab file {path} is a folder holding tokenizer.json, not vocab.txt",
                            f"pass --tokenizer-file {path / 'tokenizer.json'} instead of --vocab-file")
        raise DataError(f"vocab file {path} is a directory", "pass the vocab.txt inside it to --vocab-file")
    if not path.is_file():
        raise DataError(f"vocab file {path} does not exist",
                        f"pass --vocab-file with a BERT vocab.txt ({in_repository('tools/build_vocab.py')} makes one)")
    refuse_lfs_pointer(path)  # its lines would read as a vocab without [CLS]
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise DataError(f"vocab file {path} is not UTF-8 text (line {line}: byte {raw[error.start]:#04x}); is it a "
                        "binary file?", "pass a BERT vocab.txt in UTF-8, one token per line "
                        f"({in_repository('tools/build_vocab.py')} makes one)") from None
    text = text.removeprefix("\ufeff")  # a byte-order mark (Windows editors): not part of the first token
    _refuse_json_vocab(path, text)
    # universal newlines, as transformers' readlines() takes them (not str.splitlines(), which also splits at
    # U+2028, NEL and form feeds: every later id would shift); a final newline ends the last line
    lines = text.replace("\r\n", "\n").replace("\r", "\n").removesuffix("\n").split("\n")
    if lines == [""]:
        raise DataError(f"vocab file {path} is empty", "pass a BERT vocab.txt with one token per line")
    _refuse_odd_lines(path, lines)
    return {token: index for index, token in enumerate(lines)}


def _refuse_json_vocab(path: Path, text: str) -> None:
    """A JSON file passed as a vocab.txt: a Hugging Face tokenizer.json (an object with a "model") or a
    BPE's vocab.json (an object of token -> id). Read as lines, either lacks every special token."""
    if not text.lstrip().startswith("{"):  # a vocab.txt: parsed no further
        return
    try:
        settings = json.loads(text)
    except json.JSONDecodeError:
        return
    if not isinstance(settings, dict):
        return
    if "model" in settings:
        raise DataError(f"vocab file {path} is a Hugging Face tokenizer.json, not a vocab.txt",
                        "pass it with --tokenizer-file instead of --vocab-file")
    if settings and all(isinstance(index, int) for index in settings.values()):
        raise DataError(f"vocab file {path} is a JSON map of token to id (a Hugging Face vocab.json), not a "
                        "vocab.txt", "pass the tokenizer.json of that model (in its Hugging Face folder, beside "
                        "the vocab.json) with --tokenizer-file instead of --vocab-file")


def _refuse_odd_lines(path: Path, lines: list) -> None:
    """Lines a vocab.txt cannot mean, since the line number is the id: a token on two lines (blank lines
    included: one of the ids is never written, and the tokens and ids fall out of step), and special
    tokens with spaces or tabs at their ends (a vocab saved with trailing spaces: it lacks even [PAD]).
    One blank line, or a whitespace token, is an id WordPiece never writes, as in some published vocabs:
    accepted. The fix that keeps the ids of a model trained with the vocab is named."""
    keep_ids = ("or, for a model trained with this vocab, put a placeholder token of its own there (ids are line "
                "numbers)")
    blank = [number for number, token in enumerate(lines, start=1) if not token]
    if len(blank) > 1:
        raise DataError(f"vocab file {path} lines {_numbers(blank)} are blank: {len(blank)} ids with one token, the "
                        "empty one", f"delete all but one of them, {keep_ids}")
    padded = [number for number, token in enumerate(lines, start=1)
              if token != token.strip(" \t") and token.strip(" \t") in SPECIAL_TOKENS]
    if padded and lines[padded[0] - 1].strip(" \t") not in lines:
        spaced = sum(token != token.strip(" \t") for token in lines)
        raise DataError(f"vocab file {path} line {padded[0]} holds {lines[padded[0] - 1]!r}, with spaces or tabs at "
                        f"its ends ({spaced} of its {len(lines)} tokens do), which WordPiece never writes",
                        f"remove them, e.g. sed -i 's/^[ \\t]*//; s/[ \\t]*$//' {path}")
    first_line = {}
    for number, token in enumerate(lines, start=1):
        if token in first_line:
            raise DataError(f"vocab file {path} holds {token!r} twice, on lines {first_line[token]} and {number}: "
                            "one of its ids is never written, and the later ids fall out of step with its tokens",
                            f"delete line {number}, {keep_ids}")
        first_line[token] = number


def _numbers(numbers: list) -> str:
    """Line numbers for a message: up to five, then how many more."""
    shown = ", ".join(map(str, numbers[:5]))
    return shown + (f" (and {len(numbers) - 5} more)" if len(numbers) > 5 else "")


def tokenizer_kind(tokenizer_type: str | None, tokenizer_file=None) -> str:
    """The --tokenizer-type a tokenizer is built as: the flag's, else picked by the file (build_tokenizer)."""
    return tokenizer_type or (HF_TOKENIZER if tokenizer_file else "BertWordPieceLowerCase")


def build_tokenizer(tokenizer_type: str | None, vocab_file=None, tokenizer_file=None):
    """The tokenizer the flags name: `--tokenizer-file` (a tokenizer.json or its folder) means
    HFTokenizer, `--vocab-file` a WordPiece vocab.txt; `tokenizer_type` None picks by the file."""
    tokenizer_type = tokenizer_kind(tokenizer_type, tokenizer_file)
    if tokenizer_type not in TYPE_NAMES:
        raise ConfigError(f"unknown --tokenizer-type {tokenizer_type}", f"use one of {', '.join(TYPE_NAMES)}")
    if tokenizer_type == HF_TOKENIZER:
        if not tokenizer_file:
            raise ConfigError(f"--tokenizer-type {HF_TOKENIZER} needs --tokenizer-file",
                              "pass a tokenizer.json (or the Hugging Face folder holding one) with --tokenizer-file")
        if vocab_file:
            raise ConfigError(f"--tokenizer-type {HF_TOKENIZER} reads --tokenizer-file, and --vocab-file is given",
                              "pass the tokenizer.json (or its folder) with --tokenizer-file and drop --vocab-file")
        return HFTokenizer(tokenizer_file)
    if tokenizer_file:
        raise ConfigError(f"--tokenizer-file is read by --tokenizer-type {HF_TOKENIZER}, not {tokenizer_type}",
                          f"drop --tokenizer-type {tokenizer_type}, or pass its vocab.txt with --vocab-file")
    if not vocab_file:
        raise ConfigError("neither --vocab-file nor --tokenizer-file is given",
                          "pass a BERT vocab.txt with --vocab-file, or a tokenizer.json with --tokenizer-file")
    return BertWordPiece(vocab_file, lower_case=TOKENIZER_TYPES[tokenizer_type])


_shared = {}  # shared_tokenizer's: (type, vocab_file, tokenizer_file) -> (_file_digests of its files, tokenizer)


def shared_tokenizer(tokenizer_type: str | None, vocab_file=None, tokenizer_file=None):
    """build_tokenizer's tokenizer, built once per process while its files are unchanged: a rank's start reads it
    for the nodes' comparison (same_settings.content_identities) and as the run's (explicit_tokenizer), and a
    tokenizer.json takes ~0.4 s to build. The one object is shared: a caller that changes it
    (read_specials_as_text) builds its own."""
    # the type built (tokenizer_kind): the flags' None and same_settings' explicit type alike
    key = (tokenizer_kind(tokenizer_type, tokenizer_file), vocab_file and str(vocab_file),
           tokenizer_file and str(tokenizer_file))
    digests = _file_digests(vocab_file or tokenizer_file)  # ~2 ms for a 2 MB tokenizer.json
    kept = _shared.get(key)
    if kept is None or digests is None or kept[0] != digests:
        kept = _shared[key] = (digests, build_tokenizer(tokenizer_type, vocab_file, tokenizer_file))
    return kept[1]


def _file_digests(path) -> tuple | None:
    """(name, sha1) of the file `path`, or of each file of the folder `path` (a tokenizer.json's, with its
    tokenizer_config.json and special_tokens_map.json; a file over READ_WHOLE_BYTES there, a model's weights, by its
    size and mtime): a file rewritten within one clock tick is told apart. None: not found."""
    try:
        files = sorted(entry.path for entry in os.scandir(path) if entry.is_file()) if os.path.isdir(path) \
            else [str(path)]
        found = []
        for file in files:
            stat = os.stat(file)
            if stat.st_size > READ_WHOLE_BYTES:
                found.append((file, stat.st_size, stat.st_mtime_ns))
            else:
                with open(file, "rb") as opened:
                    found.append((file, hashlib.file_digest(opened, "sha1").hexdigest()))
        return tuple(found)
    except (OSError, TypeError):
        return None


READ_WHOLE_BYTES = 64 << 20  # a tokenizer file is a few MB; a folder's larger files are its model's weights


CASED_SHARE = 0.01  # more of a vocab's words with a capital than this: built cased (a lower-cased one holds ~none)


def case_warning(tokenizer, flag_type: str | None) -> str | None:
    """The warning for a vocab.txt whose case the WordPiece type contradicts: a cased vocab lower-cased (its
    capitalised tokens are never written: rows the model never learns) or a lower-cased vocab kept cased
    (a capitalised word it cannot spell is one [UNK]). A warning, not an error: the ids stay those of the
    vocab, a checkpoint trained so keeps its tokenizer, and a vocab lower-cased with its accents kept has no
    type of its own. `flag_type`: the --tokenizer-type given (None: the default)."""
    if not isinstance(tokenizer, BertWordPiece):
        return None
    words = [token.removeprefix("##") for token in tokenizer.tokens if not (token[:1] == "[" and token[-1:] == "]")]
    capitalised = [word for word in words if word.lower() != word]
    named = f"--tokenizer-type {tokenizer.type_name}" if flag_type else f"the default {tokenizer.type_name}"
    if tokenizer.lower_case and len(capitalised) > CASED_SHARE * len(words):
        examples = ", ".join(capitalised[:3])
        return (f"the vocab {tokenizer.file} holds {len(capitalised)} tokens with capitals ({examples}, ...), "
                f"which {named} never writes (it lower-cases the text): it was built cased; pass "
                "--tokenizer-type BertWordPieceCase")
    if not tokenizer.lower_case and not capitalised and any(word.upper() != word for word in words):
        return (f"the vocab {tokenizer.file} holds no token with a capital, while {named} keeps the text's case: "
                "each capitalised word becomes [UNK]; drop --tokenizer-type BertWordPieceCase (the default "
                "BertWordPieceLowerCase lower-cases the text, as the vocab was built)")
    return None


def explicit_tokenizer(args):
    """The tokenizer named by the flags --tokenizer-type/--vocab-file/--tokenizer-file of `args`, or
    None when they name no file (the checkpoint's or the default one is used)."""
    if not (args.vocab_file or args.tokenizer_file):
        return None
    return shared_tokenizer(args.tokenizer_type, args.vocab_file, args.tokenizer_file)


def add_tokenizer_flags(parser, vocab_help: str, tokenizer_file_default: str = "") -> None:
    """--vocab-file, --tokenizer-file, --tokenizer-type of pretrain_bert.py and the tools: one definition,
    so that each takes the same names and choices. `tokenizer_file_default`: ends --tokenizer-file's help."""
    parser.add_argument("--vocab-file", "--vocab", help=vocab_help)
    parser.add_argument("--tokenizer-file", help="Hugging Face tokenizer.json, or the model folder holding it "
                        f"(--tokenizer-type {HF_TOKENIZER}){tokenizer_file_default}")
    parser.add_argument("--tokenizer-type", choices=TYPE_NAMES, help=f"default: {HF_TOKENIZER} with --tokenizer-file, "
                        "else BertWordPieceLowerCase")
