"""Installs the `megatron` package and compiles its C++ (pybind11) extensions.

Every `megatron/**/<name>.cpp` becomes the extension module `megatron.<...>.<name>`, so a new
helper only needs its source file; `pip install -e .` builds it in place at install time.
"""
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import find_packages, setup

ROOT = Path(__file__).parent


def read_requirements(name):
    """Pins from a requirements file, following its `-r other.txt` includes."""
    pins = []
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            pins += read_requirements(line[3:].strip())
        elif line:
            pins.append(line)
    return pins


def cpp_extensions():
    return [
        Pybind11Extension(
            ".".join(src.with_suffix("").parts),
            [str(src)],
            cxx_std=17,
            extra_compile_args=["-O3"],
        )
        for src in sorted(Path("megatron").rglob("*.cpp"))
    ]


setup(
    name="megatron-deepspeed-longseq",
    version="0.1.0",
    description="DeepSpeed-integrated Megatron BERT trainer with sequence-parallel attention",
    long_description=(ROOT / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["megatron", "megatron.*"]),
    package_data={"megatron.data": ["default_vocab.txt"]},  # the default run's vocab (default_dataset.py)
    install_requires=read_requirements("requirements.txt"),
    extras_require={
        "test": read_requirements("requirements-test.txt"),
        "azureml": read_requirements("requirements-azureml.txt"),
    },
    ext_modules=cpp_extensions(),
    cmdclass={"build_ext": build_ext},
    zip_safe=False,
)
