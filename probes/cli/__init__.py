"""`skewprobe ...`: every subcommand, its options, its output and its exit code.

`_main` builds the parser and dispatches (`run`, `validate`, `verdict` are its own); the
other subcommands each have a module: `inventory`, `plan` (its table and Markdown in
`_plan_format`), `report`, `demo`. `_stdout` is their output, quiet when the reader goes
away. Run as the console script `skewprobe` or as `python -m probes.cli`.
"""

from probes.cli._main import EXIT_STDOUT_CLOSED, build_parser, main

__all__ = ["EXIT_STDOUT_CLOSED", "build_parser", "main"]
