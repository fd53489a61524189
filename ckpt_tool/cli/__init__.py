"""The ``ckpt`` command line: thin commands over the library."""
