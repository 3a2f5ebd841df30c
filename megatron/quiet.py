"""DeepSpeed's noise that says nothing to a user of this trainer, silenced before DeepSpeed loads.

- "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
  (logged on every import of DeepSpeed on a machine without CUDA, --help included): on such a
  machine the accelerator is named explicitly (DS_ACCELERATOR=cpu), which is what DeepSpeed
  then picks anyway. A DS_ACCELERATOR the user set is kept.
- torch's FutureWarning that DeepSpeed 0.19.8 calls `all_gather_into_tensor` /
  `_all_gather_base` / `_reduce_scatter_base` (deprecated names it still uses on every ZeRO
  step): filtered by message, other FutureWarnings still show.
"""
import os
import warnings

DEPRECATED_COLLECTIVES = (r"`torch\.distributed\.(all_gather_into_tensor|_all_gather_base|_reduce_scatter_base|"
                          r"reduce_scatter_tensor)` (is|will be) (deprecated|a private function)")


def quiet_deepspeed() -> None:
    """Call before the first `import deepspeed` of a process (imports torch to look for CUDA)."""
    if "DS_ACCELERATOR" not in os.environ:
        import torch

        if not (torch.cuda.device_count() > 0 and torch.cuda.is_available()):
            os.environ["DS_ACCELERATOR"] = "cpu"
    warnings.filterwarnings("ignore", message=DEPRECATED_COLLECTIVES, category=FutureWarning)
