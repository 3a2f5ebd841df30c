"""What every tool and benchmark calls before importing `megatron`: put_first puts the repository
that holds the script first on sys.path, ahead of an installed `megatron` (`pip install -e .` of
another checkout sharing the virtual environment), so that a tool and the trainer beside it are one
version; then `~` in the script's arguments is expanded (megatron.paths.expand_home: bash leaves
`--save=~/ck` as typed). benchmarks/this_repo.py is a link to this file."""
import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])


def put_first() -> None:
    if ROOT in sys.path:
        sys.path.remove(ROOT)
    sys.path.insert(0, ROOT)
    from megatron.paths import expand_home

    sys.argv[1:] = expand_home(sys.argv[1:])
