"""Start-up cost: ``import harness`` and ``harness --help``, each in a fresh interpreter.

Neither may import TensorFlow (~2 s): a regression that does shows here as a jump.
"""

from __future__ import annotations


def timeraw_import_harness():
    return "import harness"


def timeraw_cli_help():
    # timeraw reads the child's stdout for its timing: the help text must not reach it.
    return """
        import contextlib, io
        from harness.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            status = main(["--help"])
        assert status == 0, status
    """
