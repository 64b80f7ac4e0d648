"""Shim for tools that still call setup.py; the build is described in pyproject.toml."""

from setuptools import setup

setup()
