"""The session every operation works in: one checkpoint, the exchanges a plan and a schema
describe, and the engine that runs record work.

A session owns its engine: it makes it on first need (``auto`` chooses by the checkpoint's
in-flight bytes), can start it early in the background, and stops it when the session closes,
whatever the operation did. Errors that tasks raise come back through the engine as ckpt's own.

    with Session.open(uri, schema=..., plan=...) as session:
        report = inspect(session)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from ckpt_tool.engine import Engine, Progress, make_engine
from ckpt_tool.exchanges import resolve_partitions
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.plan import JobPlan, load_job_plan
from ckpt_tool.records.described import load_exchanges
from ckpt_tool.records.key_serializer import check_key_types
from ckpt_tool.records.schema import Exchange


@dataclass
class Session:
    checkpoint: Checkpoint
    exchanges: Optional[list[Exchange]] = None  # None: neither a plan nor a schema was given
    plan: Optional[JobPlan] = None
    engine_choice: Union[str, Engine] = "auto"  # auto, local, spark, or an engine the caller owns
    spark_master: Optional[str] = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    quiet: bool = True  # Spark's own logging off
    progress: Progress = None
    warnings: list[str] = field(default_factory=list)  # the engine's, kept when it stops
    notes: list[str] = field(default_factory=list)  # what was derived from the bytes (output partitions)
    _engine: Optional[Engine] = field(default=None, repr=False)

    @staticmethod
    def open(
        uri: str,
        schema: Optional[str] = None,
        plan: Optional[str] = None,
        engine: Union[str, Engine] = "auto",
        spark_master: Optional[str] = None,
        spark_conf: Optional[dict[str, str]] = None,
        require_files: bool = True,
        quiet: bool = True,
        sql_plan: Optional[str] = None,
        plugins: tuple[str, ...] = (),
    ) -> Session:
        """Open a checkpoint and read its plan and schema. ``require_files``: fail at once when a
        file the metadata references is missing or not its recorded size. ``plugins``: the modules
        (named with --plugin) whose functions the schema's decoders may be."""
        checkpoint = Checkpoint.open(uri)
        if require_files:
            checkpoint.require_files()
        job_plan = load_job_plan(plan, checkpoint.metadata) if plan else None
        described = schema or plan or sql_plan
        notes: list[str] = []
        exchanges = (
            load_exchanges(checkpoint.metadata, schema, job_plan, sql_plan, unstated_ok=True, notes=notes, plugins=plugins)
            if described
            else None
        )
        check_key_types(checkpoint, exchanges)  # a key type the keyed state contradicts is refused before any work
        session = Session(checkpoint, exchanges, job_plan, engine, spark_master, dict(spark_conf or {}), quiet, notes=notes)
        if exchanges:  # output partitions the plan does not pair with its consumers: from the bytes
            try:
                session.notes += resolve_partitions(checkpoint, exchanges, lambda: session.engine)
            except BaseException:
                session.close()
                raise
        return session

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def metadata(self):
        return self.checkpoint.metadata

    @property
    def described_exchanges(self) -> list[Exchange]:
        return self.exchanges or []

    def in_flight_bytes(self) -> int:
        """Channel-state payload bytes, from the metadata alone."""
        return sum(
            h.payload_bytes for op in self.metadata.operators for s in op.subtasks for h in s.input_channels + s.output_channels
        )

    @property
    def engine(self) -> Engine:
        if isinstance(self.engine_choice, Engine):
            return self.engine_choice
        if self._engine is None:
            self._engine = make_engine(self.engine_choice, self.in_flight_bytes(), self.spark_master, self.spark_conf, self.quiet)
        return self._engine

    @property
    def engine_name(self) -> str:
        return self.engine.name

    def start_engine(self) -> None:
        """Let the engine get ready in the background while the driver does its own work."""
        self.engine.start()

    def close(self) -> None:
        """Stop the engine the session made (an engine passed in stays its caller's)."""
        if self._engine is not None:
            self.warnings = list(self._engine.warnings)
            self._engine.stop()
            self._engine = None
