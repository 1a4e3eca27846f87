"""Several processes, one device each, through PyTorch's own distributed engine.

camrender runs on several GPUs as `torchrun --nproc-per-node N -m camrender render|batch ...`;
`camrender render|batch --gpus N` starts the same thing on one host (`launch`: torchrun's elastic
agent with a standalone rendezvous). torchrun sets RANK / WORLD_SIZE / LOCAL_RANK in every worker;
`start` then joins the process group (NCCL on GPUs, gloo on the CPU), gives each rank the GPU of
its local rank, and lays the ranks out on a DeviceMesh of shape (videos, per_video):

- the ranks along "per_video" render one video together (`Ranks.video_group`): the two
  classifier-free-guidance branches (`camrender.parallel.cfg`) and/or the heads of every block
  (`camrender.parallel.heads`);
- the rows along "videos" take different jobs of `camrender batch`.

A video group of 2k ranks (k > 1) is also laid out as (cfg = 2, heads = k) (`Ranks.split_mesh`):
a guided full-mode render runs each guidance branch on k ranks that split the heads.

Failure handling is torchrun's: a worker that exits non-zero makes the agent stop the others
(SIGTERM, turned into a clean exit so temporary files are removed: by `camrender.cli.signals` under the
CLI, else here; SIGKILL 30 s later), and
collectives time out after `TIMEOUT` instead of waiting for a rank that hangs.
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import signal
import sys
from typing import Any, Optional

from camrender.errors import CamrenderError

# NVLink SHARP (NVLS) and multicast symmetric memory stay off on the lent machines: kept in every
# environment camrender starts (and set before the process group is made under plain torchrun).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
TIMEOUT = datetime.timedelta(minutes=10)  # one collective of a video group (a denoising step takes < 1 s)
CONTROL_TIMEOUT = datetime.timedelta(hours=24)  # job plan and results: a rank may render for hours first
FAILED_JOBS_EXIT_CODE = 3  # `camrender batch` finished and some jobs failed (its summary lists them)
_REPORTED_EXIT_CODES = (CamrenderError.exit_code, FAILED_JOBS_EXIT_CODE)  # rank 0 has said why
_owns_process_group = False  # whether `start` made the default process group (then `stop` ends it)


# ----------------------------------------------------------------------------- environment (no torch)
def launched_by_torchrun() -> bool:
    """Whether this process is a worker started by torchrun (or `launch`)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def world_size() -> int:
    """Number of processes of this run (1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1")) if launched_by_torchrun() else 1


def is_main_process() -> bool:
    """Rank 0, or not distributed at all: the process that reports errors and progress."""
    return not launched_by_torchrun() or os.environ.get("RANK", "0") == "0"


# ----------------------------------------------------------------------------- ranks
@dataclasses.dataclass
class Ranks:
    """Where this process sits in the run.

    rank, world_size: global; local_rank: on this host; device: this rank's `torch.device`;
    mesh: the (videos, per_video) DeviceMesh; video_group: the process group of the ranks rendering
    one video with this one (size per_video); control_group: a gloo group over all ranks with a
    long timeout, for the CPU objects of `camrender.batch` (job plan, results);
    split_mesh: the (videos, cfg, heads) DeviceMesh of video groups of 2k ranks, k > 1 (else None).
    """

    rank: int
    world_size: int
    local_rank: int
    device: Any
    mesh: Any
    video_group: Any
    control_group: Any
    split_mesh: Any = None

    @property
    def per_video(self) -> int:
        return self.mesh.size(1)

    @property
    def group_rank(self) -> int:
        """This rank's place in its video group (0: the leader, which decodes and writes)."""
        return self.mesh.get_coordinate()[1]

    @property
    def num_videos(self) -> int:
        return self.mesh.size(0)

    @property
    def video_index(self) -> int:
        """Which video group this rank belongs to (batch: which share of the jobs it takes)."""
        return self.mesh.get_coordinate()[0]

    @property
    def is_leader(self) -> bool:
        return self.group_rank == 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def rank_device(device: Optional[str], local_rank: int):
    """This rank's device: its local rank's GPU, or the CPU with `--device cpu` / without CUDA.

    A named GPU (`cuda:1`) is refused: every rank would pick the same one.
    """
    # lazy: keeps `camrender --help` free of torch
    import torch

    if device == "cpu" or (device in (None, "", "auto", "cuda") and not torch.cuda.is_available()):
        if device == "cuda":
            raise CamrenderError("CUDA was requested but no GPU is available; use --device cpu", field="device")
        return torch.device("cpu")
    if device not in (None, "", "auto", "cuda"):
        raise CamrenderError(f"{device!r} names one device; with several processes each takes the GPU of its "
                             "local rank: pass --device cuda (or cpu)", field="device")
    if local_rank >= torch.cuda.device_count():
        raise CamrenderError(f"local rank {local_rank} has no GPU (this host has {torch.cuda.device_count()}); "
                             "start at most that many processes per host", field="gpus")
    return torch.device("cuda", local_rank)


def start(device: Optional[str] = None, per_video: Optional[int] = None) -> Ranks:
    """Join the process group torchrun set up (or the one the calling program made already);
    `per_video` ranks (default: all) render each video.

    Raises CamrenderError (before any GPU work) when the layout does not fit the run.
    """
    global _owns_process_group
    # lazy: keeps `camrender --help` free of torch
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    per_video = size if per_video is None else per_video
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(size)))
    if per_video < 1 or size % per_video or (per_video < size and local_size % per_video):
        # a video group of a batch stays on one host: consecutive ranks, G dividing the processes per host
        raise CamrenderError(f"{per_video} GPUs per video do not divide the {local_size} processes per host "
                             f"({size} in all)", field="gpus-per-video")
    device = rank_device(device, local_rank)
    for name, value in NCCL_ENV.items():
        os.environ.setdefault(name, value)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=TIMEOUT)
        _owns_process_group = True
    mesh = init_device_mesh(device.type, (size // per_video, per_video), mesh_dim_names=("videos", "per_video"))
    split_mesh = None
    if per_video > 2 and per_video % 2 == 0:  # guidance branches x head split (made by every rank, used by some)
        split_mesh = init_device_mesh(device.type, (size // per_video, 2, per_video // 2),
                                      mesh_dim_names=("videos", "cfg", "heads"))
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    ranks = Ranks(rank=rank, world_size=size, local_rank=local_rank, device=device, mesh=mesh,
                  video_group=mesh.get_group("per_video"), control_group=control, split_mesh=split_mesh)
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):  # the CLI has its own (camrender.cli.signals)
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    return ranks


def stop() -> None:
    """Leave the process group `start` made (no-op when `start` did not make it)."""
    global _owns_process_group
    if not _owns_process_group:
        return
    # lazy: keeps `camrender --help` free of torch
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    _owns_process_group = False


def _exit_on_sigterm(signum, frame):
    # torchrun stops the other workers with SIGTERM when one fails: leave through the normal
    # unwinding, so `with` blocks delete their temporary files, and quietly (the failing rank speaks).
    raise SystemExit(128 + signum)


# ----------------------------------------------------------------------------- collectives of CPU objects
def broadcast_object(value, ranks: Optional[Ranks]):
    """Rank 0's `value` on every rank (over the control group); `value` itself on one process."""
    if ranks is None:
        return value
    # lazy: keeps `camrender --help` free of torch
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0, group=ranks.control_group)
    return box[0]


def gather_objects(value, ranks: Optional[Ranks]) -> Optional[list]:
    """Every rank's `value`, in rank order, on rank 0 (None elsewhere); [value] on one process."""
    if ranks is None:
        return [value]
    # lazy: keeps `camrender --help` free of torch
    import torch.distributed as dist

    gathered = [None] * ranks.world_size if ranks.is_main else None
    dist.gather_object(value, gathered, dst=0, group=ranks.control_group)
    return gathered


# ----------------------------------------------------------------------------- launcher
def launch(nproc: int, args: list) -> int:
    """Run `python -m camrender ARGS` as `nproc` workers on this host under torchrun (elastic agent,
    standalone rendezvous, no restarts); returns the exit code for the launching process.

    A worker's own messages reach stderr directly; bad input (exit 2) and failed batch jobs (exit 3)
    have been reported by rank 0, anything else gets one line naming the rank that failed first.
    """
    # lazy: keeps `camrender --help` free of torch
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    os.environ.update(NCCL_ENV)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for several workers, without its banner
    for name in list(logging.root.manager.loggerDict):  # the agent's warnings and failure tables
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        torchrun.main(["--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0", "-m", "camrender",
                       *[str(arg) for arg in args]])
    except ChildFailedError as error:
        rank, failure = error.get_first_failure()
        code = failure.exitcode
        if code in _REPORTED_EXIT_CODES:
            return code
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        print(f"camrender: error: rank {rank} {how}; the other ranks were stopped", file=sys.stderr)
        return code if code > 0 else 1
    except (KeyboardInterrupt, SignalException):  # the agent has passed the signal on: rank 0 says so
        return 130
    return 0
