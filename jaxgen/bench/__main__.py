"""``python -m jaxgen.bench ...`` is ``jaxgen bench ...``."""

import sys

from jaxgen.cli import main

if __name__ == "__main__":
    sys.argv[0] = "jaxgen"
    sys.argv.insert(1, "bench")
    sys.exit(main(sys.argv[1:]))
