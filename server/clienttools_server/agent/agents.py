"""The agent a server runs: a plain one, or a user's pydantic-ai Agent (``--agent module:attr``).

Each session's page tools are added to the agent per run; the agent keeps its
instructions, its tools and its model (``--model`` replaces the model).

    >>> try:
    ...     load_agent("json:loads")
    ... except AgentLoadError as exc:
    ...     print(exc)
    'json:loads' is not a pydantic-ai Agent (it is a function)
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from pydantic_ai import Agent


class AgentLoadError(ValueError):
    """``--agent`` names nothing servable; the message says what is wrong."""


def default_agent() -> Agent[None, Any]:
    """The agent of a server started without ``--agent``: no instructions, no tools of its own."""
    return Agent(name="clienttools")


def load_agent(ref: str) -> Agent[None, Any]:
    """The Agent at ``module:attr`` (``module`` importable from the current directory)."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise AgentLoadError(
            f"--agent takes module:attr, such as examples.agent:agent, not {ref!r}"
        )
    if os.getcwd() not in sys.path and "" not in sys.path:
        # As ``python -m`` does: the current directory's modules can be named.
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AgentLoadError(f"cannot import {module_name!r} for --agent: {exc}") from None
    found: object = module
    for name in attr.split("."):
        if not hasattr(found, name):
            raise AgentLoadError(f"{module_name!r} has no attribute {attr!r}")
        found = getattr(found, name)
    if not isinstance(found, Agent):
        kind = "a function" if callable(found) else type(found).__name__
        raise AgentLoadError(f"{ref!r} is not a pydantic-ai Agent (it is {kind})")
    agent: Agent[None, Any] = found
    return agent
