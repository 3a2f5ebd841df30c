"""Writes the embedded sample corpus: loose JSON of English prose from the Python installation
(language reference topics and module docstrings), deterministic, no download. See
megatron/data/sample_corpus.py for what is kept.
"""
import math
import sys
from pathlib import Path

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron import paths
from megatron.data.sample_corpus import DEFAULT_PACKAGES, write_corpus
from megatron.errors import ConfigError, OneLineParser, run_tool


def main(argv=None):
    parser = OneLineParser(prog="make_sample_corpus.py", description=__doc__)
    parser.add_argument("--output", required=True, help="the .json file to write (not an existing file unless "
                        "--overwrite)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --output (never a dataset's .bin/.idx)")
    parser.add_argument("--max-mb", type=float, default=4.0, help="stop before the corpus exceeds this size "
                        "(default: %(default)s)")
    parser.add_argument("--packages", nargs="*", default=list(DEFAULT_PACKAGES),
                        help="installed packages whose docstrings follow the standard library's "
                        "(default: %(default)s)")
    args = parser.parse_args(argv)
    output = Path(args.output)
    paths.refuse_replacing(output, "a corpus", "corpus.json", args.overwrite)
    if not 0 < args.max_mb < math.inf:  # nan fails too
        raise ConfigError(f"--max-mb {args.max_mb} is not a positive finite number",
                          "pass the corpus size in MB, e.g. --max-mb 4")
    if problem := paths.file_in_the_way(f"--output {output}: its folder", str(output.parent)):
        raise ConfigError(problem, "pass a path inside a directory")
    created = paths.missing_folders(output.parent)
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        count, written = write_corpus(output, int(args.max_mb * 2**20), tuple(args.packages))
        if count == 0:  # a corpus without documents, which preprocess_data.py refuses
            output.unlink()
            raise ConfigError(f"--max-mb {args.max_mb} holds no document", "pass a larger --max-mb, e.g. --max-mb 4")
    except BaseException:  # a refusal (a package not installed, no document) leaves no folder it made
        paths.remove_empty(created)
        raise
    print(f"wrote {count} documents, {written / 2**20:.2f} MB to {output}")


if __name__ == "__main__":
    sys.exit(run_tool("make_sample_corpus.py", main))
