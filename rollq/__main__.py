"""``python -m rollq`` is the ``rollq`` command."""

from rollq.ops.cli import main

main(prog_name="rollq")
