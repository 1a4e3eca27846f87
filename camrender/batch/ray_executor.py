"""`camrender batch --executor ray`: the batch's jobs on a Ray cluster (`RayExecutor`, the `Executor` protocol's
`run(jobs, make_runner)` over `camrender.batch.ray_workers.RayWorkers`), and Ray itself for the run
(`ray_cluster`: a cluster joined at `--address`, or a local instance started on this machine).

Ray is an optional extra (`pip install "camrender[ray]"`); this module imports without it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Callable, Optional

from camrender.batch.progress import JobLines
from camrender.batch.ray_workers import RayWorkers, first_line
from camrender.errors import CamrenderError

EXTRA = 'pip install "camrender[ray]"'
OBJECT_STORE_BYTES = 200 * 2**20  # jobs and results are small: the object store only passes them
CONNECT_TIMEOUT_S = 10.0  # reaching --address (the whole refusal stays well under 30 s)


def import_ray():
    """The `ray` module; CamrenderError (exit 2) naming the extra to install when Ray is missing."""
    try:
        import ray
    except ImportError:
        raise CamrenderError(f"--executor ray needs Ray: {EXTRA}", field="executor") from None
    return ray


@contextlib.contextmanager
def ray_cluster(address: Optional[str] = None, *, num_cpus: Optional[int] = None, num_gpus: Optional[int] = None):
    """Ray for one run: the cluster at `address` ("auto": the one `ray start` made on this machine, or RAY_ADDRESS;
    HOST:PORT), or without it a local instance on this machine's CPUs (`num_cpus`, default all) and GPUs
    (`num_gpus`, default all), listening on 127.0.0.1 only; shut down at the end. A program that initialized Ray
    already keeps its own (used as it is, left running). An address that cannot be reached: CamrenderError."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    with _sigterm_kept():  # ray.init replaces the handler; the CLI's turns SIGTERM into a clean stop
        if address is None:
            _start_local(ray, num_cpus, num_gpus)
        else:
            _join(ray, address)
    try:
        yield ray
    finally:
        ray.shutdown()


def local_cpus(actors: Optional[int]) -> int:
    """The logical CPUs of a Ray started on this machine for at most `actors` actors (one CPU each; None: as many as
    it has cores): Ray starts a Python worker process per logical CPU at once, which on a many-core GPU node would be
    as many idle processes as it has cores."""
    cores = os.cpu_count() or 1
    return min(cores, actors) if actors else cores


def _start_local(ray, num_cpus: Optional[int], num_gpus: Optional[int]) -> None:
    # lazy: Ray's own constant, only where Ray is installed
    from ray._private import ray_constants

    # Ray's single-machine mode (its default on macOS and Windows): the node keeps the address 127.0.0.1, which a
    # Linux Ray swaps for the host's public one, and every Ray server then listens on loopback only.
    cluster_mode = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    running = _descendants(os.getpid())
    try:
        with _only_what_one_run_uses():
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), num_gpus=num_gpus, include_dashboard=False,
                     _node_ip_address="127.0.0.1", object_store_memory=OBJECT_STORE_BYTES,
                     logging_level=logging.WARNING)
    except BaseException as error:
        # Ctrl-C, a stop or a failure while Ray starts: what it started so far goes too (Ray's agents would outlive
        # this process by minutes, waiting on a GCS that is gone)
        _stop_started(ray, running)
        if isinstance(error, Exception):  # Ray's processes could not start (memory, /tmp, its token)
            raise CamrenderError(f"cannot start a local Ray: {first_line(error)}", field="executor") from None
        raise
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = cluster_mode


def _stop_started(ray, running: set) -> None:
    """Stop a local Ray whose start was cut short: whatever Ray knows of, then every process under this one that
    was not `running` before (the processes Ray started, its raylet's agents included)."""
    with contextlib.suppress(Exception):  # Ray's state may be half made
        ray.shutdown()
    started = set()
    while fresh := _descendants(os.getpid()) - running - started:  # frozen first, so that none starts another
        for pid in fresh:
            with contextlib.suppress(OSError):  # gone meanwhile
                os.kill(pid, signal.SIGSTOP)
        started |= fresh
    for pid in started:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in started:  # this process's own children, reaped (the others' parents reap theirs)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _descendants(root: int) -> set:
    """The processes under `root` (its children, theirs, ...) from Linux's /proc; empty where there is none."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):  # a process that ended while this looked
            parents[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@contextlib.contextmanager
def _only_what_one_run_uses():
    """While `ray.init` starts a local Ray for one run: without its autoscaler monitor (one machine has nothing to
    scale; `ray start --no-monitor` leaves it out too) and without its dashboard API server, which Ray starts and
    waits for even with include_dashboard=False (a stub that reports usage statistics): together about 1 s of a 3
    to 4.5 s start on a 2-core machine. Through Ray's private `Node` class: where a Ray release lacks these methods,
    its Ray starts whole."""
    # lazy: Ray's own (private: node.py's) class, only where Ray is installed
    from ray._private.node import Node

    left_out = {name: getattr(Node, name) for name in ("start_monitor", "start_api_server") if hasattr(Node, name)}
    for name in left_out:
        setattr(Node, name, _not_started)
    try:
        yield
    finally:
        for name, method in left_out.items():
            setattr(Node, name, method)


def _not_started(node, *args, **kwargs) -> None:
    """A process of Ray's that a local Ray for one run goes without."""


def _join(ray, address: str) -> None:
    """Connect to the cluster at `address`; HOST:PORT is reached first (refused, unknown or silent hosts fail in
    seconds, where Ray itself waits a minute)."""
    target = (os.environ.get("RAY_ADDRESS") or address) if address == "auto" else address
    if target != "auto":
        host, _, port = target.split("://")[-1].rpartition(":")
        if not host or not port.isdigit():
            raise CamrenderError(f"{address!r} is not auto or HOST:PORT", field="address")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as error:
            raise CamrenderError(f"cannot reach the Ray cluster at {target}: {error.strerror or error}",
                                 field="address") from None
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except Exception as error:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError, ...
        raise CamrenderError(f"cannot join the Ray cluster at {target}: {first_line(error)}",
                             field="address") from None



@contextlib.contextmanager
def _sigterm_kept():
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and handler is not None:
            signal.signal(signal.SIGTERM, handler)


def cluster_workers(per_video: int, wants_gpus: bool, workers: Optional[int] = None) -> tuple:
    """(gpus, unit, count) of the workers the Ray cluster this process is connected to holds: on its GPUs when
    `wants_gpus` and it has `per_video` of them (gpus True, unit "GPU"), else on its CPUs (unit "CPU"); one worker
    per `per_video` units, at most `workers` (None: as many as it holds). CamrenderError when it holds none."""
    resources = import_ray().cluster_resources()
    gpus = wants_gpus and resources.get("GPU", 0) >= per_video
    unit = "GPU" if gpus else "CPU"
    capacity = int(resources.get(unit, 0)) // per_video
    if capacity < 1:
        raise CamrenderError(f"the Ray cluster has no {per_video} {unit}(s) for a worker",
                             field="gpus-per-video" if per_video > 1 else "executor")
    return gpus, unit, min(capacity, workers or capacity)


class RayExecutor:
    """The actors of the Ray cluster this process is connected to (`ray_cluster`): one worker per GPU, or per
    `per_video` GPUs rendering each video together; on the cluster's CPUs when every job renders on the CPU or the
    cluster has no GPUs. `workers`: at most this many (default: as many as the cluster holds); never more than
    jobs. retries: how many times a job whose worker was lost is rendered again. log: one line per finished job."""

    def __init__(self, jobs: list, log: Callable[[str], None], *, per_video: int = 1, workers: Optional[int] = None,
                 retries: int = 2):
        wants_gpus = any(job.request.settings.device != "cpu" for job in jobs)
        self.gpus, self.unit, count = cluster_workers(per_video, wants_gpus, workers)
        self.workers = max(1, min(count, len(jobs)))
        self.per_video, self.retries, self.log = per_video, retries, log

    def run(self, jobs: list, make_runner: Callable) -> tuple:
        """Render `jobs` (planned, status "render"): (every job's result, each worker's model loads)."""
        lines, results = JobLines(len(jobs), self.log), []
        with RayWorkers(make_runner, self.workers, per_video=self.per_video, gpus=self.gpus, retries=self.retries,
                        log=self.log) as pool:
            for job in jobs:
                pool.submit(job)
            for result in pool.results():
                results.append(result)
                lines(result)
            return results, list(pool.loads.values())
