"""Writes one benchmark's section of benchmarks/RESULTS.md, leaving the other sections alone."""
import platform
import re
import sys
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def machine() -> str:
    cores = len(__import__("os").sched_getaffinity(0))
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{platform.processor() or platform.machine()}, {cores} cores, {gpu}, torch {torch.__version__}"


def write_section(heading: str, body: str) -> None:
    """Replaces the `## heading` section (up to the next `## `) or appends it."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    section = f"## {heading}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: section + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + section
    RESULTS.write_text(text)


if __name__ == "__main__":  # python benchmarks/results.py HEADING FILE: FILE's text as that section
    write_section(sys.argv[1], Path(sys.argv[2]).read_text())
