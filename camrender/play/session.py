"""One flight of `camrender play`: the segment loop steered live, and the session it saves.

A `Flight` renders in its own thread: `camrender.render.loop.render_frames` (segment mode) pulls each
segment's cameras from a `camrender.play.steering.SteeredPath` (the keys held while the segment
before rendered) and yields each segment's uint8 frames (F, H, W, 3) as soon as it is decoded; the
flight hands them to `on_segment` (the server sends them to the pages) and to a writer thread that
appends them to the video exactly as `camrender render` does in segment mode
(`camrender.output.segment_video.SegmentVideoWriter`: one stream per segment, joined by stream copy).

When it ends (`stop()`, the longest clip reached, or an error) the flight saves, for the frames
shown:

    NAME.mp4           the video as shown (written to temporary files, renamed into place)
    NAME.traj.json     the flown path, a per-frame v1 trajectory (prompt, image, seed included)
    NAME.render.json   every setting plus the path: `camrender render --from-render NAME.render.json`
                       renders the same frames offline (the render file records the live noise draw,
                       `noise_frames`, since the live clip was planned longer than it was flown)

A flight stops only at segment boundaries: the segment in flight when it is asked to stop is finished, shown
and saved (its keys were pressed before the stop), and no later one is started. While no page steers
(`pause`, e.g. a page reloading) it waits at the next boundary, its next segment not yet decided.
"""
from __future__ import annotations

import dataclasses
import math
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from camrender.model.stage1.recipes import segment_bounds
from camrender.output.segment_video import SegmentVideoWriter
from camrender.play.steering import KeyTimeline, SteeredPath, Stopped, pinhole
from camrender.render.loop import render_frames
from camrender.render.request import RenderRequest
from camrender.render.settings_file import write_render_json
from camrender.trajectory import Trajectory, save as save_trajectory
from camrender.trajectory.controls import ControlScheme


@dataclasses.dataclass
class Segment:
    """One decoded segment, as shown: frames (F, H, W, 3) uint8 are video frames [first, first + F)."""

    index: int
    first: int
    frames: np.ndarray
    reflected: dict  # press id -> video frame that first reflects it (frames of this segment only)
    rate: float  # video frames per second of wall time over the recent segments
    decided: float  # clock time the segment's cameras were decided


def latent_frames(request: RenderRequest, time_stride: int = 8) -> int:
    return (request.num_frames - 1) // time_stride + 1


def session_files(stem: Path) -> dict:
    """{"video", "trajectory", "render"} paths of a session saved as `stem` (a path without suffix)."""
    stem = Path(stem)
    return {"video": stem.with_name(stem.name + ".mp4"), "trajectory": stem.with_name(stem.name + ".traj.json"),
            "render": stem.with_name(stem.name + ".render.json")}


class PlaybackClock:
    """When a page that plays `fps` video frames per second, as they arrive, shows each frame: frame i at the
    later of its arrival and frame i-1's turn + 1 / fps. A segment that arrives after its first frame's turn
    stalls the page, and every later turn moves back by the stall: pacing against the turns of a page that
    never stalled would keep that much more video buffered (and add it to every key's latency) for the rest of
    the flight, as after a slow first segment (CUDA-graph captures)."""

    def __init__(self, fps: float):
        self.fps = float(fps)
        self.start = None  # clock time of frame 0's turn, moved back by the stalls so far

    def arrived(self, first: int, at: float) -> None:
        """Frames from video frame `first` on reached the page at clock time `at`."""
        if self.start is None:
            self.start = at - first / self.fps
        elif at > self.turn(first):
            self.start += at - self.turn(first)

    def turn(self, frame: int) -> float:
        """Clock time the page shows video frame `frame` (of those arrived, or arriving in time)."""
        return self.start + frame / self.fps


class Flight:
    """One steered render of `template` (a segment-mode `RenderRequest` with `traj` None and `num_frames`
    the longest clip) with `seed`, saved as `stem` (`session_files`).

    on_segment(flight, Segment), on_end(flight) and on_status(flight, text) (what the flight does before its
    frames show: preparing, rendering segment k of n) are called from the flight's thread; first_note: said
    with segment 1 (e.g. that it compiles the kernels), or None.
    pace: the render keeps only as many video frames ahead of real-time playback (the page plays at the
    model's `fps`) as it needs to render the next segment in time (1.25 x the last segment's render time,
    at least `lead` frames): it waits before deciding the next segment, so that segment takes the
    freshest keys and the page's buffer, hence the key-to-frame latency, stays short; without pacing a
    GPU faster than real time fills the page's buffer (what a throughput benchmark wants).
    """

    def __init__(self, pipe, template: RenderRequest, seed: int, stem: Path, scheme: ControlScheme,
                 timeline: KeyTimeline, on_segment: Callable, on_end: Callable, log: Callable = lambda line: None,
                 clock: Callable[[], float] = time.monotonic, pace: bool = True, lead: int = 4,
                 on_status: Callable = lambda flight, text: None, first_note: Optional[str] = None):
        self.pace, self.lead = pace, int(lead)
        self.on_status, self.first_note = on_status, first_note
        self.pipe, self.seed, self.stem = pipe, int(seed), Path(stem)
        self.request = dataclasses.replace(template, seed=self.seed, traj=None, noise_frames=None)
        self.timeline, self.on_segment, self.on_end, self.log, self.clock = timeline, on_segment, on_end, log, clock
        recipe = self.request.recipe
        chunk = recipe.chunk_frames if self.request.segment_frames is None else self.request.segment_frames
        self.bounds = segment_bounds(latent_frames(self.request), chunk)
        self._stop = threading.Event()
        self._attended = threading.Event()  # a page steers (cleared by `pause`)
        self._attended.set()
        self.path = SteeredPath(scheme, timeline, self.bounds, pinhole(self.request.width, self.request.height),
                                self.request.width, self.request.height, stopping=self._stop.is_set)
        self.shown = 0  # video frames shown (and saved)
        self.playback = PlaybackClock(self.request.fps)  # when the page shows each frame
        self.segments = 0
        self.error: Optional[BaseException] = None
        self.saved: dict = {}
        self.ended = threading.Event()
        self._writes = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"camrender-play-{self.stem.name}", daemon=True)

    def start(self) -> "Flight":
        self._thread.start()
        return self

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stop at the next segment boundary (the segment in flight is kept) and wait for the session to be saved."""
        self.ask_stop()
        self._thread.join(timeout)

    def ask_stop(self) -> None:
        """`stop` without the wait."""
        self._stop.set()
        self._attended.set()

    def pause(self) -> None:
        """Wait at the next segment boundary until `resume` (or `stop`): no page steers."""
        self._attended.clear()

    def resume(self) -> None:
        self._attended.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _run(self) -> None:
        writer = threading.Thread(target=self._write, name="camrender-play-writer", daemon=True)
        writer.start()
        try:
            self._render()
        except Stopped:
            pass
        except BaseException as error:  # reported to the page and the log; what was shown is still saved
            self.error = error
            self.log(f"the render stopped: {error}")
        finally:
            self._writes.put(None)
            writer.join()
            try:
                self._save()
            except BaseException as error:
                self.error = self.error or error
                self.log(f"saving the session failed: {error}")
            self.ended.set()
            self.on_end(self)

    def _announced(self, cameras):
        """`cameras` (the steered path's segments), saying which segment renders as each is decided."""
        for index, camera in enumerate(cameras):
            note = f" ({self.first_note})" if index == 0 and self.first_note else ""
            self.on_status(self, f"rendering segment {index + 1} of {len(self.bounds)}{note}")
            yield camera

    def _render(self) -> None:
        self.on_status(self, "preparing: the prompt, the noise of the whole flight")
        request = dataclasses.replace(self.request, cameras=self._announced(self.path.segments()))
        recent = []  # (clock, frames) of the recent segments, for the rate
        started = self.clock()
        chunks = render_frames(self.pipe, request, low_latency=True)  # each segment on screen as soon as it is decoded
        try:
            for frames in chunks:
                now = self.clock()
                recent = (recent + [(now, len(frames))])[-5:]
                span = now - (recent[0][0] if len(recent) > 1 else started)
                counted = sum(count for _, count in (recent[1:] if len(recent) > 1 else recent))
                first = self.shown
                reflected = {pid: f for pid, f in self.path.reflected.items() if first <= f < first + len(frames)}
                segment = Segment(self.segments, first, frames, reflected, counted / max(span, 1e-9), now)
                self.shown += len(frames)
                self.segments += 1
                self._writes.put(frames)
                self.on_segment(self, segment)
                self.playback.arrived(first, now)
                if self.pace:
                    took = now - self.path.decided_at[min(segment.index, len(self.path.decided_at) - 1)]
                    self._wait_for_playback(took)
                while not self._attended.wait(0.5) and not self._stop.is_set():
                    pass  # no page steers: the next segment waits for one (`stop` ends the wait too)
                if self._stop.is_set():
                    break  # after the segment in flight: it is shown and saved
        finally:
            chunks.close()

    def _wait_for_playback(self, render_seconds: float) -> None:
        """Sleep (or until stopped) while the frames ahead of the page's playback (`playback`) are more than
        what rendering the next segment needs (`pace`)."""
        ahead = max(self.lead, math.ceil(1.25 * render_seconds * self.request.fps))
        self._stop.wait(max(0.0, self.playback.turn(self.shown - ahead) - self.clock()))

    def _write(self) -> None:
        """Append each shown segment to the video (a thread of its own: x264 stays off the render's path)."""
        files = session_files(self.stem)
        folder = files["video"].with_name(f".{files['video'].name}.partial")
        video = SegmentVideoWriter(files["video"], self.request.fps, folder)
        try:
            with video:
                while (frames := self._writes.get()) is not None:
                    video.append(frames)
                if not video.frames_written:
                    raise Stopped()  # nothing shown: no video (and the writer joins nothing)
        except Stopped:
            pass
        except BaseException as error:
            self.error = self.error or error
            self.log(f"writing the video failed: {error}")
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if video.frames_written and files["video"].exists():
            self.saved["video"] = files["video"]

    def flown(self) -> Trajectory:
        """The path of the frames shown (video frames 0 .. shown-1), with the prompt, image and seed."""
        r = self.request
        poses = np.stack(self.path.poses[:self.shown])
        return Trajectory(poses, np.tile(self.path.intrinsics, (len(poses), 1)), r.width, r.height, r.fps,
                          prompt=r.prompt, negative_prompt=r.negative_prompt or None,
                          image=None if r.image is None else str(r.image), seed=self.seed).validate()

    def offline_request(self) -> RenderRequest:
        """The request `camrender render --from-render` makes of the saved render file."""
        traj = self.flown()
        return dataclasses.replace(self.request, traj=traj, num_frames=traj.num_frames, cameras=None,
                                   noise_frames=latent_frames(self.request), out=session_files(self.stem)["video"])

    def _save(self) -> None:
        if not self.shown or "video" not in self.saved:
            return
        files = session_files(self.stem)
        request = self.offline_request()
        save_trajectory(request.traj, files["trajectory"])
        self.saved["trajectory"] = files["trajectory"]
        write_render_json(request, files["render"])
        self.saved["render"] = files["render"]
