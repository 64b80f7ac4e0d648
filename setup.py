"""The package layout pyproject.toml cannot say: the repository's top-level `csrc/` (the CUDA
sources) ships inside the package as `dlrt/csrc` (setuptools' package_dir), with no link in
the tree. Everything else is described in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["dlrt", "dlrt.*"]), "dlrt.csrc"],
    package_dir={"dlrt.csrc": "csrc"},
    package_data={"dlrt": ["data/**/*"], "dlrt.csrc": ["*.cu"]},
)
