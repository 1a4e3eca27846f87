"""What a render strategy hands the render loop (`camrender.render.loop`): `ChunkPlan`."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Optional


@dataclasses.dataclass
class ChunkPlan:
    """What a strategy hands the loop.

    chunks: iterator of finished stage-1 latents (1, C, t, h, w), in order (sampling happens as it is pulled);
    stage: the stage-2 object (`push(latents) -> refined`, `finish() -> the last refined block`);
    decoder: `decode(latents) -> (1, 3, F, H, W)` in [-1, 1]; total: chunks of the render;
    first: chunks already rendered (resume), frames_before: their frames;
    per_chunk_progress: report each chunk to `progress` (segment mode; full mode reports its steps);
    checkpoints: a `camrender.render.resume.Checkpointer` saved at chunk boundaries, or None;
    cache: the segment cache the checkpoints save; bounds: the chunks' latent-frame ranges;
    settle: queues the work of the chunk pulled last that only the next chunk needs (stage 1's cache pass), or
    None; the loop calls it once the chunk's refinement and decode are queued.
    """

    chunks: Iterator
    stage: Any
    decoder: Any
    total: int
    first: int = 0
    frames_before: int = 0
    per_chunk_progress: bool = False
    checkpoints: Any = None
    cache: Any = None
    bounds: Optional[list] = None
    settle: Optional[Callable[[], None]] = None
