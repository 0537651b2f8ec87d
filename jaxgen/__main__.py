"""``python -m jaxgen`` runs the command line."""

import sys

from jaxgen.cli import main

sys.exit(main())
