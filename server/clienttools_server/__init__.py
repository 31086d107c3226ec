"""clienttools_server: the reference server that drives clienttools pages."""

from __future__ import annotations

__version__ = "0.1.0"
