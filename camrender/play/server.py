"""The `camrender play` web server (aiohttp): the page, a WebSocket for controls and frames, the flights.

    GET /      the page (`page.html`, plain HTML and JavaScript)
    GET /ws    the WebSocket

With a token (any host other than loopback needs one) every request must carry `?token=...`; others
get 403. A WebSocket from a page of another origin gets 403 too (a web page cannot steer the user's
local server). The first page connected steers; later ones watch (frames, no controls) until it leaves.

Page -> server, text messages of at most MAX_MESSAGE bytes, JSON:
    {"type": "key", "key": "w", "down": true, "id": 7}   a browser key (w a s d ArrowUp ...) pressed/released
    {"type": "stop"}  {"type": "restart"}                  stop (save) / save and fly again with a new seed
Anything else (bad JSON, unknown type or key, oversized, binary, from a watcher) is dropped and counted.

Server -> page: text JSON {"type": "hello" | "segment" | "ended" | "started", ...} and, per frame, a binary
message: 8 bytes (uint32 flight number, uint32 video frame index, little endian) then the frame as JPEG.
The steering page's flight starts when it connects and stops (saved) when it leaves or presses Stop.
"""
from __future__ import annotations

import asyncio
import hmac
import io
import ipaddress
import json
import random
import signal
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

import numpy as np
from aiohttp import WSMsgType, web
from PIL import Image

from camrender.play.session import Flight, Segment
from camrender.play.steering import KeyTimeline, scheme_letter

MAX_MESSAGE = 512  # bytes: a control message is a few dozen
SOCKET_LIMIT = 1 << 20  # aiohttp closes a connection whose message passes this (protocol-level guard)
JPEG_QUALITY = 85
PAGE = Path(__file__).with_name("page.html")


def encode_jpeg(frame: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    """uint8 (H, W, 3) RGB -> JPEG bytes (Pillow; it releases the GIL while it encodes)."""
    out = io.BytesIO()
    Image.fromarray(frame).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def frame_message(flight_number: int, index: int, jpeg: bytes) -> bytes:
    return struct.pack("<II", flight_number, index) + jpeg


class PlayServer:
    """Serves the page and runs flights of `template` (`camrender.play.session.Flight`).

    pipe: the loaded pipeline; template: segment-mode `RenderRequest` (traj None, num_frames the longest
    clip); scheme: the control scheme; stem: a path without suffix, the first flight is saved as
    `stem`, the next ones as `stem-2`, `stem-3`, ...; token: None, or the secret every request carries;
    pace: flights keep pace with real-time playback (`Flight`).
    """

    def __init__(self, pipe, template, scheme, stem: Path, *, token: Optional[str] = None,
                 log: Callable[[str], None] = lambda line: None, encoders: int = 4, pace: bool = True):
        self.pace = pace
        self.pipe, self.template, self.scheme, self.stem = pipe, template, scheme, Path(stem)
        self.token, self.log = token, log
        self.flight: Optional[Flight] = None
        self.flights = 0
        self.timeline = KeyTimeline()
        self.steering: Optional[web.WebSocketResponse] = None
        self.sockets: set = set()
        self.dropped = {"malformed": 0, "oversized": 0, "binary": 0, "watcher": 0}
        self.saved: list = []  # the `saved` dict of each ended flight
        self.press_times = {}  # press id -> server clock when it arrived
        self.latencies = []  # seconds from a press's arrival to the send of the first frame reflecting it
        self._encoders = ThreadPoolExecutor(encoders, thread_name_prefix="camrender-jpeg")
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._outgoing: Optional[asyncio.Queue] = None
        self._sender: Optional[asyncio.Task] = None
        self.app = web.Application(middlewares=[self._guard])
        self.app.router.add_get("/", self._page)
        self.app.router.add_get("/ws", self._socket)
        self.app.on_startup.append(self._on_startup)
        self.app.on_shutdown.append(self._on_shutdown)

    # --- requests -------------------------------------------------------------------------------
    @web.middleware
    async def _guard(self, request, handler):
        if self.token is not None and not hmac.compare_digest(request.query.get("token", ""), self.token):
            raise web.HTTPForbidden(text="camrender play: a valid token is needed (use the URL it printed)\n")
        origin = request.headers.get("Origin")
        if request.path == "/ws" and origin is not None and origin.split("://", 1)[-1] != request.host:
            raise web.HTTPForbidden(text="camrender play: WebSocket from another origin\n")
        return await handler(request)

    async def _page(self, request):
        return web.Response(text=PAGE.read_text(), content_type="text/html", headers={"Cache-Control": "no-store"})

    async def _socket(self, request):
        ws = web.WebSocketResponse(max_msg_size=SOCKET_LIMIT, heartbeat=30)
        await ws.prepare(request)
        self.sockets.add(ws)
        steer = self.steering is None
        if steer:
            self.steering = ws
        r = self.template
        await ws.send_json({"type": "hello", "role": "steer" if steer else "watch", "fps": r.fps, "width": r.width,
                            "height": r.height, "flight": self.flights})
        if steer:
            await self._start_flight(seed=r.seed if self.flights == 0 else None)
        try:
            async for message in ws:
                if ws is self.steering:
                    await self._handle(message)
                elif message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    self.dropped["watcher"] += 1
        finally:
            self.sockets.discard(ws)
            if ws is self.steering:  # the steering page left: its flight is saved
                self.steering = None
                self.timeline.release_all()
                await self._stop_flight()
        return ws

    def _parse(self, message) -> Optional[dict]:
        """The control of a message, or None (counted in `dropped`)."""
        if message.type == WSMsgType.BINARY:
            self.dropped["binary"] += 1
            return None
        if message.type != WSMsgType.TEXT:
            return None
        if len(message.data.encode("utf-8", "replace")) > MAX_MESSAGE:
            self.dropped["oversized"] += 1
            return None
        try:
            control = json.loads(message.data)
        except ValueError:
            control = None
        ok = isinstance(control, dict) and control.get("type") in ("key", "stop", "restart")
        if ok and control["type"] == "key":
            press_id = control.get("id")
            ok = (scheme_letter(control.get("key", "")) is not None and isinstance(control.get("down"), bool)
                  and (press_id is None or (isinstance(press_id, int) and not isinstance(press_id, bool))))
        if not ok:
            self.dropped["malformed"] += 1
            return None
        return control

    async def _handle(self, message) -> None:
        control = self._parse(message)
        if control is None:
            return
        if control["type"] == "key":
            letter = scheme_letter(control["key"])
            if control["down"]:
                press_id = control.get("id")
                if press_id is not None:
                    self.press_times[press_id] = time.monotonic()
                self.timeline.press(letter, press_id)
            else:
                self.timeline.release(letter)
        elif control["type"] == "stop":
            await self._stop_flight()
        else:
            await self._stop_flight()
            await self._start_flight(seed=None)

    # --- flights ----------------------------------------------------------------------------------
    def _next_stem(self) -> Path:
        return self.stem if self.flights == 1 else self.stem.with_name(f"{self.stem.name}-{self.flights}")

    async def _start_flight(self, seed=None) -> None:
        if self.flight is not None and not self.flight.ended.is_set():
            return
        self.flights += 1
        seed = random.SystemRandom().randrange(2**31) if seed is None else seed
        self.timeline = KeyTimeline()  # a fresh clock window: the first segment takes the keys held now
        self.flight = Flight(self.pipe, self.template, seed, self._next_stem(), self.scheme, self.timeline,
                             on_segment=self._segment_from_thread, on_end=self._end_from_thread, log=self.log,
                             pace=self.pace)
        self.log(f"flight {self.flights}: seed {seed}, saved as {self.flight.stem}.*")
        await self._broadcast_json({"type": "started", "flight": self.flights, "seed": seed})
        self.flight.start()

    async def _stop_flight(self) -> None:
        flight = self.flight
        if flight is not None and not flight.ended.is_set():
            await asyncio.get_running_loop().run_in_executor(None, flight.stop)
            await self._drain()

    async def _drain(self) -> None:
        if self._outgoing is not None:
            await self._outgoing.join()

    def _segment_from_thread(self, flight: Flight, segment: Segment) -> None:
        self._loop.call_soon_threadsafe(self._outgoing.put_nowait, ("segment", flight, segment))

    def _end_from_thread(self, flight: Flight) -> None:
        self._loop.call_soon_threadsafe(self._outgoing.put_nowait, ("ended", flight, None))

    async def _send_all(self) -> None:
        """Encode and send the segments in order (one task: frames never overtake each other)."""
        loop = asyncio.get_running_loop()
        while True:
            kind, flight, segment = await self._outgoing.get()
            try:
                number = self.flights if flight is self.flight else 0
                if kind == "segment":
                    # all frames encode at once; each is sent as soon as it and the ones before it are ready, so
                    # the segment's first frame (the one a press reflects) does not wait for its last
                    jpegs = [loop.run_in_executor(self._encoders, encode_jpeg, frame) for frame in segment.frames]
                    await self._broadcast_json({
                        "type": "segment", "flight": number, "index": segment.index, "first": segment.first,
                        "count": len(segment.frames), "reflected": {str(k): v for k, v in segment.reflected.items()},
                        "rate": round(segment.rate, 2), "dropped": sum(self.dropped.values())})
                    try:
                        for offset, jpeg in enumerate(jpegs):
                            index = segment.first + offset
                            await self._broadcast_bytes(frame_message(number, index, await jpeg))
                            for press_id in [p for p, frame in segment.reflected.items() if frame == index]:
                                if press_id in self.press_times:
                                    self.latencies.append(time.monotonic() - self.press_times.pop(press_id))
                    finally:  # after a failed send or encode, collect the other encodes (and their errors)
                        await asyncio.gather(*jpegs, return_exceptions=True)
                else:
                    saved = {key: str(path) for key, path in flight.saved.items()}
                    self.saved.append(saved)
                    if saved:
                        self.log(f"saved {', '.join(saved.values())}")
                    await self._broadcast_json({"type": "ended", "flight": number, "frames": flight.shown,
                                                "segments": flight.segments, "saved": saved,
                                                "error": None if flight.error is None else str(flight.error)})
            except Exception as error:  # a page that went away mid-send must not end the sender
                self.log(f"sending failed: {error}")
            finally:
                self._outgoing.task_done()

    async def _broadcast_json(self, data: dict) -> None:
        await self._broadcast(json.dumps(data), text=True)

    async def _broadcast_bytes(self, data: bytes) -> None:
        await self._broadcast(data, text=False)

    async def _broadcast(self, data, text: bool) -> None:
        for ws in list(self.sockets):
            if ws.closed:
                continue
            try:
                await (ws.send_str(data) if text else ws.send_bytes(data))
            except (ConnectionError, RuntimeError):
                pass

    # --- lifetime ----------------------------------------------------------------------------------
    async def _on_startup(self, app) -> None:
        self._loop = asyncio.get_running_loop()
        self._outgoing = asyncio.Queue()
        self._sender = asyncio.create_task(self._send_all())

    async def close(self) -> None:
        """Stop (and save) the flight, tell the pages ("ended"), close their sockets; idempotent. `serve` calls it
        before the web server begins its own shutdown, which would close the sockets of a flight that takes
        longer than aiohttp's grace to reach its segment boundary, "ended" unsent."""
        await self._stop_flight()
        for ws in list(self.sockets):
            await ws.close(code=1001, message=b"server stopping")
        if self._sender is not None:
            self._sender.cancel()
            self._sender = None
        self._encoders.shutdown(wait=False)

    async def _on_shutdown(self, app) -> None:
        await self.close()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def page_url(host: str, port: int, token: Optional[str]) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


async def serve(server: PlayServer, host: str, port: int, on_ready: Callable[[str], None]) -> None:
    """Run `server` on host:port (0: any free port) until SIGINT or SIGTERM; `on_ready(url)` once it listens.
    On the signal the flight stops and is saved before this returns."""
    runner = web.AppRunner(server.app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    port = runner.addresses[0][1]
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, done.set)
    try:
        on_ready(page_url(host, port, server.token))
        await done.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await server.close()
        await runner.cleanup()
