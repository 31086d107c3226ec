"""The model a ``--model`` name stands for: any pydantic-ai model name, or ``scripted``.

``scripted`` (the default) is deterministic and offline; ``test`` is
pydantic-ai's TestModel, which calls every tool with generated arguments; any
``provider:model`` name (``openai:gpt-4o``, ``anthropic:claude-sonnet-4-5``,
``google-gla:gemini-2.5-flash``, ``groq:llama-3.3-70b-versatile``) is a real
model whose key comes from the provider's usual environment variable. A name
that cannot be served is a :class:`ModelChoiceError` whose message says what
to do, in one line.

    >>> choose_model("scripted").model_name
    'scripted'
    >>> try:
    ...     choose_model("nonsense")
    ... except ModelChoiceError as exc:
    ...     print(exc)  # doctest: +ELLIPSIS
    unknown model 'nonsense': use 'scripted', 'test' or a pydantic-ai model name such as ...
"""

from __future__ import annotations

from pydantic_ai.exceptions import UserError
from pydantic_ai.models import Model, infer_model

from .scripted import SCRIPTED, scripted_model

# Older pydantic-ai provider prefixes, still the names people know.
_ALIASES = {"google-gla": "google", "google-vertex": "google-cloud"}
# pydantic-ai provider -> the clienttools-server extra that installs its SDK.
_EXTRAS = {
    "openai": "openai",
    "anthropic": "anthropic",
    "google": "google",
    "google-cloud": "google",
    "groq": "groq",
}


class ModelChoiceError(ValueError):
    """The model name cannot be served; the message says what to do."""


def choose_model(name: str, *, first_chunk_delay: float = 0.0, chunk_delay: float = 0.0) -> Model:
    """The model for ``name``; the delays pace the scripted model only."""
    if name == SCRIPTED:
        return scripted_model(first_chunk_delay=first_chunk_delay, chunk_delay=chunk_delay)
    provider, sep, rest = name.partition(":")
    wanted = f"{_ALIASES.get(provider, provider)}:{rest}" if sep else name
    try:
        return infer_model(wanted)
    except ImportError:
        extra = _EXTRAS.get(_ALIASES.get(provider, provider), provider)
        raise ModelChoiceError(
            f"the model {name!r} needs its provider's package: "
            f"pip install 'clienttools-server[{extra}]'"
        ) from None
    except UserError as exc:
        message = " ".join(str(exc).split())
        if message.startswith("Unknown model"):
            raise ModelChoiceError(
                f"unknown model {name!r}: use 'scripted', 'test' or a pydantic-ai model name "
                "such as 'openai:gpt-4o'"
            ) from None
        # Most often a missing API key: pydantic-ai names the environment variable.
        raise ModelChoiceError(f"the model {name!r} cannot be used: {message}") from None
