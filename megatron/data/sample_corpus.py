"""A loose-JSON corpus of English prose from the Python installation itself, no download.

Sources, in a fixed order: the language reference topics of `pydoc_data.topics`, then the
docstrings of every standard-library module, then those of a few installed packages pinned in
requirements.txt (numpy, deepspeed); modules are parsed with `ast`, never imported. Only prose
paragraphs are kept (no code, doctests or tables), so the corpus suits sentence splitting and
WordPiece training. One JSON object per line in wikiextractor's shape: id, url, title, text.
The output depends only on the Python version and the pins, so the default dataset is reproducible.
"""
import ast
import importlib.util
import inspect
import json
import os
import sysconfig
from pathlib import Path

from pydoc_data.topics import topics

from megatron.errors import ConfigError

SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
MIN_PARAGRAPH_CHARS = 40
DEFAULT_PACKAGES = ("numpy", "deepspeed")


def prose_paragraphs(text: str) -> list[str]:
    """Paragraphs of flowing text: no indented (code) lines, mostly letters, ending a sentence."""
    kept = []
    for block in inspect.cleandoc(text).split("\n\n"):
        lines = block.strip("\n").splitlines()
        if not lines or any(line.startswith((" ", "\t", ">>>", "..")) for line in lines):
            continue
        paragraph = " ".join(line.strip() for line in lines)
        letters = sum(ch.isalpha() or ch.isspace() for ch in paragraph)
        if (len(paragraph) >= MIN_PARAGRAPH_CHARS and letters >= 0.85 * len(paragraph)
                and paragraph.endswith(".") and "*" not in paragraph and "|" not in paragraph):
            kept.append(paragraph)
    return kept


def module_docstrings(path: Path) -> list[str]:
    """Docstrings of the module, its classes and its functions, in source order."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    nodes = [tree] + [node for node in ast.walk(tree)
                      if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    return [doc for doc in (ast.get_docstring(node, clean=False) for node in nodes) if doc]


def python_files(root: Path, package: str = ""):
    """(dotted module name, path) of every .py file under root, sorted, tests left out."""
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            if name.endswith(".py"):
                path = Path(directory) / name
                yield package + path.relative_to(root).with_suffix("").as_posix().replace("/", "."), path


def package_root(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"package {package} is not installed", "install it or leave it out of --packages")
    return Path(list(spec.submodule_search_locations)[0])


def documents(packages):
    """(title, url, paragraphs) for every source, in a fixed order. A package that is not installed is
    refused at the first document, before a small corpus would leave it out unnoticed."""
    sources = [("python-stdlib", python_files(Path(sysconfig.get_paths()["stdlib"])))]
    sources += [(package, python_files(package_root(package), package + ".")) for package in packages]
    for topic in sorted(topics):
        yield topic, f"pydoc-topic:{topic}", prose_paragraphs(topics[topic])
    for origin, files in sources:
        for module, path in files:
            paragraphs = [p for doc in module_docstrings(path) for p in prose_paragraphs(doc)]
            yield module, f"{origin}:{module}", paragraphs


def write_corpus(output: Path, max_bytes: int, packages=DEFAULT_PACKAGES, min_paragraphs: int = 2) -> tuple[int, int]:
    """Writes documents until max_bytes; returns (documents, bytes). Atomic: temp file, then rename."""
    partial = output.with_name(output.name + ".partial")
    count = written = 0
    try:
        with open(partial, "w", encoding="utf-8") as out:
            for title, url, paragraphs in documents(packages):
                if len(paragraphs) < min_paragraphs:
                    continue
                line = json.dumps({"id": str(count), "url": url, "title": title, "text": "\n".join(paragraphs)}) + "\n"
                if written + len(line) > max_bytes:
                    break
                out.write(line)
                count += 1
                written += len(line)
        os.replace(partial, output)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return count, written
