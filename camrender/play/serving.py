"""Running an aiohttp application until SIGINT or SIGTERM, for `camrender play` and `camrender serve`: the web
server listens, and on the signal the application's own stop runs before the web server's, so that what its long
requests wait for (a flight, a render) ends first and the web server then closes within seconds.

    await run_until_signal(app, "127.0.0.1", 0, on_ready=print, stopping=server.close)
"""
from __future__ import annotations

import asyncio
import signal
from typing import Awaitable, Callable, Optional

from aiohttp import web

# Seconds the requests still running get once the web server closes (aiohttp's default, 60 s, held a stop that
# long): every long request of play and serve ends with its server's own stop, which comes first
SHUTDOWN_TIMEOUT_S = 5.0
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def base_url(host: str, port: int) -> str:
    """http://HOST:PORT (an IPv6 address in brackets)."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


async def listen(app: web.Application, host: str, port: int) -> tuple:
    """(the aiohttp runner, the port) of `app` listening on host:port (0: a free port); `runner.cleanup()` closes
    it, giving the requests still running SHUTDOWN_TIMEOUT_S seconds."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner, runner.addresses[0][1]


async def run_until_signal(app: web.Application, host: str, port: int, on_ready: Callable[[int], None], *,
                           stopping: Callable[[], Awaitable[None]],
                           stopped: Optional[Callable[[], Awaitable[None]]] = None) -> None:
    """Serve `app` on host:port until SIGINT or SIGTERM; `on_ready(port)` once it listens. Then, in this order:
    `await stopping()` (the application's own stop), the web server closes (`listen`), `await stopped()`. The
    signals stay caught until all of it is done: a second one does not cut the stop short (SIGKILL does)."""
    runner, port = await listen(app, host, port)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in SIGNALS:
        loop.add_signal_handler(signum, done.set)
    try:
        try:
            on_ready(port)
            await done.wait()
        finally:
            try:
                await stopping()
            finally:
                await runner.cleanup()
        if stopped is not None:
            await stopped()
    finally:
        for signum in SIGNALS:
            loop.remove_signal_handler(signum)
