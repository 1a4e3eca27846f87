"""The pipeline a worker keeps from job to job (`PipelineCache`): one loaded at a time, kept while consecutive
jobs ask for the same `LoadSettings`."""
from __future__ import annotations

from typing import Callable, Optional

from camrender.render.load_settings import LoadSettings


class PipelineCache:
    """The loaded `camrender.api.CamrenderPipeline` of the last `LoadSettings` asked for.

    load(settings) -> pipeline loads one; `loads` counts how many were loaded. A job whose settings differ in
    any field (the model, a precision, the refiner's window, CUDA graphs, the head split, ...) gets a pipeline
    of its own: the previous one is let go before the next loads (one model in memory at a time)."""

    def __init__(self, load: Callable[[LoadSettings], object]):
        self.load = load
        self.settings: Optional[LoadSettings] = None
        self.pipe = None
        self.loads = 0

    def get(self, settings: LoadSettings):
        if settings != self.settings:
            self.pipe, self.settings = None, None
            self.pipe = self.load(settings)
            self.settings = settings
            self.loads += 1
        return self.pipe
