"""Files in the cache directory written whole: under a temporary name, then renamed into place,
so a reader sees all of a file or none, and processes writing the same file at once each
rename a complete one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_write(path: Path) -> Iterator:
    """A binary file handle whose contents replace ``path`` when the block ends; on an error
    the temporary file is removed and the error raised (``OSError`` for a directory that
    cannot be written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", delete=False)
    try:
        with handle:
            yield handle
        os.replace(handle.name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(handle.name)
        raise
