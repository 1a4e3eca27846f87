"""The Python API (`CamrenderPipeline`): load once, render trajectories to frames, streams or mp4 files."""
from camrender.api.pipeline import CamrenderPipeline, RenderResult

__all__ = ["CamrenderPipeline", "RenderResult"]
