"""Entry point of the ``ckpt`` command.

Exit codes: 0 success; 1 problems found (verify); 2 unusable input or usage error;
3 internal error (a bug: run again with --verbose for the traceback).
"""

from __future__ import annotations

import sys
import traceback

import click

from ckpt_tool import __version__
from ckpt_tool.cli.output import output_for
from ckpt_tool.errors import EXIT_INTERNAL, CkptError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="ckpt")
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks for errors.")
def cli(verbose: bool) -> None:
    """Inspect, verify, rescale and repair Apache Flink unaligned checkpoints, offline."""


@cli.command()
@click.argument("checkpoint")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def inspect(checkpoint: str, as_json: bool) -> None:
    """Show what CHECKPOINT (a directory or s3:// URI) holds."""
    from ckpt_tool.flink.checkpoint import Checkpoint
    from ckpt_tool.inspect import summarize

    opened = Checkpoint.open(checkpoint)
    opened.require_files()
    output_for(as_json).inspect(summarize(opened))


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in args or "--verbose" in args
    try:
        cli.main(args=args, prog_name="ckpt", standalone_mode=False)
    except CkptError as exc:
        if verbose:
            traceback.print_exc()
        click.echo(f"ckpt: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("ckpt: aborted", err=True)
        sys.exit(1)
    except Exception as exc:  # a bug: one line unless --verbose
        if verbose:
            traceback.print_exc()
        click.echo(f"ckpt: internal error: {type(exc).__name__}: {exc} (run with --verbose for details)", err=True)
        sys.exit(EXIT_INTERNAL)


if __name__ == "__main__":
    main()
