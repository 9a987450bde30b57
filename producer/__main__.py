"""``python -m producer`` is the ``rollq`` command."""

from .cli import main

main(prog_name="rollq")
