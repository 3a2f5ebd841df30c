"""Whole-word masking's words, found by the tokenizer's own rule for where a word begins.

The rule comes from the tokenizer's settings, never from a look at some of its tokens:
- a continuing-subword prefix (WordPiece's '##', a BPE may have one too): a piece with it continues
  the word of the piece before it. BERT's pre-tokenizer splits punctuation off, so "don't" is the
  three words don ' t.
- an end-of-word suffix (a BPE's end_of_word_suffix, '</w>'): a piece with it ends its word.
- a word-start marker: byte-level BPE's 'Ġ' (the space byte, ModernBERT's and RoBERTa's ByteLevel
  pre-tokenizer or decoder), SentencePiece's '▁' (a Metaspace pre-tokenizer or decoder, or a normalizer
  that replaces ' ' with it): a piece that begins with the marker begins a word, one without it
  continues the word before it, punctuation included. A word is what spaces delimit: "don't" (Ġdon 't)
  and "end." (Ġend .) are one word each, " (" is one of its own.
- a WordLevel model: every token is a word.
Whatever the rule, a special or added token is a word of its own (a piece after one begins a word),
a piece that begins with other whitespace (a byte-level 'Ċ' line break) begins one, a piece that ends
with it ends one, a byte-fallback piece of such a byte (Llama-style '<0x0A>') is a word of its own, and
every sentence's first piece begins one (build_segment): a ByteLevel tokenizer without
add_prefix_space gives a sentence's first word no marker.
"""
from dataclasses import dataclass

import numpy as np

from megatron.errors import ConfigError

BYTE_LEVEL_SPACE = chr(0x100 + ord(" "))  # 'Ġ': ByteLevel shows byte b < 33 as chr(0x100 + b)
BYTE_LEVEL_BREAKS = frozenset(chr(0x100 + ord(space)) for space in "\t\n\v\f\r")  # 'ĉ', 'Ċ', ...
BYTE_FALLBACK_BREAKS = frozenset(f"<0x{ord(space):02X}>" for space in "\t\n\v\f\r")  # byte_fallback's '<0x0A>', ...
RULES = "a WordPiece '##' prefix, a BPE end-of-word suffix, a ByteLevel 'Ġ' or Metaspace '▁' word-start marker"


@dataclass(frozen=True)
class WordMarks:
    """Per vocab id, what the piece says about the words around it."""
    continuation: np.ndarray  # bool: the piece continues the word of the piece before it
    ends_word: np.ndarray  # bool: the word ends with this piece (the next piece begins one)

    def starts(self, tokens: np.ndarray, sentence_starts=(0,)) -> np.ndarray:
        """Bool per token of sentences back to back (each beginning at one of `sentence_starts`): where
        a word begins (a sentence's first token always). An empty sentence at the end (an .idx written by
        another tool) begins at len(tokens), where no token is."""
        starts = ~self.continuation[tokens]
        starts[1:] |= self.ends_word[tokens[:-1]]
        sentence_starts = np.asarray(sentence_starts, dtype=np.int64)
        starts[sentence_starts[sentence_starts < len(tokens)]] = True
        return starts


def word_rule(tokenizer) -> tuple[str, str]:
    """(kind, mark) of the tokenizer's rule: ("prefix", "##"), ("suffix", "</w>"), ("marker", "Ġ"),
    ("whole", "") for WordLevel. A tokenizer none applies to is refused (--whole-word-masking)."""
    settings = tokenizer.settings()
    model = settings.get("model") or {}
    if model.get("continuing_subword_prefix"):
        return "prefix", model["continuing_subword_prefix"]
    if model.get("end_of_word_suffix"):
        return "suffix", model["end_of_word_suffix"]
    for part in _components(settings.get("normalizer"), settings.get("pre_tokenizer"), settings.get("decoder")):
        if part.get("type") == "ByteLevel":
            return "marker", BYTE_LEVEL_SPACE
        if part.get("type") == "Metaspace":
            return "marker", part.get("replacement", "▁")
        if part.get("type") == "Replace" and part.get("pattern") == {"String": " "} and part.get("content"):
            return "marker", part["content"]  # Llama's normalizer writes '▁' for each space
    if model.get("type") == "WordLevel":
        return "whole", ""
    pre_tokenizer = (settings.get("pre_tokenizer") or {}).get("type")
    raise ConfigError(f"--whole-word-masking finds words by the tokenizer's own rule ({RULES}), and the tokenizer "
                      f"{tokenizer.file} (a {model.get('type')} model, pre-tokenizer {pre_tokenizer}) has none",
                      "drop --whole-word-masking")


def word_marks(tokenizer) -> WordMarks:
    """The WordMarks of every id of the tokenizer, by its rule (word_rule)."""
    kind, mark = word_rule(tokenizer)
    byte_level = kind == "marker" and mark == BYTE_LEVEL_SPACE
    breaks = BYTE_LEVEL_BREAKS if byte_level else frozenset()
    byte_fallback = bool((tokenizer.settings().get("model") or {}).get("byte_fallback"))
    own_words = tokenizer.own_word_ids()
    continuation, ends_word = [], []
    for index, token in enumerate(tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))):
        first, last = token[:1], token[-1:]
        alone = index in own_words or (byte_fallback and token in BYTE_FALLBACK_BREAKS)
        continuation.append(_continues(token, kind, mark) and not (first in breaks or first.isspace()) and not alone)
        ends_word.append((kind == "suffix" and token.endswith(mark)) or last in breaks or last.isspace() or alone)
    return WordMarks(np.array(continuation, dtype=bool), np.array(ends_word, dtype=bool))


def _continues(token: str, kind: str, mark: str) -> bool:
    """Whether the piece continues a word by the rule alone (whitespace and added tokens aside)."""
    if kind == "prefix":
        return token.startswith(mark)
    if kind == "marker":
        return not token.startswith(mark)
    return kind == "suffix"  # a suffix rule: every piece continues until one ends its word


def _components(*parts):
    """Every typed object of the given pipeline parts, a Sequence's members in order."""
    pending = [part for part in parts if part]
    while pending:
        part = pending.pop(0)
        if isinstance(part, dict):
            yield part
            pending[:0] = [*part.get("normalizers", []), *part.get("pretokenizers", []), *part.get("decoders", [])]
