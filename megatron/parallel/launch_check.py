"""How this process was launched, checked before any rendezvous: a run started by hand becomes a
world of 1, a partial launcher environment (or MPI without mpi4py, srun tasks without env://) is one
line saying how to launch. Apart from launch_env, which the errors module itself imports (no cycle)."""
import importlib.util
import math
import os
import re

from megatron import paths
from megatron.errors import ConfigError, either


# the env:// rendezvous variables every rank of a launch gets (deepspeed, torchrun, the AzureML job)
RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# launchers DeepSpeed discovers without them: MPI (through mpi4py), AzureML, SageMaker, DLTS
MPI_LAUNCHERS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")
OTHER_LAUNCHERS = ("AZUREML_EXPERIMENT_ID", "SM_TRAINING_ENV", "DLTS_JOB_ID")
LOCAL_HOST = "127.0.0.1"  # the rendezvous of a world of 1


def how_to_launch(processes="N") -> str:
    """The launcher command line for `processes` ranks on one node, as the trainer's lines name it."""
    return (f"deepspeed --num_gpus {processes} {paths.in_repository('pretrain_bert.py')} ... "
            f"(or torchrun --nproc_per_node {processes})")


HOW_TO_LAUNCH = how_to_launch()


class LayoutError(ConfigError):
    """A pipeline x sequence-parallel layout that does not divide the world size. The fix names both ways out,
    as `launch a multiple of sp*pp processes or change the sizes` named neither: the launch of `processes`
    (pipeline x sequence) ranks, and `sizes`, the size flags cut to the largest divisors of this world (hybrid
    attention's --ulysses-size too, where `ulysses` would no longer divide the cut SP size). A tool that
    launches otherwise words its own launch from the two and `fitting` (each cut size by its flag):
    azureml/submit.py in its options, the launch scripts in their arguments (check_script_layout)."""

    def __init__(self, problem: str, world_size: int, pipeline: int, sequence: int, ulysses: int | None = None):
        fitting_pipeline = math.gcd(pipeline, world_size)
        room = world_size // fitting_pipeline  # the ranks of a pipeline stage, which the SP size must divide
        fitting_sequence = math.gcd(sequence, room)
        self.fitting = {"--pipeline-model-parallel-size": fitting_pipeline} if fitting_pipeline != pipeline else {}
        cut = ulysses and fitting_sequence > 1 and fitting_sequence % ulysses  # at SP 1 hybrid is plain attention
        if fitting_sequence != sequence:  # every size that fits ("1" alone read as the only one), unless the largest
            # needs hybrid's Ulysses degree cut: that size, and the degree
            self.fitting["--sequence-parallel-size"] = fitting_sequence if cut else either([
                size for size in range(1, room + 1) if room % size == 0 and (size == 1 or size % (ulysses or 1) == 0)])
        if cut:
            self.fitting["--ulysses-size"] = math.gcd(ulysses, fitting_sequence)
        self.sizes = " ".join(f"{flag} {size}" for flag, size in self.fitting.items())
        self.processes, self.world_size = pipeline * sequence, world_size
        super().__init__(problem, f"launch {self.processes} processes (or a multiple) with "
                                  f"{how_to_launch(self.processes)}, or pass {self.sizes} to run on {world_size} "
                                  f"process{'es' if world_size > 1 else ''}")


# the launch scripts' positional arguments (examples_deepspeed/bert_common.sh) for the flags, JSON keys and model
# fields they set: a fix naming those names a flag the script refuses after its arguments, or a key of the JSON it
# writes itself (its JSON has no hybrid)
SCRIPT_ARGUMENTS = {
    **dict.fromkeys(("--pipeline-model-parallel-size", "pipeline.stages"), "PP"),
    **dict.fromkeys(("--sequence-parallel-size", "sequence_parallel.size"), "SP"),
    **dict.fromkeys(("--seq-length", "seq_length", "--max-position-embeddings", "max_position_embeddings"), "SEQ_LEN"),
    **dict.fromkeys(("--micro-batch-size", "train_micro_batch_size_per_gpu"), "MICRO_BATCH"),
    **dict.fromkeys(("--global-batch-size", "train_batch_size"), "GLOBAL_BATCH"),
    **dict.fromkeys(("--num-layers", "num_layers"), "LAYERS"),
    **dict.fromkeys(("--hidden-size", "hidden_size"), "HIDDEN"),
    **dict.fromkeys(("--num-attention-heads", "num_attention_heads"), "HEADS"),
    **dict.fromkeys(("--linformer-k", "sequence_parallel.linformer.k", "linformer_k"), "LINFORMER_K"),
    **dict.fromkeys(("--block-size", "sequence_parallel.bigbird.block_size", "bigbird_block_size"), "BLOCK_SIZE")}
_SCRIPT_ARGUMENT = re.compile(r"(?<![\w.-])(%s)(?![\w-])" % "|".join(
    map(re.escape, sorted(SCRIPT_ARGUMENTS, key=len, reverse=True))))  # whole names, the longest first


def in_script_terms(text: str) -> str:
    """`text` (an error's problem or fix) with each flag, JSON key and model field that a launch script's positional
    argument sets named as that argument ('pass --num-layers 2 or more' -> 'pass LAYERS 2 or more')."""
    return _SCRIPT_ARGUMENT.sub(lambda match: SCRIPT_ARGUMENTS[match.group(1)], text)


def check_script_layout(nodes: int, procs: int, pipeline: int, sequence: int) -> None:
    """A launch script's layout, before it writes its JSON: PP x SP must divide its world of NUM_NODES x PROCS
    ranks. The fix names the script's arguments, which set deepspeed's --num_gpus and the size flags (after the
    positional arguments the script refuses both), as azureml/submit.py names its options."""
    from megatron.parallel.state import resolve_dims  # torch, which the script's trainer-flag check imported

    try:
        resolve_dims(nodes * procs, pipeline, sequence)
    except LayoutError as error:
        ranks = "NUM_NODES x PROCS" if nodes > 1 else "PROCS"
        world = f"NUM_NODES {nodes} x PROCS {procs}" if nodes > 1 else f"PROCS {procs}"
        sizes = " and ".join(f"{SCRIPT_ARGUMENTS[flag]} to {size}" for flag, size in error.fitting.items())
        raise ConfigError(f"PP {pipeline} x SP {sequence} does not divide the world size {error.world_size} ({world})",
                          f"set {ranks} to a multiple of {error.processes}, or change {sizes} to run on "
                          f"{error.world_size} ranks") from None


def check_script_launch(nodes: int, procs: int, pipeline: int, sequence: int, master: str) -> None:
    """A launch script's checks before it writes its JSON: the layout (check_script_layout), then, on the node that
    hosts rank 0 (`master` HOST:PORT; '' on another node, or in a dry run), a port another program listens on."""
    from megatron.parallel.master_address import check_launch_port

    check_script_layout(nodes, procs, pipeline, sequence)
    if master:
        host, port = master.rsplit(":", 1)
        check_launch_port(host, int(port))


def launch_environment() -> str | None:
    """`python pretrain_bert.py ...` without a launcher runs as one process: with none of RANK,
    WORLD_SIZE, LOCAL_RANK set (and no MPI or cluster launcher of DeepSpeed's), the env://
    rendezvous of a world of 1 is set (MASTER_ADDR 127.0.0.1, a free MASTER_PORT unless given);
    returns the line that says so. A MASTER_ADDR left in the environment (a cluster profile's, an old
    job's) is replaced, with a note: a world of 1 has no one to meet elsewhere, and torch would retry
    that address until --rendezvous-timeout. Without it DeepSpeed would look for MPI and fail with
    `No module named 'mpi4py'`. A partial launcher environment, or MPI without mpi4py, is one line
    saying how to launch."""
    present = [name for name in RENDEZVOUS if name in os.environ]
    if len(present) == len(RENDEZVOUS) or any(name in os.environ for name in OTHER_LAUNCHERS):
        return None
    mpi = [name for name in MPI_LAUNCHERS if name in os.environ]
    if mpi:
        if importlib.util.find_spec("mpi4py") is None:
            raise ConfigError(f"started by an MPI launcher ({mpi[0]} is set) without the env:// variables "
                              f"{', '.join(name for name in RENDEZVOUS if name not in present)}, and DeepSpeed needs "
                              "mpi4py to find the ranks", f"pip install mpi4py, or launch with {HOW_TO_LAUNCH}")
        return None
    tasks = os.environ.get("SLURM_STEP_NUM_TASKS", "1")
    if tasks.isdigit() and int(tasks) > 1:  # `srun -n 4 python pretrain_bert.py`: 4 runs of world size 1
        raise ConfigError(f"started as one of {tasks} srun tasks without the env:// variables "
                          f"{', '.join(name for name in RENDEZVOUS if name not in present)}: each would train alone",
                          f"launch with {HOW_TO_LAUNCH} (one srun task per node), or export them per task")
    per_rank = [name for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if name in os.environ]
    if per_rank:
        missing = [name for name in RENDEZVOUS if name not in present]
        verbs = ("is" if len(per_rank) == 1 else "are", "is" if len(missing) == 1 else "are")
        raise ConfigError(f"{', '.join(per_rank)} {verbs[0]} set but {', '.join(missing)} {verbs[1]} not: a partial "
                          "launcher environment",
                          f"launch with {HOW_TO_LAUNCH}, or unset {', '.join(present)} to run one process")
    from megatron.parallel.spawn import free_port

    stale = os.environ.get("MASTER_ADDR", LOCAL_HOST)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.update(MASTER_ADDR=LOCAL_HOST, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    line = f"no launcher: running as one process (world size 1); for several GPUs or nodes launch with {HOW_TO_LAUNCH}"
    if stale != LOCAL_HOST:
        line += (f"\nnote: MASTER_ADDR={stale} from the environment is not used: a run without a launcher meets only "
                 f"itself, at {LOCAL_HOST}")
    return line
