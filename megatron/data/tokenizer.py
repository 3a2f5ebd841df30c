"""BERT WordPiece tokenizers over a standard `vocab.txt`, backed by HF `tokenizers` (Rust).

Megatron's names are kept (`BertWordPieceLowerCase`, `BertWordPieceCase`) so existing launch
scripts work; the special ids come from the vocab file itself, never from constants.
"""
from pathlib import Path

from tokenizers import Tokenizer
from tokenizers.models import WordPiece
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer

from megatron.errors import ConfigError, DataError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TOKENIZER_TYPES = {"BertWordPieceLowerCase": True, "BertWordPieceCase": False}  # name -> lower_case


class BertWordPiece:
    """Text -> WordPiece ids without special tokens; [CLS]/[SEP] are added by the sample builder."""

    def __init__(self, vocab_file: str, lower_case: bool = True):
        self.vocab_file = str(vocab_file)
        self.lower_case = lower_case
        self.vocab = read_vocab(vocab_file)
        missing = [token for token in SPECIAL_TOKENS if token not in self.vocab]
        if missing:
            raise DataError(f"vocab file {vocab_file} lacks the special tokens {' '.join(missing)}",
                            "use a BERT vocab.txt (or build one with tools/build_vocab.py)")
        self._rust = Tokenizer(WordPiece(self.vocab, unk_token="[UNK]"))
        self._rust.normalizer = BertNormalizer(lowercase=lower_case, strip_accents=lower_case)
        self._rust.pre_tokenizer = BertPreTokenizer()
        self.inv_vocab = {index: token for token, index in self.vocab.items()}

    def __getstate__(self):  # workers rebuild from the file rather than pickling the Rust object
        return {"vocab_file": self.vocab_file, "lower_case": self.lower_case}

    def __setstate__(self, state):
        self.__init__(state["vocab_file"], state["lower_case"])

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def tokenize(self, text: str) -> list[int]:
        return self._rust.encode(text, add_special_tokens=False).ids

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        # the _fast variant skips character offsets, which nothing here needs (~25% faster)
        return [encoding.ids for encoding in self._rust.encode_batch_fast(texts, add_special_tokens=False)]

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.inv_vocab[int(index)] for index in ids]

    @property
    def cls(self) -> int:
        return self.vocab["[CLS]"]

    @property
    def sep(self) -> int:
        return self.vocab["[SEP]"]

    @property
    def pad(self) -> int:
        return self.vocab["[PAD]"]

    @property
    def mask(self) -> int:
        return self.vocab["[MASK]"]

    @property
    def eod(self) -> int:
        """End of document, appended by `--append-eod`; BERT has none of its own, so [SEP] as in Megatron."""
        return self.sep


def read_vocab(vocab_file) -> dict[str, int]:
    """One token per line; the line number is the id (the BERT `vocab.txt` convention)."""
    path = Path(vocab_file)
    if path.is_dir():
        raise DataError(f"vocab file {path} is a directory", "pass the vocab.txt inside it to --vocab-file")
    if not path.is_file():
        raise DataError(f"vocab file {path} does not exist",
                        "pass --vocab-file with a BERT vocab.txt (tools/build_vocab.py makes one)")
    raw = path.read_bytes()
    try:
        tokens = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise DataError(f"vocab file {path} is not UTF-8 text (line {line}: byte {raw[error.start]:#04x}); is it a "
                        "binary file?", "pass a BERT vocab.txt in UTF-8, one token per line (tools/build_vocab.py "
                        "makes one)") from None
    vocab = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    if not vocab:
        raise DataError(f"vocab file {path} is empty", "pass a BERT vocab.txt with one token per line")
    return vocab


def build_tokenizer(tokenizer_type: str, vocab_file) -> BertWordPiece:
    if tokenizer_type not in TOKENIZER_TYPES:
        raise ConfigError(f"unknown --tokenizer-type {tokenizer_type}", f"use one of {', '.join(TOKENIZER_TYPES)}")
    return BertWordPiece(vocab_file, lower_case=TOKENIZER_TYPES[tokenizer_type])
