"""`python -m tools.fill_mask ...` from the repository root: a tool imports this_repo from its own folder,
which `python tools/fill_mask.py` puts on sys.path and `-m` does not (ModuleNotFoundError: No module named
'this_repo'). Importing the package puts the folder there, last: it shadows nothing."""
import sys
from pathlib import Path

FOLDER = str(Path(__file__).resolve().parent)
if FOLDER not in sys.path:
    sys.path.append(FOLDER)
