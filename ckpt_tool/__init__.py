"""ckpt: offline tooling for Apache Flink unaligned checkpoints."""


def __getattr__(name: str) -> str:
    """``__version__``, looked up only when asked for (reading package metadata costs a tenth of a second)."""
    if name != "__version__":
        raise AttributeError(name)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ckpt-tool")
    except PackageNotFoundError:  # running from a source tree without installation
        return "0.0.0+source"
