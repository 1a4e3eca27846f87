"""Classifier-free guidance on two ranks (CFG parallel), and the layout of a video group.

Full mode with guidance runs the transformer on a batch of two rows, [negative prompt, prompt],
and mixes the predictions: uncond + g * (cond - uncond). With a video group of two ranks
(`camrender.parallel.distributed`), rank r of the group runs row r alone (B = 1: its text, mask and camera
rows; the Plucker maps are shared), the two predictions are gathered on both ranks and mixed the
same way there, so both ranks step identical latents and only the leader needs to decode.

Layouts of a video group of G ranks (`check_split` refuses the others before any GPU work):

| render | G = 2 | G = 2k, k > 1 | G odd |
|---|---|---|---|
| full, guidance > 1 | CFG parallel | CFG parallel x head split k | refused |
| full without guidance, segments | head split 2 | head split G | head split G |

The head split (`camrender.parallel.heads`) further needs the model's heads divisible by its size,
checked when the model is loaded.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from camrender.errors import CamrenderError

CFG_RANKS = 2  # one rank (or one head-split group) per guidance branch


def is_guided(mode: str, guidance: Optional[float]) -> bool:
    """Whether a render runs two guidance branches (full mode with guidance > 1)."""
    return mode == "full" and guidance is not None and guidance > 1.0


def check_split(mode: str, guidance: Optional[float], gpus: int) -> None:
    """Raise CamrenderError unless a video of this mode and guidance renders on `gpus` ranks."""
    if gpus > 1 and is_guided(mode, guidance) and gpus % CFG_RANKS:
        raise CamrenderError(f"full mode with guidance runs its two branches on half of the GPUs each (the heads "
                             f"of every block split over that half): {gpus} GPUs per video do not halve; use an "
                             "even number, or camrender batch for many videos", field="gpus")


def head_split_size(mode: str, guidance: Optional[float], gpus: int) -> int:
    """How many ranks split every block's heads in a video group of `gpus` ranks (1: no split)."""
    if gpus == 1:
        return 1
    return gpus // CFG_RANKS if is_guided(mode, guidance) else gpus


@dataclasses.dataclass
class CfgSplit:
    """This rank's guidance row: index 0 runs the negative prompt, 1 the prompt."""

    group: Any
    index: int

    def rows(self, batch_tensor):
        """This rank's row of a (2, ...) guidance batch: (1, ...)."""
        return batch_tensor[self.index:self.index + 1]

    def gather(self, prediction):
        """Both ranks' (1, ...) predictions -> the (2, ...) batch the one-process render predicts."""
        # lazy: keeps `camrender --help` free of torch
        import torch
        import torch.distributed as dist

        parts = [torch.empty_like(prediction) for _ in range(CFG_RANKS)]
        dist.all_gather(parts, prediction.contiguous(), group=self.group)
        return torch.cat(parts)


def guidance_split(ranks, guided: bool) -> Optional[CfgSplit]:
    """The guidance split of a full-mode render on the video group of `ranks` (a
    `camrender.parallel.distributed.Ranks`, or None on one process); None on a group of one or without guidance
    (then the group splits heads only)."""
    if ranks is None or ranks.per_video == 1 or not guided:
        return None
    check_split("full", 2.0, ranks.per_video)
    if ranks.per_video == CFG_RANKS:
        return CfgSplit(ranks.video_group, ranks.group_rank)
    return CfgSplit(ranks.split_mesh.get_group("cfg"), ranks.split_mesh.get_local_rank("cfg"))


def head_split_of(ranks, size: int):
    """The `camrender.parallel.heads.HeadSplit` of this process when `size` ranks of the video group of `ranks`
    split every block's heads (`head_split_size`: the layout table above), or None (no split)."""
    # lazy: keeps `camrender --help` free of torch (heads imports it)
    from camrender.parallel.heads import HeadSplit

    if size <= 1:
        return None
    if ranks is None or ranks.per_video % size:
        raise CamrenderError(f"a head split over {size} GPUs needs a video group of a multiple of {size} processes",
                             field="gpus")
    if size == ranks.per_video:
        return HeadSplit(ranks.video_group, ranks.group_rank, size)
    return HeadSplit(ranks.split_mesh.get_group("heads"), ranks.split_mesh.get_local_rank("heads"), size)
