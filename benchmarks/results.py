"""Shared by the benchmarks: the argparse type of their counts, lengths and times, and the writer of
one benchmark's section of benchmarks/RESULTS.md (leaving the other sections alone).

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
from megatron.errors import OneLineParser  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def positive(kind=int):
    """An argparse type for a count, length or time that must be above 0 (int or float): 0 or less
    is refused on the command line before anything is measured, not as a traceback minutes later."""
    def parse(text: str):
        value = kind(text)  # not a number: argparse's own "invalid int value"
        if not 0 < value < math.inf:  # nan fails too
            raise argparse.ArgumentTypeError(
                f"{text} must be above 0; give {'1 or more' if kind is int else 'a number above 0'}")
        return value
    parse.__name__ = kind.__name__
    return parse


def machine() -> str:
    import torch  # here, so that the command line of a benchmark is checked without loading torch

    cores = len(os.sched_getaffinity(0))
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{platform.processor() or platform.machine()}, {cores} cores, {gpu}, torch {torch.__version__}"


def write_section(heading: str, body: str) -> None:
    """Replaces the `## heading` section (up to the next `## `) or appends it."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    section = f"## {heading}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: section + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + section
    RESULTS.write_text(text)


def main(argv=None) -> int:
    parser = OneLineParser(prog="results.py", description="Writes FILE's text as the `## HEADING` "
                                     "section of benchmarks/RESULTS.md, leaving the other sections alone.")
    parser.add_argument("heading", help="the section's title (without `## `)")
    parser.add_argument("file", type=Path, help="the section's text (markdown)")
    args = parser.parse_args(argv)
    write_section(args.heading, args.file.read_text())
    return 0


if __name__ == "__main__":
    from megatron.errors import run_tool

    sys.exit(run_tool("results.py", main))
