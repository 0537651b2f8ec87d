"""What ``jaxgen bench`` needs beyond the core install: the ``bench`` extra (charts, peers, HTTP)."""

from __future__ import annotations

import importlib

INSTALL = "pip install 'jaxgen[bench]'"


class MissingExtra(ImportError):
    """A dependency of the ``bench`` extra is not installed."""


def require(module: str, needed_for: str):
    """Imports ``module`` (a third-party one) or raises ``MissingExtra`` naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingExtra(
            f"{needed_for} needs {module.split('.')[0]}, which the core install leaves out: {INSTALL}"
        ) from error
