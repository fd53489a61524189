"""Entry point of the ``ckpt`` command: each command parses its options, runs one operation in a
session and renders the result.

Exit codes: 0 success; 1 problems found (verify); 2 unusable input or usage error;
3 internal error (a bug: run again with --verbose for the traceback).
"""

from __future__ import annotations

import gc
import os
import sys
import traceback

import click

from ckpt_tool.cli.output import output_for, progress_bar
from ckpt_tool.engine import ENGINES, LOCAL_LIMIT_BYTES
from ckpt_tool.errors import EXIT_INTERNAL, EXIT_PROBLEMS, EXIT_UNUSABLE_INPUT, CkptError
from ckpt_tool.memory import keep_heap_top
from ckpt_tool.text import LINE_LIMIT, one_line, printable

# gc thresholds while a command runs (Python's default: 700, 10, 10)
COLLECTION_THRESHOLDS = (100_000, 50, 100)


def _add_plugins(ctx: click.Context, _, modules: tuple[str, ...]) -> None:
    from ckpt_tool.records.schema import check_plugin_modules

    ctx.meta["plugins"] = ctx.meta.get("plugins", ()) + check_plugin_modules(modules)


# Trusted code for a schema's decoders (a schema file alone never loads code): kept on the
# context, given before or after the command, read by open_session.
PLUGIN_OPTION = click.option(
    "--plugin",
    "plugins",
    multiple=True,
    metavar="MODULE",
    expose_value=False,
    callback=_add_plugins,
    help="A Python module you trust, whose functions a schema may name as decoder (repeatable). "
    "A schema's decoder from any other module is refused.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ckpt-tool", prog_name="ckpt")
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks for errors.")
@click.option("--s3-endpoint", metavar="URL", help="Endpoint of an S3-compatible store (else AWS_ENDPOINT_URL).")
@PLUGIN_OPTION
@click.option(
    "--io-timeout",
    type=click.FloatRange(min=0, min_open=True, max=86400),
    metavar="SECONDS",
    help="Object stores: give up on a connection silent this long (default 10; CKPT_IO_TIMEOUT).",
)
@click.option(
    "--io-attempts",
    type=click.IntRange(min=1, max=100),
    metavar="N",
    help="Object stores: tries of a request whose connection failed or went silent (default 3; CKPT_IO_ATTEMPTS).",
)
@click.pass_context
def cli(ctx: click.Context, verbose: bool, s3_endpoint: str | None, io_timeout: float | None, io_attempts: int | None) -> None:
    """Inspect, verify, rescale and repair Apache Flink unaligned checkpoints, offline.

    CHECKPOINT, SRC and DST are local paths, file:// URIs, or object store URIs: s3:// (s3a://,
    s3p://), gs://<bucket>/<path>, abfs[s]://<container>@<account>.dfs.core.windows.net/<path> or
    wasb[s]://<container>@<account>.blob.core.windows.net/<path>. Each store's own credential chain
    and environment apply (AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_CONNECTION_STRING, ...).
    CHECKPOINT and SRC may also be a job's checkpoint directory (.../<job-id>/): ckpt takes its newest
    complete chk-<n> and says which.
    """
    ctx.obj = {"verbose": verbose}
    # read by the storage, also on Spark executors (their environment carries them)
    if s3_endpoint:
        os.environ["CKPT_S3_ENDPOINT"] = s3_endpoint
    if io_timeout is not None:
        os.environ["CKPT_IO_TIMEOUT"] = f"{io_timeout:g}"
    if io_attempts is not None:
        os.environ["CKPT_IO_ATTEMPTS"] = str(io_attempts)


def parse_conf(pairs: tuple[str, ...]) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--conf")
        conf[key] = value
    return conf


def parse_overrides(pairs: tuple[str, ...]) -> dict[str, int]:
    overrides = {}
    for pair in pairs:
        ref, sep, value = pair.rpartition("=")
        if not sep or not ref or not value.isdigit():
            raise click.BadParameter(f"expected OPERATOR=N, got {pair!r}", param_hint="--operator")
        overrides[ref] = int(value)
    return overrides


ENGINE_HELP = (
    "Where the record path runs: in-process (local), on Spark, or auto: Spark when the checkpoint holds more than "
    f"{LOCAL_LIMIT_BYTES // 2**30} GiB of in-flight data or --spark-master is given, else on this machine "
    "(one process per core)."
)


# A compiled SQL plan (COMPILE PLAN's JSON): kept on the context, read by open_session.
SQL_PLAN_OPTION = click.option(
    "--sql-plan",
    type=click.Path(dir_okay=False),
    expose_value=False,
    callback=lambda ctx, _, value: ctx.meta.__setitem__("sql_plan", value),
    help="Flink's compiled plan (COMPILE PLAN JSON) of a Table/SQL job: exchanged row types and keys.",
)


TARGET_PLAN_OPTION = click.option(
    "--target-plan",
    type=click.Path(dir_okay=False),
    help="Flink's plan JSON of the job as it will be started (its chains); else ckpt derives them by Flink's rules.",
)


def read_target_plan(path):
    from ckpt_tool.flink.plan import load_target_plan

    return load_target_plan(path) if path else None


def session_options(command):
    """The options every command that reads records shares: inputs and the engine."""
    for option in reversed(
        [
            click.option("--schema", type=click.Path(dir_okay=False), help="TOML file: record types and keys per exchange."),
            click.option("--plan", type=click.Path(dir_okay=False), help="Flink's plan JSON (REST /jobs/<id>/plan)."),
            SQL_PLAN_OPTION,
            PLUGIN_OPTION,
            click.option("--engine", type=click.Choice(ENGINES), default="auto", show_default=True, help=ENGINE_HELP),
            click.option("--spark-master", help="Spark master URL (default local[*]); implies Spark."),
            click.option("--conf", multiple=True, metavar="KEY=VALUE", help="Spark configuration, repeatable."),
        ]
    ):
        command = option(command)
    return command


def write_rescale_html(path: str, source, report, src: str, dst) -> None:
    """The pictures of the checkpoint before and (unless nothing was written) after."""
    from ckpt_tool.cli.html import rescale_html, write_html
    from ckpt_tool.ops.inspect import inspect as run_inspect
    from ckpt_tool.output_files import report_mode
    from ckpt_tool.session import Session

    before = run_inspect(source)
    mode = report_mode(source.checkpoint)
    if dst is None:
        write_html(path, rescale_html(before, None, report, src, "(dry run)"), mode)
        return
    written = Session.open(dst, engine=source.engine)  # the source session's engine, stopped by it
    written.plan, written.exchanges = source.plan, source.exchanges  # the same exchanges, in the new layout
    write_html(path, rescale_html(before, run_inspect(written), report, src, dst), mode)


def open_session(checkpoint, schema, plan, engine, spark_master, conf, require_files=True):
    """The session a command works in; Spark's own logging stays off unless --verbose."""
    from ckpt_tool.session import Session

    context = click.get_current_context()
    verbose = bool((context.obj or {}).get("verbose"))
    session = Session.open(
        checkpoint,
        schema,
        plan,
        engine,
        spark_master,
        parse_conf(conf),
        require_files,
        quiet=not verbose,
        sql_plan=context.meta.get("sql_plan"),
        plugins=context.meta.get("plugins", ()),
    )
    if session.checkpoint.chosen_from is not None:
        name = session.checkpoint.uri.rsplit("/", 1)[-1]
        chosen_from = printable(session.checkpoint.chosen_from)
        click.echo(f"ckpt: using {printable(name)}, the newest complete checkpoint of {chosen_from}", err=True)

    for note in session.notes:  # what was derived from the bytes (output partitions)
        click.echo(f"ckpt: note: {one_line(note)}", err=True)

    # the metadata lives as long as the command, and holds no reference cycles: the collector need
    # not rescan its (up to millions of) handles again and again (one command per process)
    gc.freeze()
    # and the per-channel objects the command builds next (tasks, sources: up to millions, none in
    # a cycle) would set off a young collection every 700 of them, and older ones over all of them
    gc.set_threshold(*COLLECTION_THRESHOLDS)

    def warn() -> None:  # what the engine found about where the work ran (e.g. a slower record path)
        for warning in session.warnings:
            click.echo(f"ckpt: warning: {one_line(warning)}", err=True)

    context.call_on_close(warn)
    return session


@cli.command()
@click.argument("checkpoint")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option(
    "--summary",
    is_flag=True,
    help="With --json: every list of single channels (a subtask's, an exchange's) is null; "
    "totals, histograms and problems stay (a job at parallelism p has up to p² channels).",
)
@session_options
@click.option("--html", "html_file", type=click.Path(dir_okay=False), help="Also write an HTML report with plots.")
def inspect(checkpoint, as_json, summary, schema, plan, engine, spark_master, conf, html_file) -> None:
    """Show what CHECKPOINT (a directory, its _metadata, an object store URI, or a job directory) holds.

    With --schema and/or --plan, in-flight records are decoded: records per channel, a key-group
    histogram, misplaced records (outside the holding subtask's key groups) and duplicates.
    """
    from ckpt_tool.ops.inspect import inspect as run_inspect

    if summary and not as_json:
        raise click.UsageError("--summary applies to --json (the tables list at most 1,000 channel rows)")
    with open_session(checkpoint, schema, plan, engine, spark_master, conf, require_files=False) as session:
        scanning = session.exchanges is not None
        with progress_bar("scanning in-flight records", enabled=scanning and not as_json) as session.progress:
            report = run_inspect(session)
    output_for(as_json, channel_rows=not summary).inspect(report)
    if html_file:
        from ckpt_tool.cli.html import inspect_html, write_html
        from ckpt_tool.output_files import report_mode

        write_html(html_file, inspect_html(report, checkpoint), report_mode(session.checkpoint))
    if report.problems:
        more = f" (and {len(report.problems) - 1} more problems)" if len(report.problems) > 1 else ""
        raise CkptError(f"{report.problems[0]}{more}; everything readable is shown above")


@cli.command()
@click.argument("src")
@click.argument("dst")
@click.option("-p", "--parallelism", type=click.IntRange(min=1), help="New parallelism of the job's operators.")
@click.option(
    "--operator",
    "operators",
    multiple=True,
    metavar="OPERATOR=N",
    help="New parallelism of one operator (uid, name or id), repeatable.",
)
@click.option(
    "--drop-in-flight",
    "drop",
    multiple=True,
    metavar="OPERATOR",
    help="Drop the in-flight data flowing into OPERATOR (uid, name or id), repeatable; what is dropped is reported.",
)
@session_options
@TARGET_PLAN_OPTION
@click.option("--dry-run", is_flag=True, help="Print the plan and what would be moved; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option(
    "--html", "html_file", type=click.Path(dir_okay=False), help="Also write an HTML report with plots, before and after."
)
def rescale(
    src, dst, parallelism, operators, drop, schema, plan, engine, spark_master, conf, target_plan, dry_run, as_json, html_file
):
    """Write to DST a copy of checkpoint SRC for a new parallelism.

    Every new subtask holds exactly the in-flight records of its key groups; keyed and operator
    state are reassigned as Flink would. SRC and DST are directories or object store URIs (SRC
    may be a job directory: its newest complete checkpoint); DST must not hold a checkpoint yet.
    """
    from ckpt_tool.ops.rescale import rescale as run_rescale

    if not parallelism and not operators:
        raise click.UsageError("give --parallelism N or at least one --operator OPERATOR=N")
    overrides = parse_overrides(operators)
    target = read_target_plan(target_plan)
    with open_session(src, schema, plan, engine, spark_master, conf) as session:
        with progress_bar("rescaling", enabled=not as_json) as session.progress:
            report = run_rescale(session, dst, parallelism, overrides, dry_run, list(drop), target)
        if html_file:
            write_rescale_html(html_file, session, report, src, None if dry_run else dst)
    output_for(as_json).rescale(report)


@cli.command()
@click.argument("src")
@click.argument("dst")
@click.option(
    "--drop-in-flight",
    "drop",
    multiple=True,
    metavar="OPERATOR",
    help="Drop the in-flight data flowing into OPERATOR (uid, name or id), repeatable.",
)
@session_options
@TARGET_PLAN_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def repair(src, dst, drop, schema, plan, engine, spark_master, conf, target_plan, as_json) -> None:
    """Write to DST a repaired copy of checkpoint SRC.

    Every subtask keeps only its own key groups' in-flight records, each once (replicas left by a
    naive rescale are removed, misplaced records move to their owner); --drop-in-flight removes
    the in-flight data of the named operators only, reporting exactly what is dropped.
    """
    from ckpt_tool.ops.repair import repair as run_repair

    if not (schema or plan or click.get_current_context().meta.get("sql_plan")):
        raise click.UsageError("repair needs --schema and/or --plan to know the exchanges")
    target = read_target_plan(target_plan)
    with open_session(src, schema, plan, engine, spark_master, conf) as session:
        with progress_bar("repairing", enabled=not as_json) as session.progress:
            report = run_repair(session, dst, list(drop), target)
    output_for(as_json).rescale(report)


@cli.command()
@click.argument("checkpoint")
@click.option(
    "--target-parallelism",
    type=click.IntRange(min=1),
    help="Also check that a rescale to N is possible and Flink would restore it (chaining at N as Flink derives it).",
)
@session_options
@TARGET_PLAN_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--junit", type=click.Path(dir_okay=False, writable=True), help="Also write the report as JUnit XML.")
@click.option("--strict", is_flag=True, help="A check that cannot run (for want of --plan, --schema, ...) fails.")
def verify(checkpoint, target_parallelism, schema, plan, engine, spark_master, conf, target_plan, as_json, junit, strict) -> None:
    """Check that CHECKPOINT is sound. Exit code 0 sound, 1 problems found, 2 unusable.

    Checks that need --plan, --schema or --target-parallelism are skipped without them, and the
    status says so; --strict makes them fail instead (for CI)."""
    from ckpt_tool.ops.verify import PROBLEMS, UNUSABLE, junit_xml
    from ckpt_tool.ops.verify import verify as run_verify

    with open_session(checkpoint, schema, plan, engine, spark_master, conf, require_files=False) as session:
        report = run_verify(session, target_parallelism, strict, read_target_plan(target_plan))
    if junit:
        from ckpt_tool.output_files import report_mode, write_report

        write_report(junit, junit_xml(report), report_mode(session.checkpoint))
    output_for(as_json).verify(report)
    sys.exit({PROBLEMS: EXIT_PROBLEMS, UNUSABLE: EXIT_UNUSABLE_INPUT}.get(report.status, 0))


@cli.command()
@click.argument("checkpoint")
@click.option("--plan", type=click.Path(dir_okay=False), help="Flink's plan JSON (REST /jobs/<id>/plan).")
@SQL_PLAN_OPTION
@click.option("--schema", type=click.Path(dir_okay=False), help="A schema file whose facts are laid over.")
@PLUGIN_OPTION
def schema(checkpoint, plan, schema) -> None:
    """Print a schema file (TOML) to fill in: every exchange of CHECKPOINT holding in-flight data,
    its operators by uid, name and id, gate, partition, partitioner, and type and key where known."""
    from ckpt_tool.exchanges import pairing_evidence
    from ckpt_tool.records.skeleton import schema_skeleton

    with open_session(checkpoint, schema, plan, "local", None, (), require_files=False) as session:
        evidence = None if any(session.checkpoint.file_problems()) else pairing_evidence(session.checkpoint, session.engine)
        click.echo(schema_skeleton(session.metadata, session.exchanges, checkpoint, evidence), nl=False)


@cli.command()
@click.argument("checkpoint")
@session_options
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="The Parquet file to write.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def records(checkpoint, schema, plan, engine, spark_master, conf, out, as_json) -> None:
    """Write every in-flight record of CHECKPOINT to a Parquet file: exchange, subtasks, channel,
    timestamp, key, key hash, key group, owning subtask, and the value (decoded where typed)."""
    import json

    from ckpt_tool.ops.records import export_records

    ship_pyarrow = ("spark.ckpt.shipPackages=pyarrow",)  # executors write Parquet: a cluster needs pyarrow
    with open_session(checkpoint, schema, plan, engine, spark_master, ship_pyarrow + tuple(conf)) as session:
        with progress_bar("exporting in-flight records", enabled=not as_json) as session.progress:
            report = export_records(session.checkpoint, session.described_exchanges, session.engine, out, session.progress)
    if as_json:
        click.echo(json.dumps(report.as_dict()))
    else:
        written = f"{report.records} records of {report.exchanges} exchanges ({report.channels} channels)"
        click.echo(f"{written} written to {printable(out)}")


@cli.command("list")
@click.argument("job_dir")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def list_command(job_dir, as_json) -> None:
    """List the checkpoints (chk-<n>) and savepoints in JOB_DIR, a job's checkpoint directory
    (…/<job-id>/), newest first: id, complete or not, size, in-flight bytes, parallelism per
    operator, and whether the checkpoint looks inflated (channel-state handles replicated across
    an operator's subtasks). Read from each _metadata alone.

    Any command given a job directory as CHECKPOINT or SRC uses its newest complete checkpoint.
    """
    from ckpt_tool.ops.listing import list_checkpoints

    output_for(as_json).listing(list_checkpoints(job_dir))


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in args or "--verbose" in args
    keep_heap_top()  # one command per process: freed memory is reused, not mapped and zeroed again
    try:
        cli.main(args=args, prog_name="ckpt", standalone_mode=False)
    except CkptError as exc:
        if verbose:
            traceback.print_exc()
        click.echo(f"ckpt: error: {one_line(str(exc))}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except click.ClickException as exc:
        import io

        shown = io.StringIO()
        exc.show(file=shown)  # usage and message; what the user typed is shown literally
        click.echo("\n".join(printable(line, LINE_LIMIT) for line in shown.getvalue().splitlines()), err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("ckpt: aborted", err=True)
        sys.exit(1)
    except Exception as exc:  # a bug: one line unless --verbose
        if verbose:
            traceback.print_exc()
        click.echo(f"ckpt: internal error: {type(exc).__name__}: {one_line(str(exc))} (run with --verbose for details)", err=True)
        sys.exit(EXIT_INTERNAL)


if __name__ == "__main__":
    main()
