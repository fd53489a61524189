from __future__ import annotations

from ckpt_tool.cli.main import main


def run_ckpt(capsys, *args: str) -> tuple[int, str, str]:
    """Run the ckpt command in-process; returns (exit code, stdout, stderr)."""
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err
