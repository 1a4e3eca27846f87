"""The Python API (`CamrenderPipeline`): load once, render trajectories to frames, streams or mp4 files.

`CamrenderPipeline`, `LoadSettings` and `RenderResult` are imported on first use: the CLI reads `camrender.api.requests`
in its model-free checks, which must not import torch and diffusers.
"""

from camrender.allocator import use_expandable_segments

__all__ = ["CamrenderPipeline", "LoadSettings", "RenderResult"]

use_expandable_segments()  # a script's CUDA allocator, unless it set its own (camrender.allocator)


def __getattr__(name):
    if name == "LoadSettings":
        from camrender.render.load_settings import LoadSettings

        return LoadSettings
    if name in __all__:
        from camrender.api import pipeline  # lazy: see the module docstring

        return getattr(pipeline, name)
    raise AttributeError(f"module 'camrender.api' has no attribute {name!r}")
