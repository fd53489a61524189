"""The record path's C module (ckpt_tool/records/_framing.c), built by pip install; everything
else about the package is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("ckpt_tool.records._framing", ["ckpt_tool/records/_framing.c"])])
