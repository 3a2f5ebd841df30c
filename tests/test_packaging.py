"""The installed package's metadata carries every pin of the requirement files, includes followed."""
from importlib.metadata import requires
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pins(name: str) -> set:
    """Requirement lines of `name`, following `-r` includes (what pip itself reads)."""
    found = set()
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            found |= pins(line[3:].strip())
        elif line:
            found.add(line)
    return found


def test_metadata_has_the_pinned_requirements_and_extras():
    declared = requires("megatron-deepspeed-longseq")
    base = {r for r in declared if "extra ==" not in r}
    test_extra = {r.split(";")[0].strip() for r in declared if 'extra == "test"' in r}
    assert base == pins("requirements.txt")
    assert test_extra == pins("requirements-test.txt")
    assert "azure-ai-ml==1.35.2" in test_extra  # reached only through `-r requirements-azureml.txt`
