"""ckpt: offline tooling for Apache Flink unaligned checkpoints."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ckpt-tool")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+source"
