"""Shared by the benchmarks: their parser (one-line errors and --write), the argparse types of their
counts, lengths, times and fractions, and the writer of one benchmark's section of
benchmarks/RESULTS.md (leaving the other sections alone) and of its plot, which only a run given
--write records: a trial with toy sizes prints its section and replaces no published figure.

    .venv/bin/python benchmarks/results.py HEADING FILE    # FILE's text as the `## HEADING` section
"""
import argparse
import math
import os
import platform
import re
import sys
from pathlib import Path
import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import ConfigError, OneLineParser  # noqa: E402
from megatron.locks import folder_locked  # noqa: E402
from megatron.paths import write_text_atomic  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
WRITE = False  # --write, set by BenchmarkParser: whether this run records its section, plot and log


class BenchmarkParser(OneLineParser):
    """A benchmark's command line: OneLineParser's one-line mistakes, and --write, which alone lets the
    run rewrite its section of RESULTS.md and its committed plot (write_section, save_plot)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_argument("--write", action="store_true", help="record this run: rewrite its section of "
                          "benchmarks/RESULTS.md and its plot (without it the section is printed only)")

    def parse_known_args(self, args=None, namespace=None):
        """Sets WRITE; parse_args and parse_intermixed_args come here too."""
        global WRITE
        parsed, rest = super().parse_known_args(args, namespace)
        WRITE = parsed.write
        return parsed, rest


def positive(kind=int, zero: bool = False):
    """An argparse type for a count, length or time that must be above 0 (int or float), or with `zero` at
    least 0 (a count of warm-up steps): a value below is refused on the command line before anything is
    measured, not as a traceback minutes later (or a silent run with what it means)."""
    def parse(text: str):
        value = kind(text)  # not a number: argparse's own "invalid int value"
        if zero and 0 <= value < math.inf:
            return value
        if zero:
            raise argparse.ArgumentTypeError(f"{text} is below 0; give 0 or more")
        if not 0 < value < math.inf:  # nan fails too
            raise argparse.ArgumentTypeError(
                f"{text} must be above 0; give {'1 or more' if kind is int else 'a number above 0'}")
        return value
    parse.__name__ = kind.__name__
    return parse


def fraction(text: str) -> float:
    """An argparse type for a dropout probability, in [0, 1) as the model's config wants it: refused on
    the command line, not as the config's traceback after the imports."""
    value = float(text)  # not a number: argparse's own "invalid fraction value"
    if not 0 <= value < 1:  # nan fails too
        raise argparse.ArgumentTypeError(f"{text} is outside [0, 1); give a number from 0 up to below 1")
    return value


def machine() -> str:
    import torch  # here, so that the command line of a benchmark is checked without loading torch

    cores = len(os.sched_getaffinity(0))
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{platform.processor() or platform.machine()}, {cores} cores, {gpu}, torch {torch.__version__}"


def cuda_needed() -> None:
    """A GPU benchmark on a machine without CUDA stops in one line (gpu_repeat.py launched the trainer on the CPU,
    which its question is not about)."""
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"torch {torch.__version__} sees no CUDA GPU here, and this benchmark measures one",
                          "run it on a GPU machine (benchmarks/gpu_check.sh runs it there)")


def write_section(heading: str, body: str) -> None:
    """Prints the `## heading` section; with --write also puts it into RESULTS.md (replace_section),
    else says in one line how to record it."""
    print(f"## {heading}\n\n{body.strip()}\n", flush=True)
    if WRITE:
        replace_section(heading, body)
        print(f"wrote the section '{heading}' of {RESULTS}", flush=True)
    else:
        print(f"not recorded: rerun with --write to write this section (and any plot) into {RESULTS}", flush=True)


def save_plot(fig, path: Path) -> None:
    """Saves a benchmark's plot (a committed PNG beside RESULTS.md) with --write only."""
    if WRITE:
        fig.savefig(path, dpi=100)


def save_text(path: Path, text: str) -> None:
    """Writes a benchmark's recorded data file (a committed log beside RESULTS.md) with --write only."""
    if WRITE:
        path.write_text(text)


def replace_section(heading: str, body: str) -> None:
    """Replaces the `## heading` section (up to the next `## `) or appends it: whole or not at all (a full disk
    truncated RESULTS.md), one writer at a time (two benchmarks ending together each wrote the file as they had
    read it, and one's section was lost)."""
    check_section(heading, body)
    section = f"## {heading}\n\n{body.strip()}\n"
    with folder_locked(RESULTS.parent, f"waiting for another writer of {RESULTS} to finish"):
        text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else "# Benchmark results\n"
        pattern = re.compile(rf"^## {re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
        text = pattern.sub(lambda _: section + "\n", text) if pattern.search(text) else \
            text.rstrip() + "\n\n" + section
        write_text_atomic(RESULTS, text)


def check_section(heading: str, body: str) -> None:
    """A section that the next replace would still find whole: a one-line title (`## ` and an empty or
    multi-line title made a broken heading), and a body without a `## ` line (which ended the section there, so
    a later replace kept the text after it)."""
    if not heading.strip() or heading != heading.strip() or len(heading.splitlines()) > 1:
        raise ConfigError(f"the section title {heading!r} is empty, spans lines or has blanks at its ends",
                          "give a title of one line, e.g. 'Attention memory (CPU)'")
    if heading.startswith("#"):
        raise ConfigError(f"the section title {heading!r} starts with #: it would be written as '## {heading}'",
                          f"give the title without the #s ({heading.lstrip('#').strip()!r})")
    if subheading := next((line for line in body.splitlines() if line.startswith("## ")), None):
        raise ConfigError(f"the section's text has a line {subheading!r}, a heading of a section's own level: the "
                          "section would end there", "make it a subheading (### ...) or bold text")


def run_benchmark(main) -> None:
    """A benchmark's entry point, `run_benchmark(main)`: errors.run_tool's one line and exit code, named after the
    script, for a mistake (a ConfigError, a path it cannot use) and for a stop (Ctrl-C, SIGTERM or SIGHUP: its
    clean-ups run, then exit 128 + the signal), not a traceback through the measuring code."""
    from megatron.errors import run_tool

    sys.exit(run_tool(Path(sys.argv[0]).name, main))


def main(argv=None) -> int:
    parser = OneLineParser(prog="results.py", description="Writes FILE's text as the `## HEADING` "
                                     "section of benchmarks/RESULTS.md, leaving the other sections alone.")
    parser.add_argument("heading", help="the section's title (without `## `)")
    parser.add_argument("file", type=Path, help="the section's text (markdown, UTF-8)")
    args = parser.parse_args(argv)
    raw = args.file.read_bytes()
    try:
        body = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{args.file} is not UTF-8 text (byte {raw[error.start]:#04x} at offset {error.start})",
                          "pass a Markdown file saved as UTF-8") from None
    replace_section(args.heading, body)
    return 0


if __name__ == "__main__":
    run_benchmark(main)
