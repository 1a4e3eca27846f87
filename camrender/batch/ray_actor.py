"""One Ray actor of `camrender.batch.ray_workers.RayWorkers`: a process that renders jobs with its own `JobRunner`
(its pipeline kept between consecutive jobs of the same `LoadSettings`), alone or as one rank of a video group of
`--gpus-per-video` actors that render each video together (a torch.distributed process group of their own).

The class is plain Python; `RayWorkers` makes it an actor (`ray.remote(RenderWorker).options(...)`), so this module
imports without Ray. Its methods, in the order a worker calls them:

    place()  -> {"pid", "host", "ip", "gpus", "port"}    where the actor landed (a free port for a group's rank 0)
    start(rank, size, master, gpus, device) -> pid     join the group (size > 1) and make the runner
    render(job) -> result dict, or None on a group's other ranks
"""
from __future__ import annotations

import os
import socket
from typing import Callable, Optional

from camrender.batch.executors import render_on


class RenderWorker:
    """make_runner(ranks) -> `camrender.batch.executors.JobRunner`, called in this actor's process by `start`."""

    def __init__(self, make_runner: Callable):
        self.make_runner = make_runner
        self.runner = None
        self.ranks = None

    def place(self) -> dict:
        """Where this actor runs: its pid, host, IP address, GPU ids (Ray's) and a port free on it now."""
        # lazy: this module imports without Ray (only an actor calls this)
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as probe:
            probe.bind((ip, 0))
            port = probe.getsockname()[1]
        return {"pid": os.getpid(), "host": socket.gethostname(), "ip": ip,
                "gpus": [str(gpu) for gpu in ray.get_gpu_ids()], "port": port}

    def start(self, rank: int = 0, size: int = 1, master: Optional[tuple] = None, gpus: Optional[list] = None,
              device: str = "cuda") -> int:
        """Make the runner; with `size` > 1 first join the video group: this actor is rank `rank` of `size`, rank 0
        at `master` (ip, port), every rank seeing the group's GPUs `gpus` (Ray's ids: one GPU each, all visible to
        each, as NCCL's peer-to-peer paths want); device "cuda" or "cpu" (gloo). Returns the pid."""
        if size > 1:
            # lazy: this module imports without Ray; torch.distributed reads the environment set here
            import ray

            from camrender.parallel import distributed

            own = [str(gpu) for gpu in ray.get_gpu_ids()]
            local_rank = gpus.index(own[0]) if gpus and own else rank
            if gpus:
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(local_rank),
                              LOCAL_WORLD_SIZE=str(size), MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
            self.ranks = distributed.start(device, per_video=size)
        self.runner = self.make_runner(self.ranks)
        return os.getpid()

    def render(self, job) -> Optional[dict]:
        """Render one planned job: its result with this runner's model loads ("loads"), on the rank that writes;
        None on a video group's other ranks."""
        result = render_on(self.runner, job, self.ranks)
        if self.ranks is not None and not self.ranks.is_leader:
            return None
        return {**result, "loads": self.runner.loads}
