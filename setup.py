"""The record path's C module (ckpt_tool/framing/_framing.c, with xxHash's header vendored beside
it), built by pip install; everything else about the package is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("ckpt_tool.framing._framing", ["ckpt_tool/framing/_framing.c"], depends=["ckpt_tool/framing/xxhash.h"])
    ]
)
