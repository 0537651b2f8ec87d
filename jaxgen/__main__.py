"""``python -m jaxgen`` runs the command line."""

from jaxgen.cli import run

run()
