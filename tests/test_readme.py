"""Every command in the bash blocks of the README and of docs/*.md is executed: the cheap ones
here, for real, in the pages' order (README first), in a folder that looks like the repository
(tools, configs, launch scripts in a dry run); the long trainings by the tests named in COVERED,
which run them or their small-size equivalent. A new command that is neither fails this test.
The README stays a two-minute read: under 150 lines, linking every page of docs/."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

# command prefix -> the test that runs it (at a size a CI machine runs)
COVERED = {
    "bash examples_deepspeed/pretrain_default.sh": "tests/test_training.py::test_pretrain_default_settings_export",
    "python3.11 -m venv .venv": "the CI job itself (installs and runs this suite)",
    ".venv/bin/deepspeed --num_gpus 8 pretrain_bert.py": "tests/test_training.py::launched",  # the real launcher, 2 ranks
    ".venv/bin/python tools/preprocess_data.py --input wiki.json": "tests/test_preprocess.py::test_every_format_feeds_the_same_bert_samples",
    ".venv/bin/python tools/convert_checkpoint.py from-hf": "tests/test_init_from_hf.py::test_load_weights_only_checkpoint_from_the_converter",
    ".venv/bin/python tools/convert_checkpoint.py to-hf": "tests/test_training.py::test_a_default_run_exports_to_hugging_face",
    ".venv/bin/deepspeed --num_gpus 2 pretrain_bert.py --deepspeed --deepspeed_config ds_configs/ring_sp2.json --init-from-hf":
        "tests/test_init_from_hf.py::test_init_from_hf_folder_without_heads",
    ".venv/bin/deepspeed --num_gpus 2 pretrain_bert.py ... --load ckpt/bert-4k":
        "tests/test_init_from_hf.py::test_load_weights_only_checkpoint_from_the_converter",
    "CUDA_VISIBLE_DEVICES= examples_deepspeed/bert_distributed.sh 2 1 2 128":
        "tests/test_launch_scripts.py::test_two_node_launch_on_one_machine",
    "NODE_RANK=1 MASTER_ADDR=10.0.0.4 examples_deepspeed/bert_multinode.sh":
        "tests/test_launch_scripts.py::test_two_node_launch_on_one_machine",
    ".venv/bin/python tools/preprocess_data.py --input corpus.json --tokenizer-file":
        "tests/test_hf_tokenizer.py::test_bpe_from_preprocessing_to_training_fill_mask_and_a_modernbert_export",
    ".venv/bin/python tools/preprocess_data.py --input 'shards/*.parquet'":
        "tests/test_corpus_formats.py::test_every_corpus_format_writes_the_bytes_of_loose_json",
    ".venv/bin/python tools/extend_context.py --from hf/modernbert-base":
        "tests/test_extend_context.py::test_a_modernbert_continues_at_4x_on_sp2_and_exports_to_transformers",
    ".venv/bin/python tools/convert_checkpoint.py to-hf --load ckpt/mb-32k":
        "tests/test_extend_context.py::test_a_modernbert_continues_at_4x_on_sp2_and_exports_to_transformers",
    ".venv/bin/python azureml/submit.py --compute gpu-cluster": "tests/test_azureml.py::test_submit_without_workspace_config_is_one_line",
}
# run here: launch scripts with DRY_RUN=1 (they resolve and validate the JSON for the world size and print the
# launch), everything else as written
DRY_RUN = ("examples_deepspeed/bert_distributed", "examples_deepspeed/bert_multinode.sh")
RUN = (".venv/bin/python tools/", ".venv/bin/python azureml/submit.py --dry-run", *DRY_RUN)
EXIT_CODES = {".venv/bin/python tools/ds_config.py diff": 1}  # diff: 1 when the files differ


def readme_commands() -> list:
    """The commands of the pages' ```bash blocks, continuation lines joined, comments dropped."""
    commands = []
    blocks = [block for page in PAGES for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S)]
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(" ".join(line.split()))
    return commands


def kind(command: str) -> str:
    if any(command.startswith(prefix) for prefix in COVERED):
        return "covered"
    if any(command.startswith(prefix) for prefix in RUN):
        return "run"
    return "unclassified"


def test_every_readme_command_is_run_or_covered():
    commands = readme_commands()
    assert len(commands) > 20
    assert [c for c in commands if kind(c) == "unclassified"] == []
    # the README's install never activates the venv: a bare `python tools/...` or `deepspeed ...` is not found there
    assert [c for c in commands if re.match(r"(\w+=\S* )*(python|deepspeed|pytest)\s", c)] == []
    for prefix, test in COVERED.items():
        assert any(command.startswith(prefix) for command in commands), f"COVERED names a command gone: {prefix}"
        if test.startswith("tests/"):
            path, name = test.split("::")
            assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), flags=re.M), test


def test_readme_is_short_and_links_every_page():
    text = README.read_text()
    assert len(text.splitlines()) < 150
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)\)", text))
    assert linked == {f"docs/{page.name}" for page in PAGES[1:]}
    for page in PAGES:  # links between pages resolve
        for target in re.findall(r"\]\(([\w./-]+\.(?:md|png))\)", page.read_text()):
            assert (page.parent / target).is_file(), f"{page.name} links {target}"


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A folder with the repository's tools, configs, scripts and venv linked in: the README's
    relative paths resolve, and what the commands write (data/, my.json, job.yml) lands here."""
    for name in ("tools", "ds_configs", "examples_deepspeed", "azureml", "hostfile.example", "megatron",
                 "pretrain_bert.py", "requirements.txt"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))  # the environment running the tests
    return tmp_path


def test_readme_commands_run(checkout):
    """The cheap commands, in order (the sample corpus before its vocab and preprocessing, set
    before validate and diff), each exiting as the README says."""
    try:
        import azure.ai.ml  # noqa: F401
        have_sdk = True
    except ImportError:
        have_sdk = False
    ran = []
    for command in readme_commands():
        if kind(command) != "run" or ("azureml/submit.py" in command and not have_sdk):
            continue
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        words = shlex.split(command.replace("...", "8 1 8 16384 1 8 24 1024 16"))
        if command.startswith(DRY_RUN):
            env["DRY_RUN"] = "1"
        result = subprocess.run(words, cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
        expected = next((code for prefix, code in EXIT_CODES.items() if command.startswith(prefix)), 0)
        assert result.returncode == expected, f"{command}\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
        assert "Traceback" not in result.stderr and "[WARNING]" not in result.stderr, command
        ran.append(command)
    assert sum("ds_config.py" in c for c in ran) == 4 and sum(c.startswith(DRY_RUN) for c in ran) == 5
    assert any("azureml/submit.py" in c for c in ran) == have_sdk
    assert (checkout / "data" / "sample_text_sentence.idx").is_file() and (checkout / "my.json").is_file()


def test_layout_page_names_every_module_tool_and_benchmark():
    """docs/layout.md lists every module of megatron/ and every tool and benchmark script, and
    only files that exist, so the page cannot drift from the tree."""
    listed = {line.split()[0] for line in (ROOT / "docs" / "layout.md").read_text().splitlines()
              if line.strip() and not line.startswith(" ")}
    files = [*ROOT.glob("megatron/**/*.py"), *ROOT.glob("megatron/**/*.cpp"), *ROOT.glob("tools/*.py"),
             *ROOT.glob("benchmarks/*.py"), *ROOT.glob("benchmarks/*.sh")]
    assert sorted(str(path.relative_to(ROOT)) for path in files if str(path.relative_to(ROOT)) not in listed) == []
    paths = {name for name in listed if "/" in name or name.endswith(".py")}
    assert sorted(name for name in paths if not (ROOT / name).exists()) == []
