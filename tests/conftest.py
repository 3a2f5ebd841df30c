"""Test-wide settings, inherited by the ranks the tests spawn."""
import os
import sys
from pathlib import Path

# tools/this_repo.py, which every tool imports first, for the tests that load a tool by its path
sys.path.append(str(Path(__file__).resolve().parents[1] / "tools"))

# DeepSpeed JIT-builds its CPU shared-memory op on first start; build it once per checkout.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(__file__).resolve().parents[1] / ".cache" / "torch_extensions"))
