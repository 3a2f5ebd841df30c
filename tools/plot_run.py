"""Turns a run's metrics.jsonl (written by pretrain_bert.py under --log-dir) into a PNG of
loss and throughput curves.

    python tools/plot_run.py runs/bert/metrics.jsonl [-o runs/bert/loss.png]
    python tools/plot_run.py runs/bert              (the --log-dir: its metrics.jsonl)
    python tools/plot_run.py runs/bert -o plots/    (a folder: plots/loss.png)

A missing or malformed log ends with one line naming the file and line, exit code 2.
"""
import argparse
import os
import sys
from pathlib import Path

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import ConfigError, OneLineParser, run_tool, start_up_stops_in_one_line

with start_up_stops_in_one_line("plot_run.py"):  # Ctrl-C during the second of imports (torch): one line
    from megatron.paths import output_file_problem
    from megatron.run_log import plot_metrics


def main(argv=None) -> int:
    parser = OneLineParser(prog="plot_run.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", type=Path, help="metrics.jsonl of a run, or its --log-dir")
    parser.add_argument("-o", "--output", help="PNG path, or a folder (an existing one, or a name ending in /) for "
                        "its loss.png (default: loss.png beside the metrics)")
    args = parser.parse_args(argv)
    metrics = args.metrics / "metrics.jsonl" if args.metrics.is_dir() else args.metrics  # as --log-dir names it
    print(plot_metrics(metrics, png_path(args.output, metrics)))
    return 0


def png_path(output: str | None, metrics: Path) -> Path:
    """Where the plot goes: -o as given, loss.png in -o when that is a folder (as a folder given for the
    metrics stands for its metrics.jsonl; `-o plots` wrote plots.png beside it, `-o .` failed), and
    loss.png beside the metrics without -o. A name ending in / is a folder, made if missing."""
    if output is None:
        return metrics.with_name("loss.png")
    if not output:
        raise ConfigError("-o '' is empty", "pass a PNG file name, or a folder for its loss.png")
    png = Path(output) / "loss.png" if os.path.isdir(output) or output.endswith(os.sep) else Path(output)
    if problem := output_file_problem("-o", str(png), "pass -o a PNG path in a folder this user can write",
                                      folder_made=True):
        raise ConfigError(*problem)  # a file where a folder goes was "cannot use ... (File exists)"
    return png


if __name__ == "__main__":
    sys.exit(run_tool("plot_run.py", main))
