"""Topology pipe x data x seq (seq fastest), its groups, and the mpu names DeepSpeed reads."""
import json
import os

import pytest
import torch
import torch.distributed as dist
from deepspeed.runtime.pipe.topology import ProcessTopology

from megatron.errors import ConfigError
from megatron.parallel import state
from megatron.parallel.spawn import run_on_ranks


def rank_of(dims: state.ParallelDims, pipe: int, data: int, seq: int) -> int:
    """Global rank of a coordinate by state.py's formula (seq fastest), which coord_of must invert."""
    return (pipe * dims.data + data) * dims.sequence + seq


def test_coordinates_match_deepspeed_topology():
    dims = state.ParallelDims(pipeline=2, data=3, sequence=2)
    topology = ProcessTopology(axes=["pipe", "data", "seq"], dims=[2, 3, 2])
    for rank in range(dims.world_size):
        coord = state.coord_of(dims, rank)
        assert topology.get_rank(**coord) == rank
        assert rank_of(dims, **coord) == rank
    groups = state._group_lists(dims)
    for name, axis in (("seq", "seq"), ("data", "data"), ("pipe", "pipe")):
        assert sorted(groups[name]) == sorted(topology.get_axis_comm_lists(axis)), name
    assert groups["seq"][0] == [0, 1], "sequence-parallel ranks are neighbours"
    assert groups["seq_data"] == [list(range(6)), list(range(6, 12))]


@pytest.mark.parametrize("world,kwargs,message", [
    (4, dict(pipeline=1, sequence=2, data=3), "world size 4 != pipeline 1 x data 3 x sequence 2 = 6"),
    (6, dict(pipeline=4, sequence=1), "world size 6 is not divisible by pipeline 4 x sequence 1"),
    (4, dict(pipeline=1, sequence=0), "sequence-parallel size 0 must be >= 1"),
])
def test_bad_world_sizes_are_one_line_errors(world, kwargs, message):
    with pytest.raises(ConfigError) as error:
        state.resolve_dims(world, **kwargs)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_single_process_defaults_without_initialize():
    assert state.get_sequence_parallel_world_size() == 1
    assert state.get_sequence_parallel_rank() == 0
    assert state.get_sequence_parallel_group() is None
    assert state.get_data_parallel_world_size() == 1
    assert state.get_model_parallel_world_size() == 1


def describe_rank(pipeline: int, sequence: int) -> dict:
    state.initialize(pipeline=pipeline, sequence=sequence)
    mpu = state  # the module itself is what DeepSpeed receives as mpu
    out = {"coord": state.coord_of(state.get_dims(), dist.get_rank())}
    for axis in ("sequence_parallel", "sequence_data_parallel", "data_parallel", "pipe_parallel", "model_parallel"):
        group = getattr(mpu, f"get_{axis}_group")()
        value = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(value, group=group)  # sum of the global ranks in my group
        out[axis] = (getattr(mpu, f"get_{axis}_world_size")(), getattr(mpu, f"get_{axis}_rank")(), value.item())
    return out


def test_groups_on_four_ranks():
    results = run_on_ranks(describe_rank, 4, 2, 2)  # pipe 2 x data 1 x seq 2
    for rank, r in enumerate(results):
        pipe, seq = rank // 2, rank % 2
        assert r["coord"] == {"pipe": pipe, "data": 0, "seq": seq}
        assert r["sequence_parallel"] == (2, seq, float(2 * pipe + 2 * pipe + 1))
        assert r["sequence_data_parallel"] == (2, seq, float(4 * pipe + 1))
        assert r["data_parallel"] == (1, 0, float(rank))
        assert r["pipe_parallel"] == (2, pipe, float(seq + seq + 2))
        assert r["model_parallel"] == (1, 0, float(rank))


def init_with_shared_memory() -> tuple:
    """A one-node launch's environment (LOCAL_SIZE = world size, as DeepSpeed's launcher sets it):
    whether this rank's /dev/shm buffer existed after DeepSpeed's init, and whether it still does."""
    import deepspeed

    from megatron.parallel import device

    os.environ["LOCAL_SIZE"] = os.environ["WORLD_SIZE"]
    name = (f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{os.environ['MASTER_ADDR']}_"
            f"{os.environ['MASTER_PORT']}_{dist.get_rank()}")
    seen = []
    original = deepspeed.init_distributed
    deepspeed.init_distributed = lambda **kwargs: (original(**kwargs), seen.append(os.path.exists(name)))
    try:
        device.init_distributed()
    finally:
        deepspeed.init_distributed = original
    return seen, os.path.exists(name)


def test_deepspeeds_shared_memory_buffers_leave_no_name_behind():
    """DeepSpeed's CPU all-reduce op makes a 66 MB /dev/shm file per rank of a one-node launch and
    never removes it; device.init_distributed removes the names once all ranks have mapped them."""
    assert run_on_ranks(init_with_shared_memory, 2) == [([True], False), ([True], False)]


@pytest.mark.parametrize("variables, rank, local", [
    ({"RANK": "5", "LOCAL_RANK": "1"}, 5, 1),  # deepspeed, torchrun
    # both (an env:// launcher inside an MPI job): the env:// variables win
    ({"RANK": "3", "LOCAL_RANK": "0", "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, 3, 0),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, 3, 1),  # mpirun, before init_distributed
    ({"PMI_RANK": "2", "MPI_LOCALRANKID": "2"}, 2, 2),  # MPICH / Intel MPI
    ({"LOCAL_RANK": " ", "MV2_COMM_WORLD_LOCAL_RANK": "1"}, 0, 1),  # blank is unset
    ({"LOCAL_RANK": "x"}, 0, 0),  # not a number: the launcher's own check names it, not a traceback here
    ({}, 0, 0)])  # a process started by hand
def test_rank_and_local_rank_from_any_launcher(monkeypatch, variables, rank, local):
    """Who a process is before a process group exists: a local rank that only env:// launchers give would
    make every rank of an mpirun node "local rank 0" (each clears the others' JIT build locks)."""
    from megatron.parallel.launch_env import launcher_rank, local_rank
    for name in ("RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMIX_RANK",
                 "MV2_COMM_WORLD_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert (launcher_rank(), local_rank()) == (rank, local)


def test_the_same_files_at_another_path_on_another_node_are_the_same_settings(tmp_path, monkeypatch):
    """The ranks' flags are compared with rank 0's (same_settings): the data and tokenizer were compared as path
    text, so the same files mounted at /mnt/a/data on one node and /data on another stopped the launch. They are
    compared by what they hold now (the data's fingerprint, the tokenizer's identity record): a copy at another
    path passes, other files are refused, at another path or at the same one."""
    import shutil

    from megatron.arguments import build_parser
    from megatron.data.tokenizer import SPECIAL_TOKENS
    from megatron.parallel import same_settings

    node_a = tmp_path / "mnt" / "a" / "data"
    node_a.mkdir(parents=True)
    (node_a / "corpus.idx").write_bytes(b"index" * 20)
    (node_a / "corpus.bin").write_bytes(bytes(range(200)))
    (node_a / "vocab.txt").write_text("\n".join([*SPECIAL_TOKENS, "the", "a"]) + "\n")
    node_b = tmp_path / "data"
    shutil.copytree(node_a, node_b)  # the same files, another path (another inode: hashed, not stat-compared)
    other = tmp_path / "other"
    shutil.copytree(node_a, other)
    (other / "corpus.bin").write_bytes(bytes(reversed(range(200))))  # other tokens, the same sizes
    (other / "vocab.txt").write_text("\n".join([*SPECIAL_TOKENS, "the", "an"]) + "\n")
    parser = build_parser()
    names = same_settings.flag_names(parser)

    def settings(folder, files_of=None):
        """One rank's settings and content identities; `files_of`: the folder whose files its paths hold."""
        flags = ["--data-path", f"{folder}/corpus", "--vocab-file", f"{folder}/vocab.txt"]
        named = same_settings.launch_settings(parser.parse_args(flags), {})
        held = same_settings.content_identities(same_settings.launch_settings(
            parser.parse_args(["--data-path", f"{files_of or folder}/corpus", "--vocab-file",
                               f"{files_of or folder}/vocab.txt"]), {}))
        return {**named, **held}

    assert same_settings.different_settings([settings(node_a), settings(node_b)], ["a", "b"], names) is None
    changed = str(same_settings.different_settings([settings(node_a), settings(other)], ["a", "b"], names))
    assert changed.startswith(f"the ranks were launched with different settings: --data-path is ['{node_a}/corpus'] "
                              f"on rank 0 (a) but ['{other}/corpus'] on rank 1 (b) (other contents) "
                              "(also --vocab-file)")
    same_path = str(same_settings.different_settings([settings(node_a), settings(node_a, files_of=other)],
                                                     ["a", "b"], names))
    assert same_path == (f"the ranks were launched with other files under the same path: --data-path "
                         f"['{node_a}/corpus'] holds other contents on rank 1 (b) than on rank 0 (a); "
                         f"{same_settings.CONTENT_FIX}")

    # the digest all ranks gather first compares content, not path text: equal for the copy, not for other files
    assert same_settings.settings_digest(settings(node_a)) == same_settings.settings_digest(settings(node_b))
    assert same_settings.settings_digest(settings(node_a)) != same_settings.settings_digest(
        settings(node_a, files_of=other))


def test_a_checkpoint_or_hf_folder_at_another_path_on_another_node_is_the_same_start(tmp_path):
    """--load (other than --save) and --init-from-hf were compared as path text: the same checkpoint or HF folder
    copied to another path on each node stopped the launch, and other files at the same path (an older copy, another
    run's checkpoint) passed. They are compared by content now: a checkpoint by its latest tag and run state (its
    run's id and iteration; the weights files where it has no run id: a from-hf one), an HF folder by its config and
    weights files."""
    import shutil

    from megatron.arguments import build_parser
    from megatron.parallel import same_settings

    def checkpoint(folder, run_id="run-a", weights=b"weights-a"):
        (folder / "iter_0000002").mkdir(parents=True)
        (folder / "latest").write_text("iter_0000002")
        origin = {"weights_from": {"from": None, "run_id": run_id}} if run_id else {"weights_only": True}
        (folder / "iter_0000002" / "run_state.json").write_text(json.dumps(
            {"config": {"model": {}}, "iteration": 2, "consumed_samples": 8, **origin}))
        (folder / "iter_0000002" / "mp_rank_00_model_states.pt").write_bytes(weights)
        return folder

    def hf_folder(folder, weights=b"weights-a"):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"model_type": "bert"}')
        (folder / "model.safetensors").write_bytes(weights)
        return folder

    parser = build_parser()
    names = same_settings.flag_names(parser)

    def verdict(flag, node_0, node_1, files_of_1=None):
        """different_settings' line (None: alike) of two nodes giving `flag` `node_0` / `node_1`, node 1's path
        holding the files of `files_of_1`."""
        every = []
        for path, files in ((node_0, node_0), (node_1, files_of_1 or node_1)):
            extra = ["--save", str(tmp_path / "save")] if flag == "--load" else []
            named = same_settings.launch_settings(parser.parse_args([flag, str(path), *extra]), {})
            held = same_settings.content_identities(same_settings.launch_settings(
                parser.parse_args([flag, str(files), *extra]), {}))
            every.append({**named, **held})
        error = same_settings.different_settings(every, ["a", "b"], names)
        return error and str(error)

    node_a = checkpoint(tmp_path / "a" / "ckpt")
    node_b = tmp_path / "b" / "ckpt"
    shutil.copytree(node_a, node_b)
    assert verdict("--load", node_a, node_b) is None  # the same checkpoint at another path
    other_run = checkpoint(tmp_path / "other" / "ckpt", run_id="run-b")
    assert verdict("--load", node_a, node_a, files_of_1=other_run) == (
        f"the ranks were launched with other files under the same path: --load {node_a} holds other contents on "
        f"rank 1 (b) than on rank 0 (a); {same_settings.CONTENT_FIX}")
    assert verdict("--load", node_a, other_run).startswith(
        f"the ranks were launched with different settings: --load is {node_a} on rank 0 (a) but {other_run} on rank "
        "1 (b) (other contents)")
    # weights-only checkpoints (from-hf) carry no run id: their weights tell them apart
    converted = checkpoint(tmp_path / "conv" / "ckpt", run_id=None)
    reconverted = checkpoint(tmp_path / "reconv" / "ckpt", run_id=None, weights=b"weights-b")
    assert verdict("--load", converted, converted, files_of_1=reconverted).startswith(
        "the ranks were launched with other files under the same path: --load")

    hf_a = hf_folder(tmp_path / "a" / "hf")
    hf_b = tmp_path / "b" / "hf"
    shutil.copytree(hf_a, hf_b)
    assert verdict("--init-from-hf", hf_a, hf_b) is None
    hf_other = hf_folder(tmp_path / "other" / "hf", weights=b"weights-b")  # fine-tuned: the same sizes
    assert verdict("--init-from-hf", hf_a, hf_a, files_of_1=hf_other) == (
        f"the ranks were launched with other files under the same path: --init-from-hf {hf_a} holds other contents "
        f"on rank 1 (b) than on rank 0 (a); {same_settings.CONTENT_FIX}")

def test_a_node_running_other_code_is_named_before_its_flags(tmp_path):
    """A node with another checkout (an edited source) or another version of a pinned package was compared by its
    flags alone: the flags agreed and it trained on otherwise, or its other defaults were named as if the user had
    given other flags. The code is compared first now, in one line naming the package or the sources."""
    import shutil

    from megatron.arguments import build_parser
    from megatron.parallel import same_settings

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = build_parser()
    names = same_settings.flag_names(parser)
    here = same_settings.code_identity()
    assert set(here) == {same_settings.CODE + name for name in (same_settings.SOURCES, *same_settings.PINNED)}
    copy = tmp_path / "checkout"
    shutil.copytree(os.path.join(root, "megatron"), copy / "megatron", ignore=shutil.ignore_patterns("*.so", "__py*"))
    shutil.copy(os.path.join(root, "pretrain_bert.py"), copy)
    assert same_settings.code_identity(copy) == here  # the same sources at another path
    (copy / "megatron" / "training.py").write_text((copy / "megatron" / "training.py").read_text() + "# edited\n")
    edited = same_settings.code_identity(copy)
    assert edited[same_settings.CODE + "megatron"] != here[same_settings.CODE + "megatron"]

    def rank(code, *flags):
        return {**same_settings.launch_settings(parser.parse_args(["--lr", "1e-4", *flags]), {}), **code}

    older = {**here, same_settings.CODE + "deepspeed": "0.19.7"}
    assert same_settings.different_settings([rank(here), rank(here)], ["a", "b"], names) is None
    assert str(same_settings.different_settings([rank(here), rank(older, "--lr", "2e-4")], ["a", "b"], names)) == (
        f"the ranks run other code: deepspeed is {here['code:deepspeed']} on rank 0 (a) but 0.19.7 on rank 1 (b); "
        f"{same_settings.CODE_FIX}")
    both = {**edited, same_settings.CODE + "deepspeed": "0.19.7"}
    assert str(same_settings.different_settings([rank(here), rank(both)], ["a", "b"], names)) == (
        f"the ranks run other code: the trainer's sources (digest of megatron/, pretrain_bert.py) is "
        f"{here['code:megatron']} on rank 0 (a) but {edited['code:megatron']} on rank 1 (b) (also deepspeed); "
        f"{same_settings.CODE_FIX}")


@pytest.mark.parametrize("node_0, node_1, message", [
    # folders a node may have on its own disk: the index maps (built again where missing), the embedded corpus
    (["--data-cache-path", "/local/a/maps"], ["--data-cache-path", "/scratch/maps"], None),
    (["--default-data-dir", "/home/a/repo/data"], ["--default-data-dir", "/opt/repo/data"], None),
    # one shared --save mounted at another path: check_writable tells it by rank 0's lock, not here
    (["--save", "/mnt/a/ckpt", "--load", "/mnt/a/ckpt"], ["--save", "/shared/ckpt", "--load", "/shared/ckpt"], None),
    (["--save", "/mnt/a/ckpt"], [], "--save is given on rank 0 (a) but not given on rank 1 (b); "),
    (["--save", "/ckpt", "--load", "/ckpt"], ["--save", "/ckpt", "--load", "/old"],
     "--load is the --save folder on rank 0 (a) but /old on rank 1 (b); "),
])
def test_per_node_folders_may_differ_and_the_checkpoint_folder_may_not(node_0, node_1, message):
    """Every flag was compared as text: a per-node --data-cache-path (or checkout) refused the launch, and one
    --save path on node-local disks passed, each node then holding a part of every checkpoint."""
    from megatron.arguments import build_parser
    from megatron.parallel import same_settings

    parser = build_parser()
    every = [same_settings.launch_settings(parser.parse_args(flags), {}) for flags in (node_0, node_1)]
    error = same_settings.different_settings(every, ["a", "b"], same_settings.flag_names(parser))
    assert (error and str(error).split("settings: ")[1].split("launch every")[0]) == message, error
    if message:
        assert str(error).endswith(same_settings.SHARED_FOLDER_FIX)


def test_a_save_folder_is_the_one_rank_0_locked_or_refused(tmp_path):
    """check_writable's check on each other node: rank 0's lock shows in its --save (any path to that folder)."""
    import json

    from megatron import checkpoint_save, locks

    shared, local = tmp_path / "shared", tmp_path / "local"
    shared.mkdir()
    local.mkdir()
    (tmp_path / "mount").symlink_to(shared)
    lock = {"host": "a", "pid": 1, "start": 2.0}
    (shared / locks.LOCK).write_text(json.dumps(lock))
    (local / locks.LOCK).write_text(json.dumps({**lock, "pid": 3}))  # another run's lock at the same path
    for seen in (shared, tmp_path / "mount"):
        assert checkpoint_save.not_shared(str(seen), "/ckpt", "a", lock, wait_s=0) is None
    for other in (local, tmp_path / "missing"):
        problem, fix = checkpoint_save.not_shared(str(other), "/ckpt", "a", lock, wait_s=0)
        assert problem.startswith(f"--save {other} on ") and problem.endswith(
            "is not the folder rank 0 saves into (--save /ckpt on a): each node would hold only its own ranks' part "
            "of every checkpoint"), problem
        assert fix.startswith("pass a --save folder every node shares")
