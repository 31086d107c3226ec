"""The scripted model, counting its requests across server processes (``--agent``).

With ``LEASE_AGENT_REQUESTS=PATH`` in the environment each model request
appends one line to PATH: the first line of the chat's prompt and how many
model answers came before in the run, so a test can tell whether a model step
recorded by one process was requested again by the process that took the
run over. With ``LEASE_AGENT_HOLD=PATH``, a request does not answer while the
file PATH exists: a test can stop the process in the middle of a model step.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCalls, FunctionModel

from clienttools_server.agent.scripted import answer


def _count_request(messages: list[ModelMessage]) -> None:
    path = os.environ.get("LEASE_AGENT_REQUESTS")
    if not path:
        return
    prompt = next(
        (
            p.content
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, UserPromptPart) and isinstance(p.content, str)
        ),
        "",
    )
    step = sum(isinstance(m, ModelResponse) for m in messages)
    with open(path, "a") as handle:
        handle.write(json.dumps([prompt.splitlines()[0] if prompt else "", step]) + "\n")


async def _counted(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls]:
    _count_request(messages)
    hold = os.environ.get("LEASE_AGENT_HOLD")
    while hold and os.path.exists(hold):
        await asyncio.sleep(0.005)
    for event in answer(messages, info):
        yield event


counted = Agent(FunctionModel(stream_function=_counted, model_name="counted-scripted"))
