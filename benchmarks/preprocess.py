"""Preprocessing throughput: tools/preprocess_data.py against a pure-Python WordPiece baseline.

On the embedded sample corpus (tools/make_sample_corpus.py, vocab from tools/build_vocab.py),
one run measures, side by side:
* ours: `preprocess()` end to end (JSON, optional Punkt splitting, HF Rust WordPiece, mmap
  writing) at 1 and 2 workers, with and without --split-sentences;
* baseline: the same lines parsed and tokenized in one process by a pure-Python BERT
  WordPiece (basic tokenizer + greedy longest match, the algorithm of Megatron's own
  `bert_tokenization.py`), with the same Punkt splitting where ours splits. It writes nothing,
  so the ratio is conservative. The baseline's ids are checked equal to ours first.

Writes the "Preprocessing throughput" section of benchmarks/RESULTS.md.
Run: .venv/bin/python benchmarks/preprocess.py [--repeats 3]
"""
import argparse
import json
import os
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results import machine, write_section  # noqa: E402

from megatron.data.preprocess import PreprocessOptions, preprocess  # noqa: E402
from megatron.data.sample_corpus import write_corpus  # noqa: E402
from megatron.data.sentences import sentence_splitter  # noqa: E402
from megatron.data.tokenizer import build_tokenizer, read_vocab  # noqa: E402
from megatron.data.vocab_builder import train_vocab, write_vocab  # noqa: E402


class PythonWordPiece:
    """Lower-case BERT tokenization in plain Python, pass by pass as the reference BERT
    tokenizer (and so Megatron's `bert_tokenization.py`) does it: clean control characters,
    space out CJK characters, split on whitespace, lower-case and strip accents, split off
    punctuation, then greedy longest-match-first WordPiece on each word's characters."""

    def __init__(self, vocab_file):
        self.vocab = read_vocab(vocab_file)
        self.unk = self.vocab["[UNK]"]

    # Character classes as the reference defines them, one call per character as it does.
    @staticmethod
    def _is_whitespace(ch):
        return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"

    @staticmethod
    def _is_control(ch):
        return ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")

    @staticmethod
    def _is_cjk(code):
        return (0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0x20000 <= code <= 0x2A6DF
                or 0x2A700 <= code <= 0x2B73F or 0x2B740 <= code <= 0x2B81F or 0x2B820 <= code <= 0x2CEAF
                or 0xF900 <= code <= 0xFAFF or 0x2F800 <= code <= 0x2FA1F)

    @staticmethod
    def _is_punctuation(ch):
        code = ord(ch)
        return 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126 \
            or unicodedata.category(ch).startswith("P")

    def _clean(self, text):
        return "".join(" " if self._is_whitespace(ch) else ch for ch in text
                       if ord(ch) not in (0, 0xFFFD) and not self._is_control(ch))

    def _space_cjk(self, text):
        return "".join(f" {ch} " if self._is_cjk(ord(ch)) else ch for ch in text)

    @staticmethod
    def _strip_accents(token):
        return "".join(ch for ch in unicodedata.normalize("NFD", token) if unicodedata.category(ch) != "Mn")

    def _split_punctuation(self, token):
        pieces, start_new = [], True
        for ch in token:
            if self._is_punctuation(ch):
                pieces.append([ch])
                start_new = True
            else:
                if start_new:
                    pieces.append([])
                start_new = False
                pieces[-1].append(ch)
        return ["".join(piece) for piece in pieces]

    def basic_tokens(self, text):
        split = []
        for token in self._space_cjk(self._clean(text)).split():
            split.extend(self._split_punctuation(self._strip_accents(token.lower())))
        return " ".join(split).split()

    def wordpieces(self, word):
        chars = list(word)
        if len(chars) > 100:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(chars):
            end, found = len(chars), None
            while start < end:
                piece = "".join(chars[start:end])
                if start > 0:
                    piece = "##" + piece
                if piece in self.vocab:
                    found = piece
                    break
                end -= 1
            if found is None:
                return ["[UNK]"]
            pieces.append(found)
            start = end
        return pieces

    def tokenize(self, text):
        tokens = [piece for word in self.basic_tokens(text) for piece in self.wordpieces(word)]
        return [self.vocab[token] for token in tokens]


def baseline(corpus: Path, vocab: Path, split: bool) -> tuple[float, int, int]:
    """(seconds, documents, bytes) for parsing and tokenizing every line in one process."""
    tokenizer = PythonWordPiece(vocab)
    splitter = sentence_splitter() if split else (lambda text: [text])
    documents = size = 0
    start = time.perf_counter()
    with open(corpus, "rb") as lines:
        for raw in lines:
            [tokenizer.tokenize(sentence) for sentence in splitter(json.loads(raw)["text"])]
            documents += 1
            size += len(raw)
    return time.perf_counter() - start, documents, size


def check_baseline_matches(corpus: Path, vocab: Path, lines: int = 200):
    ours, theirs = build_tokenizer("BertWordPieceLowerCase", vocab), PythonWordPiece(vocab)
    with open(corpus) as f:
        texts = [json.loads(next(f))["text"] for _ in range(lines)]
    mismatched = sum(ours.tokenize(t) != theirs.tokenize(t) for t in texts)
    if mismatched:
        raise SystemExit(f"baseline tokenizer disagrees with HF on {mismatched}/{lines} documents")


def ours(corpus: Path, vocab: Path, out: Path, workers: int, split: bool) -> tuple[float, int, int]:
    report = preprocess(PreprocessOptions(input=str(corpus), output_prefix=str(out / f"w{workers}_{split}"),
                                          vocab_file=str(vocab), split_sentences=split, workers=workers, log_interval=0))
    return report.seconds, report.documents, report.bytes_read


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs per row")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus, vocab = tmp / "corpus.json", tmp / "vocab.txt"
        start = time.perf_counter()
        write_corpus(corpus, 4 * 2**20)
        corpus_s = time.perf_counter() - start
        write_vocab(train_vocab(corpus, lower_case=True, vocab_size=30522), vocab)
        vocab_s = time.perf_counter() - start - corpus_s
        check_baseline_matches(corpus, vocab)
        runs = [("pure-Python WordPiece (baseline)", 1, split, lambda split=split: baseline(corpus, vocab, split))
                for split in (False, True)]
        runs += [("preprocess_data.py (HF WordPiece)", workers, split,
                  lambda workers=workers, split=split: ours(corpus, vocab, tmp, workers, split))
                 for split in (False, True) for workers in (1, 2)]
        results = [[] for _ in runs]
        for _ in range(args.repeats):  # round robin, so a busy moment on the machine hits every row alike
            for result, (*_, measure) in zip(results, runs):
                result.append(measure())
        rows = [(name, workers, split, min(result, key=lambda r: r[0]))
                for (name, workers, split, _), result in zip(runs, results)]
    rows.sort(key=lambda row: (row[2], row[1], row[0].startswith("preprocess")))
    base = {row[2]: row[3][0] for row in rows if row[0].startswith("pure")}
    ratios = [(workers, split, base[split] / seconds) for name, workers, split, (seconds, _, _) in rows
              if name.startswith("preprocess")]
    mb = rows[0][3][2] / 2**20
    table = ["| pipeline | workers | split sentences | docs/s | MB/s | seconds |", "|---|---|---|---|---|---|"]
    for name, workers, split, (seconds, documents, size) in rows:
        table.append(f"| {name} | {workers} | {'yes' if split else 'no'} | {documents / seconds:,.0f} | "
                     f"{size / seconds / 2**20:.2f} | {seconds:.2f} |")
    summary = "; ".join(f"{w} worker{'s' if w > 1 else ''}, {'split' if s else 'documents'}: {r:.1f}x"
                        for w, s, r in ratios)
    body = f"""Machine: {machine()}. Command: `.venv/bin/python benchmarks/preprocess.py` (best of {args.repeats}).
Corpus: the embedded sample corpus (`tools/make_sample_corpus.py`, {rows[0][3][1]} documents, {mb:.2f} MB,
built in {corpus_s:.1f} s), vocab of `tools/build_vocab.py` (built in {vocab_s:.1f} s). Ours runs end to end
(JSON, Punkt, Rust WordPiece, mmap writing); the baseline only parses and tokenizes, in one process,
with a pure-Python BERT WordPiece whose ids equal ours. Rows are measured round robin; the machine's
1-minute load average was {load_before:.1f} before and {os.getloadavg()[0]:.1f} after (other work shares the cores,
which is why 2 workers may gain little here).

{chr(10).join(table)}

Speed-up over the baseline (target >= 3x): {summary}.
"""
    write_section("Preprocessing throughput", body)
    print(body)


if __name__ == "__main__":
    main()
