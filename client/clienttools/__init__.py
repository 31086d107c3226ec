"""clienttools: Python tools that live in the browser, called by a server-side agent."""

from __future__ import annotations

__version__ = "0.1.0"
