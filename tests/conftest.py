"""Test-wide settings, inherited by the ranks the tests spawn."""
import os
from pathlib import Path

# DeepSpeed JIT-builds its CPU shared-memory op on first start; build it once per checkout.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(__file__).resolve().parents[1] / ".cache" / "torch_extensions"))
