"""``transformers`` imported on first use, without its advisory warnings.

jaxgen uses transformers for tokenizers and chat templates only. Its import takes a second, so
nothing imports it before a tokenizer is built; and without torch it logs "PyTorch was not
found. Models won't be available ..." at import, advice for its own model classes, which jaxgen
never uses.
"""

from __future__ import annotations

import functools
import os

_QUIET = "TRANSFORMERS_NO_ADVISORY_WARNINGS"


@functools.cache
def transformers():
    """The ``transformers`` module (its advisory warnings silenced while it imports, unless the
    user set ``TRANSFORMERS_NO_ADVISORY_WARNINGS`` themselves)."""
    previous = os.environ.get(_QUIET)
    os.environ[_QUIET] = previous if previous is not None else "1"
    try:
        import transformers as module
    finally:
        if previous is None:
            del os.environ[_QUIET]
    return module
