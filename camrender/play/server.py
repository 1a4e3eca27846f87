"""The `camrender play` web server (aiohttp): the page, a WebSocket for controls and frames, the flights.

    GET /              the page (`page.html`, plain HTML and JavaScript)
    GET /ws            the WebSocket
    GET /favicon.svg   the page's icon (also /favicon.ico)

With a token (any host other than loopback needs one) every request but the icon's must carry `?token=...`;
others get 403. Without one (loopback) a request must name this machine in its Host header (`localhost` or a
loopback address, any port): a web page whose name was made to resolve to 127.0.0.1 (DNS rebinding) gets 403.
A WebSocket from a page of another origin gets 403 too (a web page cannot steer the user's local server).
The first page connected steers; later ones watch (frames, no controls) until it leaves. When the steering
page leaves, its flight waits `reload_grace` seconds at the next segment boundary for a page to steer it
again (a reload keeps the flight), then stops and is saved.

Page -> server, text messages of at most MAX_MESSAGE bytes, JSON:
    {"type": "key", "key": "w", "down": true, "id": 7}   a browser key (w a s d ArrowUp ...) pressed/released
    {"type": "stop"}  {"type": "restart"}                  stop (save) / save and fly again with a new seed
Anything else (bad JSON, unknown type or key, oversized, binary, from a watcher) is dropped and counted.

Server -> page: text JSON {"type": "hello" | "started" | "status" | "segment" | "ended", ...} and, per frame, a binary
message: 8 bytes (uint32 flight number, uint32 video frame index, little endian) then the frame as JPEG.
The steering page's flight starts when it connects and stops (saved) when it presses Stop or has been gone for
`reload_grace` seconds.
"""
from __future__ import annotations

import asyncio
import hmac
import io
import ipaddress
import json
import random
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

import numpy as np
from aiohttp import WSMsgType, web
from PIL import Image

from camrender.play.serving import base_url, run_until_signal
from camrender.play.session import Flight, Segment
from camrender.play.steering import KeyTimeline, scheme_letter

MAX_MESSAGE = 512  # bytes: a control message is a few dozen; longer ones are dropped and counted
# aiohttp buffers a whole message before the server sees it and closes a connection whose message passes this:
# the bound on that memory, far above any message a page sends by mistake
SOCKET_LIMIT = 16 << 20
JPEG_QUALITY = 85
RELOAD_GRACE_S = 10.0  # seconds a flight whose steering page left waits for a page (a reload) before it stops
PAGE = Path(__file__).with_name("page.html")
ICON = Path(__file__).with_name("favicon.svg")


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
    pace: flights keep pace with real-time playback (`Flight`); reload_grace: seconds a flight waits for a page
    after its steering page left.
    """

    def __init__(self, pipe, template, scheme, stem: Path, *, token: Optional[str] = None,
                 log: Callable[[str], None] = lambda line: None, encoders: int = 4, pace: bool = True,
                 reload_grace: float = RELOAD_GRACE_S):
        self.pace, self.reload_grace = pace, float(reload_grace)
        self._page_gone: Optional[asyncio.TimerHandle] = None  # the grace of a flight whose page left
        self._giving_up: Optional[asyncio.Task] = None  # its stop, once the grace ran out
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
        self.app.router.add_get("/favicon.svg", self._icon)
        self.app.router.add_get("/favicon.ico", self._icon)
        self.app.on_startup.append(self._on_startup)
        self.app.on_shutdown.append(self._on_shutdown)

    # --- requests -------------------------------------------------------------------------------
    @web.middleware
    async def _guard(self, request, handler):
        if self.token is None and not is_loopback(host_name(request.headers.get("Host", ""))):
            raise web.HTTPForbidden(text="camrender play: this server answers only to localhost and loopback "
                                         "addresses (open the URL it printed)\n")
        given = request.query.get("token", "").encode("utf-8", "surrogateescape")
        if self.token is not None and request.path not in ("/favicon.svg", "/favicon.ico") \
                and not hmac.compare_digest(given, self.token.encode()):
            raise web.HTTPForbidden(text="camrender play: a valid token is needed (use the URL it printed)\n")
        origin = request.headers.get("Origin")
        if request.path == "/ws" and origin is not None and origin.split("://", 1)[-1] != request.host:
            raise web.HTTPForbidden(text="camrender play: WebSocket from another origin\n")
        return await handler(request)

    async def _page(self, request):
        return web.Response(text=PAGE.read_text(), content_type="text/html", headers={"Cache-Control": "no-store"})

    async def _icon(self, request):
        return web.Response(body=ICON.read_bytes(), content_type="image/svg+xml",
                            headers={"Cache-Control": "max-age=86400"})

    async def _socket(self, request):
        ws = web.WebSocketResponse(max_msg_size=SOCKET_LIMIT, heartbeat=30)
        await ws.prepare(request)
        self.sockets.add(ws)
        steer = self.steering is None
        if steer:
            self.steering = ws
            await self._page_back()
        r = self.template
        flying = self._flying()
        await ws.send_json({"type": "hello", "role": "steer" if steer else "watch", "fps": r.fps, "width": r.width,
                            "height": r.height, "flight": self.flights, "flying": flying})
        if steer and flying:
            self.flight.resume()  # a reloaded page steers the flight it left
        elif steer:
            await self._start_flight(seed=r.seed if self.flights == 0 else None)
        try:
            async for message in ws:
                if ws is self.steering:
                    await self._handle(message)
                elif message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    self.dropped["watcher"] += 1
        finally:
            self.sockets.discard(ws)
            if ws is self.steering:  # the steering page left: its flight waits for a page, then is saved
                self.steering = None
                self.timeline.release_all()
                self._page_left()
        return ws

    def _flying(self) -> bool:
        return self.flight is not None and not self.flight.ended.is_set() and not self.flight.stopping

    def _page_left(self) -> None:
        if not self._flying():
            return
        flight = self.flight
        flight.pause()

        def give_up():
            self._page_gone = None
            flight.ask_stop()  # at once: a page arriving from now on gets a new flight
            self._giving_up = asyncio.ensure_future(self._stop_flight())

        self._page_gone = asyncio.get_running_loop().call_later(self.reload_grace, give_up)

    async def _page_back(self) -> None:
        """A page came to steer: the flight whose page left goes on; a flight that is stopping (Stop, Restart,
        its page gone for good) ends first, so the page gets a new one."""
        if self._page_gone is not None:
            self._page_gone.cancel()
            self._page_gone = None
        flight = self.flight
        if flight is not None and flight.stopping and not flight.ended.is_set():
            await asyncio.get_running_loop().run_in_executor(None, flight.ended.wait)

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
        compiles = self.flights == 1 and str(getattr(self.pipe, "_execution_device", "")).startswith("cuda")
        self.flight = Flight(self.pipe, self.template, seed, self._next_stem(), self.scheme, self.timeline,
                             on_segment=self._segment_from_thread, on_end=self._end_from_thread, log=self.log,
                             pace=self.pace, on_status=self._status_from_thread,
                             first_note="it also compiles the kernels and captures CUDA graphs" if compiles else None)
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

    def _status_from_thread(self, flight: Flight, text: str) -> None:
        self._loop.call_soon_threadsafe(self._outgoing.put_nowait, ("status", flight, text))

    async def _send_all(self) -> None:
        """Encode and send the segments in order (one task: frames never overtake each other)."""
        loop = asyncio.get_running_loop()
        while True:
            kind, flight, item = await self._outgoing.get()
            try:
                number = self.flights if flight is self.flight else 0
                if kind == "segment":
                    segment = item
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
                elif kind == "status":
                    await self._broadcast_json({"type": "status", "flight": number, "text": item})
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
        if self._page_gone is not None:  # a flight waiting for its page stops here, at once
            self._page_gone.cancel()
            self._page_gone = None
        await self._stop_flight()
        for ws in list(self.sockets):
            await ws.close(code=1001, message=b"server stopping")
        if self._sender is not None:
            self._sender.cancel()
            self._sender = None
        self._encoders.shutdown(wait=False)

    async def _on_shutdown(self, app) -> None:
        await self.close()


def host_name(host: str) -> str:
    """The name or address of a Host header ("localhost:8765", "[::1]:8765", "127.0.0.1"), without the port."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or a literal address) is this machine's loopback: "localhost", 127.0.0.0/8, ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def page_url(host: str, port: int, token: Optional[str]) -> str:
    return f"{base_url(host, port)}/" + (f"?token={token}" if token else "")


async def serve(server: PlayServer, host: str, port: int, on_ready: Callable[[str], None]) -> None:
    """Run `server` on host:port (0: any free port) until SIGINT or SIGTERM; `on_ready(url)` once it listens.
    On the signal the flight stops and is saved before the web server closes and this returns."""
    await run_until_signal(server.app, host, port, lambda bound: on_ready(page_url(host, bound, server.token)),
                           stopping=server.close)
