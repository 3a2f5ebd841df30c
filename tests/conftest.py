"""Test-wide settings, inherited by the ranks the tests spawn."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# tools/this_repo.py, which every tool imports first, for the tests that load a tool by its path
sys.path.append(str(Path(__file__).resolve().parents[1] / "tools"))

# DeepSpeed JIT-builds its CPU shared-memory op on first start; build it once per checkout.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(__file__).resolve().parents[1] / ".cache" / "torch_extensions"))


@pytest.fixture(scope="session", autouse=True)
def _deepspeed_cpu_op_built():
    """The shared-memory op built once, before any test's ranks start under their timeout: built by the first
    test's ranks (30-90 s on 2 idle cores, minutes under load) it ran past that test's timeout on a fresh
    clone, and the killed build's lock then held every later multi-rank test until its own timeout. A CUDA
    machine's DeepSpeed has no such op to build (build_shm_op returns None there)."""
    from megatron.parallel.device import SHM_OP

    if not (Path(os.environ["TORCH_EXTENSIONS_DIR"]) / SHM_OP / f"{SHM_OP}.so").is_file():
        subprocess.run([sys.executable, "-c", "from deepspeed.comm.torch import build_shm_op; build_shm_op()"],
                       check=True, stdout=subprocess.DEVNULL)


@pytest.fixture(autouse=True)
def _process_state_restored():
    """An in-process training.main() sets a world of 1's launcher variables (launch_check.launch_environment),
    which monkeypatch does not undo when the test only deleted them: the next test's main() then met RANK
    without MASTER_ADDR, a partial launcher environment. A rank's exit path ignores the stop signals, which
    every later subprocess then inherited (a script's Ctrl-C trap never ran). Each test starts with the
    environment and the stop signals' handlers as they were."""
    saved, handlers = dict(os.environ), {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    yield
    for name in set(os.environ) - set(saved):
        del os.environ[name]
    os.environ.update(saved)
    for signum, handler in handlers.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> str:
    """The default corpus and vocab preprocessed once for the whole run (the tests read it, never change it):
    built per module it cost about 8 s in each of five modules."""
    from megatron.data.default_dataset import prepare_default_dataset

    directory = tmp_path_factory.mktemp("default_data")
    prepare_default_dataset(directory)
    return str(directory)

