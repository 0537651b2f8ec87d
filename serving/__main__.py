"""``python -m serving --model DIR ...``: the same server as ``jaxgen serve``."""

import sys

from serving.launch.cli import main

sys.exit(main())
