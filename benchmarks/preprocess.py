"""Preprocessing throughput: tools/preprocess_data.py against a pure-Python WordPiece baseline.

On the embedded sample corpus (tools/make_sample_corpus.py, vocab from tools/build_vocab.py),
one run measures, side by side:
* ours: `preprocess()` end to end (JSON, optional Punkt splitting, HF Rust WordPiece, mmap
  writing) at 1 and 2 workers, with and without --split-sentences;
* baseline: the same lines parsed and tokenized in one process by a pure-Python BERT
  WordPiece (basic tokenizer + greedy longest match, the algorithm of Megatron's own
  `bert_tokenization.py`), with the same Punkt splitting where ours splits. It writes nothing,
  so the ratio is conservative. The baseline's ids are checked equal to ours first.
* corpora as published: the same text as `.jsonl.gz`, `.jsonl.zst`, one Parquet file and a folder
  of 4 Parquet shards, preprocessed by ours beside the loose JSON (throughput ratios to it; target
  for Parquet >= 0.9). Their outputs are checked byte-equal to the loose JSON's.

With --write, writes the "Preprocessing throughput" section of benchmarks/RESULTS.md.
Run: .venv/bin/python benchmarks/preprocess.py [--repeats 3] [--write]
"""
import argparse
import gzip
import json
import os
import resource
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results import BenchmarkParser, machine, positive, run_benchmark, write_section  # noqa: E402

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
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


def baseline(corpus: Path, vocab: Path, split: bool) -> tuple[float, int, int, float]:
    """(seconds, documents, bytes, CPU seconds) for parsing and tokenizing every line in one process."""
    tokenizer = PythonWordPiece(vocab)
    splitter = sentence_splitter() if split else (lambda text: [text])
    documents = size = 0
    start, cpu = time.perf_counter(), time.process_time()
    with open(corpus, "rb") as lines:
        for raw in lines:
            [tokenizer.tokenize(sentence) for sentence in splitter(json.loads(raw)["text"])]
            documents += 1
            size += len(raw)
    return time.perf_counter() - start, documents, size, time.process_time() - cpu


def check_baseline_matches(corpus: Path, vocab: Path, lines: int = 200):
    ours, theirs = build_tokenizer("BertWordPieceLowerCase", vocab), PythonWordPiece(vocab)
    with open(corpus) as f:
        texts = [json.loads(next(f))["text"] for _ in range(lines)]
    mismatched = sum(ours.tokenize(t) != theirs.tokenize(t) for t in texts)
    if mismatched:
        raise SystemExit(f"baseline tokenizer disagrees with HF on {mismatched}/{lines} documents")


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the tokenizing workers, once joined)."""
    return sum(usage.ru_utime + usage.ru_stime for usage in (resource.getrusage(resource.RUSAGE_SELF),
                                                             resource.getrusage(resource.RUSAGE_CHILDREN)))


def ours(corpus: Path, vocab: Path, out: Path, workers: int, split: bool) -> tuple[float, int, int, float]:
    """(seconds, documents, bytes, CPU seconds of all its processes): CPU time hardly moves with
    the machine's load, wall time does."""
    cpu = cpu_seconds()
    report = preprocess(PreprocessOptions(input=str(corpus), output_prefix=str(out / f"{corpus.name}_w{workers}_{split}"),
                                          vocab_file=str(vocab), split_sentences=split, workers=workers, log_interval=0))
    return report.seconds, report.documents, report.bytes_read, cpu_seconds() - cpu


def published_formats(corpus: Path) -> dict[str, Path]:
    """The loose-JSON corpus written as the formats corpora are published in: format name -> --input."""
    import pyarrow.json
    import pyarrow.parquet
    import zstandard

    raw = corpus.read_bytes()
    formats = {"loose JSON": corpus, ".jsonl.gz": corpus.with_suffix(".jsonl.gz"),
               ".jsonl.zst": corpus.with_suffix(".jsonl.zst"), "Parquet": corpus.with_suffix(".parquet"),
               "Parquet, 4 shards (folder)": corpus.parent / "shards"}
    formats[".jsonl.gz"].write_bytes(gzip.compress(raw, compresslevel=6))  # the gzip tool's default level
    formats[".jsonl.zst"].write_bytes(zstandard.ZstdCompressor().compress(raw))
    table = pyarrow.json.read_json(corpus)
    pyarrow.parquet.write_table(table, formats["Parquet"])  # pyarrow's defaults: snappy, as most published sets
    formats["Parquet, 4 shards (folder)"].mkdir()
    step = -(-len(table) // 4)
    for shard in range(4):
        pyarrow.parquet.write_table(table.slice(shard * step, step), formats["Parquet, 4 shards (folder)"] /
                                    f"train-{shard:05d}-of-00004.parquet")
    return formats


def check_same_outputs(out: Path, formats: dict, workers: int, split: bool) -> None:
    level = "sentence" if split else "document"
    expected = [(out / f"{formats['loose JSON'].name}_w{workers}_{split}_text_{level}{suffix}").read_bytes()
                for suffix in (".bin", ".idx")]
    for name, path in formats.items():
        found = [(out / f"{path.name}_w{workers}_{split}_text_{level}{suffix}").read_bytes()
                 for suffix in (".bin", ".idx")]
        if found != expected:
            raise SystemExit(f"{name} gave other .bin/.idx bytes than loose JSON ({workers} workers, split {split})")


FORMAT_SETTINGS = ((1, False), (2, True))  # (workers, split sentences): reading shows most / the usual BERT run


def format_table(by_format: dict, sizes: dict, repeats: int) -> str:
    """Markdown rows: format, settings, file size, docs/s, seconds, throughput ratio to loose JSON."""
    table = ["| input | file size (MB) | workers | split sentences | docs/s | seconds | vs loose JSON | CPU s "
             "(all processes) | CPU: loose JSON / this |", "|---|---|---|---|---|---|---|---|---|"]
    parquet = []
    for workers, split in FORMAT_SETTINGS:
        base = by_format[("loose JSON", workers, split)]
        for name in sizes:
            result = by_format[(name, workers, split)]
            seconds, documents, _, _ = min(result, key=lambda r: r[0])
            ratio = min(base)[0] / seconds
            cpu = min(r[3] for r in result)
            pairs = sorted(b[0] / r[0] for b, r in zip(base, result))
            spread = f" [{pairs[0]:.2f}-{pairs[-1]:.2f}]" if repeats > 1 else ""
            table.append(f"| {name} | {sizes[name] / 2**20:.2f} | {workers} | {'yes' if split else 'no'} | "
                         f"{documents / seconds:,.0f} | {seconds:.2f} | {ratio:.2f}{spread} | {cpu:.2f} | "
                         f"{min(r[3] for r in base) / cpu:.2f} |")
            if name == "Parquet":
                parquet.append(f"{workers} worker{'s' if workers > 1 else ''}, {'split' if split else 'documents'}: "
                               f"{ratio:.2f}")
    return "\n".join(table) + f"\n\nParquet / loose JSON throughput (target >= 0.90): {'; '.join(parquet)}."


def parse_args(argv=None) -> argparse.Namespace:
    parser = BenchmarkParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=positive(int), default=3, help="best of this many runs per row")
    return parser.parse_args(argv)


def main():
    args = parse_args()
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
        formats = published_formats(corpus)
        sizes = {name: sum(f.stat().st_size for f in ([path] if path.is_file() else path.iterdir()))
                 for name, path in formats.items()}
        runs = [("pure-Python WordPiece (baseline)", 1, split, lambda split=split: baseline(corpus, vocab, split))
                for split in (False, True)]
        for split in (False, True):
            for workers in (1, 2):  # the other formats right after loose JSON at their settings: neighbours in time
                runs += [("preprocess_data.py (HF WordPiece)" if name == "loose JSON" else f"format {name}", workers,
                          split, lambda path=path, workers=workers, split=split: ours(path, vocab, tmp, workers, split))
                         for name, path in formats.items()
                         if name == "loose JSON" or (workers, split) in FORMAT_SETTINGS]
        results = [[] for _ in runs]
        for _ in range(args.repeats):  # round robin, so a busy moment on the machine hits every row alike
            for result, (*_, measure) in zip(results, runs):
                result.append(measure())
        for workers, split in FORMAT_SETTINGS:
            check_same_outputs(tmp, formats, workers, split)
        by_format = {(name[len("format "):], workers, split): result for (name, workers, split, _), result
                     in zip(runs, results) if name.startswith("format ")}
        by_format.update({("loose JSON", workers, split): result for (name, workers, split, _), result
                          in zip(runs, results) if name.startswith("preprocess")})
        rows = [(name, workers, split, min(result, key=lambda r: r[0]))
                for (name, workers, split, _), result in zip(runs, results) if not name.startswith("format ")]
    rows.sort(key=lambda row: (row[2], row[1], row[0].startswith("preprocess")))
    base = {row[2]: row[3][0] for row in rows if row[0].startswith("pure")}
    ratios = [(workers, split, base[split] / seconds) for name, workers, split, (seconds, *_) in rows
              if name.startswith("preprocess")]
    mb = rows[0][3][2] / 2**20
    table = ["| pipeline | workers | split sentences | docs/s | MB/s | seconds |", "|---|---|---|---|---|---|"]
    for name, workers, split, (seconds, documents, size, _) in rows:
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

Corpora as published: the same text as `.jsonl.gz`, `.jsonl.zst`, Parquet (pyarrow's defaults:
snappy) and 4 Parquet shards in a folder, preprocessed by ours in the same round robin as the rows
above; every format's `.bin`/`.idx` checked byte-equal to the loose JSON's. Throughput ratio to
loose JSON = its best time / the format's best time (per-repeat ratios of neighbouring runs in brackets;
target for Parquet >= 0.90); CPU s = the least CPU time of the main process and its workers over the
repeats, which the load of other work moves far less than wall time.

{format_table(by_format, sizes, args.repeats)}
"""
    write_section("Preprocessing throughput", body)


if __name__ == "__main__":
    run_benchmark(main)
