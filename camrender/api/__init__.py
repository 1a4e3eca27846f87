"""The Python API (`CamrenderPipeline`): load once, render trajectories to frames, streams or mp4 files.

`CamrenderPipeline` and `RenderResult` are imported on first use: the CLI reads `camrender.api.requests`
in its model-free checks, which must not import torch and diffusers.
"""

from camrender.allocator import use_expandable_segments

__all__ = ["CamrenderPipeline", "RenderResult"]

use_expandable_segments()  # a script's CUDA allocator, unless it set its own (camrender.allocator)


def __getattr__(name):
    if name in __all__:
        from camrender.api import pipeline  # lazy: see the module docstring

        return getattr(pipeline, name)
    raise AttributeError(f"module 'camrender.api' has no attribute {name!r}")
