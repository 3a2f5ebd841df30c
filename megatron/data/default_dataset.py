"""The embedded default dataset: sample corpus -> WordPiece vocab -> sentence-split mmap data.

Built from the Python installation alone (no download) into one directory, each step skipped
when its output already exists, each output written atomically, so an interrupted build
resumes and a finished one is reused. The trainer's default run points here.

The vocab of the default size is the embedded `default_vocab.txt`, trained once from the default
corpus (`tools/build_vocab.py --input .cache/default_data/sample_corpus.json --vocab-size 8192`):
HF's WordPiece trainer breaks ties in pair counts differently in each process, so a vocab trained
at each build would change the data's ids, and the default run's losses, from clone to clone.
"""
from dataclasses import dataclass
from pathlib import Path

from megatron.data.indexed_dataset import dataset_exists
from megatron.data.preprocess import PreprocessOptions, preprocess
from megatron.data.sample_corpus import DEFAULT_PACKAGES, write_corpus
from megatron.data.tokenizer import BertWordPiece
from megatron.data.tokenizer_identity import data_identity_path, write_data_identity
from megatron.data.vocab_builder import train_vocab, write_vocab
from megatron.data.workers import usable_cpus
from megatron.locks import folder_locked

DEFAULT_VOCAB_SIZE = 8192  # ample for a ~2 MB corpus; keeps the default model's embedding small
EMBEDDED_VOCAB = Path(__file__).with_name("default_vocab.txt")  # DEFAULT_VOCAB_SIZE tokens


def default_vocab_file(directory) -> Path:
    """The vocab a run without --data-path and a tokenizer of its own trains with: the one built into
    `directory` (its --default-data-dir), else the embedded one that build will copy."""
    built = Path(directory) / "vocab.txt"
    return built if built.is_file() else EMBEDDED_VOCAB


@dataclass(frozen=True)
class DefaultDataset:
    corpus: Path
    vocab_file: Path
    data_prefix: str  # for --data-path


def prepare_default_dataset(directory, workers: int | None = None, max_bytes: int = 4 * 2**20,
                            packages=DEFAULT_PACKAGES, vocab_size: int = DEFAULT_VOCAB_SIZE) -> DefaultDataset:
    """The default dataset in `directory`, built there where a step's output is missing. Two processes at once
    (two benchmarks, two runs on a fresh clone) build one after the other (an flock of the folder): the second
    finds the first's outputs and reuses them; both building crashed on each other's temporary files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    corpus, vocab_file = directory / "sample_corpus.json", directory / "vocab.txt"
    options = PreprocessOptions(input=str(corpus), output_prefix=str(directory / "sample"), vocab_file=str(vocab_file),
                                split_sentences=True, workers=workers or min(2, usable_cpus()),
                                log_interval=0)
    data_prefix = f"{options.output_prefix}_text_sentence"
    if not (corpus.is_file() and vocab_file.is_file() and dataset_exists(data_prefix)
            and data_identity_path(data_prefix).is_file()):
        with folder_locked(directory, f"waiting for another process building the default dataset in {directory}"):
            if not corpus.is_file():
                write_corpus(corpus, max_bytes, packages)
            if not vocab_file.is_file():
                write_vocab(EMBEDDED_VOCAB.read_text(encoding="utf-8").splitlines()
                            if vocab_size == DEFAULT_VOCAB_SIZE
                            else train_vocab(corpus, lower_case=True, vocab_size=vocab_size), vocab_file)
            if not dataset_exists(data_prefix):
                preprocess(options)
            elif not data_identity_path(data_prefix).is_file():  # built before preprocessing recorded its vocab
                write_data_identity(BertWordPiece(vocab_file), data_prefix)
    return DefaultDataset(corpus, vocab_file, data_prefix)
