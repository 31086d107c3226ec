"""clienttools mounted in a FastAPI app, beside the app's own routes.

    uvicorn examples.fastapi_app:app --port 8000
    # the page connects to ws://127.0.0.1:8000/clienttools/agents/chat/{session}
    # a useChat() page posts to http://127.0.0.1:8000/clienttools/agents/chat/{session}

``create_app`` returns an ASGI app serving the agent with each session's page
tools. A mounted app's lifespan does not run by itself, so the FastAPI app
runs it in its own (that starts the ledger and the run supervisor).
"""

from __future__ import annotations

from examples.agent import agent
from fastapi import FastAPI

from clienttools_server.app import create_app
from clienttools_server.config import ServerConfig

clienttools = create_app(ServerConfig(), agent=agent)
app = FastAPI(lifespan=lambda _: clienttools.router.lifespan_context(clienttools))
app.mount("/clienttools", clienttools)


@app.get("/health")
def health() -> dict[str, str]:
    """One of the app's own routes."""
    return {"status": "ok"}
