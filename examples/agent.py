"""A user's own pydantic-ai agent, served with the tools of the user's page.

    clienttools-server --agent examples.agent:agent --static examples --static build/web
    clienttools-server --agent examples.agent:agent --model anthropic:claude-sonnet-4-5

The agent has its instructions and one tool of its own, which runs in the
server (``exchange_rate``); each session's page tools are added to it per run,
so the model can call both in one response. Without ``--model`` the agent's
own model answers, or the offline scripted one when it has none: then write
``call exchange_rate {"base": "EUR", "quote": "USD"}``.
"""

from __future__ import annotations

from pydantic_ai import Agent

# Fixed rates, so the example needs no network; a real tool would ask a service.
RATES = {("EUR", "USD"): 1.08, ("USD", "EUR"): 0.93, ("EUR", "GBP"): 0.85, ("GBP", "EUR"): 1.18}

agent = Agent(
    name="example",
    instructions=(
        "You help the user with their page. The page's own tools read and change what the "
        "user sees; call them when the user asks about the page. Answer briefly."
    ),
)


@agent.tool_plain
def exchange_rate(base: str, quote: str) -> float:
    """How many units of ``quote`` one unit of ``base`` buys (ISO 4217 codes, e.g. EUR, USD)."""
    if base == quote:
        return 1.0
    try:
        return RATES[(base.upper(), quote.upper())]
    except KeyError:
        raise ValueError(f"no rate for {base}/{quote}") from None
