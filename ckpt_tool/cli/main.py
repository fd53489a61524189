"""Entry point of the ``ckpt`` command.

Exit codes: 0 success; 1 problems found (verify); 2 unusable input or usage error;
3 internal error (a bug: run again with --verbose for the traceback).
"""

from __future__ import annotations

import sys
import traceback

import click

from ckpt_tool import __version__
from ckpt_tool.cli.output import output_for, progress_bar
from ckpt_tool.errors import EXIT_INTERNAL, CkptError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="ckpt")
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks for errors.")
def cli(verbose: bool) -> None:
    """Inspect, verify, rescale and repair Apache Flink unaligned checkpoints, offline."""


def parse_conf(pairs: tuple[str, ...]) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--conf")
        conf[key] = value
    return conf


@cli.command()
@click.argument("checkpoint")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option("--schema", type=click.Path(dir_okay=False), help="TOML file: record types and keys per exchange.")
@click.option("--plan", type=click.Path(dir_okay=False), help="Flink's plan JSON (REST /jobs/<id>/plan).")
@click.option("--engine", type=click.Choice(["auto", "local", "spark"]), default="auto", show_default=True,
              help="Where records are scanned: in-process, on Spark, or Spark for large checkpoints.")
@click.option("--spark-master", help="Spark master URL (default local[*]).")
@click.option("--conf", multiple=True, metavar="KEY=VALUE", help="Spark configuration, repeatable.")
def inspect(checkpoint, as_json, schema, plan, engine, spark_master, conf) -> None:
    """Show what CHECKPOINT (a directory, its _metadata, or an s3:// URI) holds.

    With --schema and/or --plan, in-flight records are decoded: records per channel, a key-group
    histogram, misplaced records (outside the holding subtask's key groups) and duplicates.
    """
    from ckpt_tool.engine import engine_for
    from ckpt_tool.flink.checkpoint import Checkpoint
    from ckpt_tool.inspect import channel_state_bytes, summarize
    from ckpt_tool.records.schema import load_exchanges

    opened = Checkpoint.open(checkpoint)
    opened.require_files()
    exchanges = runner = None
    if schema or plan:
        exchanges = load_exchanges(opened.metadata, schema, plan)
        runner = engine_for(engine, channel_state_bytes(opened), spark_master, parse_conf(conf))
    with progress_bar("scanning in-flight records", enabled=exchanges is not None and not as_json) as progress:
        summary = summarize(opened, exchanges, runner, progress)
    output_for(as_json).inspect(summary)


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
