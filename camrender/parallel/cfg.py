"""Classifier-free guidance on two ranks (CFG parallel).

Full mode with guidance runs the transformer on a batch of two rows, [negative prompt, prompt],
and mixes the predictions: uncond + g * (cond - uncond). With a video group of two ranks
(`camrender.parallel.distributed`), rank r of the group runs row r alone (B = 1: its text, mask and camera
rows; the Plucker maps are shared), the two predictions are gathered on both ranks and mixed the
same way there, so both ranks step identical latents and only the leader needs to decode.

More ranks per video need the head split of every block (issue 13 first), and segment mode or
full mode without guidance has no second branch: `check_split` refuses those layouts before any
GPU work rather than leaving GPUs idle.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from camrender.parallel import distributed
from camrender.errors import CamrenderError

CFG_RANKS = 2  # one rank per guidance branch


def check_split(mode: str, guidance: Optional[float], gpus: int) -> None:
    """Raise CamrenderError unless a video of this mode and guidance renders on `gpus` ranks."""
    if gpus == 1:
        return
    if mode != "full":
        raise CamrenderError(f"segment mode renders a video on one GPU for now (splitting it over {gpus} needs the "
                             "per-block head split); use one GPU per video, e.g. camrender batch", field="gpus")
    if guidance is None or guidance <= 1.0:
        raise CamrenderError(f"full mode without guidance has one branch: nothing to split over {gpus} GPUs "
                             "(the per-block head split is not there yet); render on one GPU", field="gpus")
    if gpus != CFG_RANKS:
        raise CamrenderError(f"full mode splits its two guidance branches over 2 GPUs; {gpus} GPUs per video need "
                             "the per-block head split, not there yet: use 2, or camrender batch for many videos",
                             field="gpus")


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
        import torch
        import torch.distributed as dist

        parts = [torch.empty_like(prediction) for _ in range(CFG_RANKS)]
        dist.all_gather(parts, prediction.contiguous(), group=self.group)
        return torch.cat(parts)


def guidance_split(guided: bool) -> Optional[CfgSplit]:
    """The split of a full-mode render on this process's video group; None on a group of one."""
    ranks = distributed.current()
    if ranks is None or ranks.per_video == 1:
        return None
    check_split("full", 2.0 if guided else None, ranks.per_video)
    return CfgSplit(ranks.video_group, ranks.group_rank)
