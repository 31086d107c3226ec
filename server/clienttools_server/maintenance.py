"""The hub's two clocks: leases renewed and taken over, paused runs expired, the old pruned.

Both loops run for the life of the server and survive a failed round (the
ledger away a moment): the next round tries again.

- every third of the lease (S8): renew this process's leases, stop the runs
  another process took over, take over and resume the runs whose lease lapsed,
  and drop the calls whose page was on a process that is gone;
- every ``expiry_interval`` (shorter if the TTL or the retention is): expire
  the runs paused past the TTL and forget what is past the retention.

    maintenance = Maintenance(config, ledger, clock, runs, proxy, approvals, ...)
    await maintenance.start()    # one round of each now, then the loops
    await maintenance.close()
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from .agent.chunk_log import FinishedResponses
from .agent.conversations import Conversations
from .agent.launcher import RunLauncher
from .calls.approvals import Approvals
from .calls.proxy import CallProxy
from .clock import Clock, sleep
from .cluster.routing import EXPIRED, EXPIRED_PER_NOTIFICATION, Peers
from .config import ServerConfig
from .ledger import Ledger, LedgerUnavailable

if TYPE_CHECKING:
    from .cluster.shared_streams import SharedStreams

logger = logging.getLogger(__name__)


class Maintenance:
    """The lease loop and the expiry loop of one hub."""

    def __init__(
        self,
        config: ServerConfig,
        ledger: Ledger,
        clock: Clock,
        runs: RunLauncher,
        proxy: CallProxy,
        approvals: Approvals,
        conversations: Conversations,
        finished: FinishedResponses,
        *,
        peers: Peers | None,
        shared: SharedStreams | None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.clock = clock
        self.runs = runs
        self.proxy = proxy
        self.approvals = approvals
        self.conversations = conversations
        self.finished = finished
        self.peers = peers
        self.shared = shared
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Expire what outlived its TTL, take over and resume unfinished runs whose lease
        lapsed (S8), start the expiry clock and the lease's heartbeat."""
        await self.ledger.keep_alive(self.clock.now())
        await self.expire_now()
        await self.prune_now()
        await self.runs.take_over_now()
        self._tasks = [
            asyncio.create_task(self._expire_periodically()),
            asyncio.create_task(self._keep_leases()),
        ]

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _keep_leases(self) -> None:
        # A third of the lease: two renewals may be late (a busy loop, a slow
        # database) before the lease lapses.
        period = self.config.lease / 3
        while True:
            await sleep(self.clock, period)
            try:
                live = await self.ledger.keep_alive(self.clock.now())
                if self.peers is not None:
                    self.peers.refresh()
                await self.proxy.relay.targets_lost(live)
                await self.runs.renew_now()
                await self.runs.take_over_now()
            except LedgerUnavailable as exc:
                logger.warning("renewing or taking over leases: %s", exc)
            except Exception:
                logger.exception("renewing or taking over leases failed")

    async def expire_now(self) -> list[str]:
        expired = await self.ledger.expire_paused(self.config.ttl, self.clock.now())
        if expired:
            logger.info("expired runs: %s", ", ".join(expired))
            await self.proxy.wake_expired(expired)
            self.approvals.wake_expired(expired)
            if self.peers is not None:
                for start in range(0, len(expired), EXPIRED_PER_NOTIFICATION):
                    chunk = expired[start : start + EXPIRED_PER_NOTIFICATION]
                    await self.ledger.notify(None, EXPIRED, *chunk)
        return expired

    async def prune_now(self) -> int:
        """Forget finished executions past the retention, and finished responses past grace."""
        self.finished.prune()
        if self.shared is not None:
            await self.shared.prune(self.clock.now())
        pruned = await self.ledger.prune_finished(self.config.finished_retention, self.clock.now())
        if pruned:
            logger.debug("pruned %d finished executions", pruned)
        # A chat lives the same retention after its last change.
        chats = await self.conversations.prune(self.config.finished_retention)
        if chats:
            logger.debug("pruned %d chats", chats)
        # And a session's tools, once no run of it can be replayed.
        tools = await self.ledger.prune_session_tools(
            self.config.finished_retention, self.clock.now()
        )
        if tools:
            logger.debug("pruned %d remembered tools", tools)
        return pruned

    async def _expire_periodically(self) -> None:
        # A TTL (or retention) shorter than the check interval would otherwise be
        # overrun by up to a whole interval (a 1 s TTL checked once a minute).
        config = self.config
        period = min(config.expiry_interval, config.ttl / 2, config.finished_retention / 2)
        while True:
            await sleep(self.clock, period)
            try:
                await self.expire_now()
                await self.prune_now()
            except Exception:
                logger.exception("expiring runs failed")
