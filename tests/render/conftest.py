"""Fixtures of the render tests."""
import pytest


@pytest.fixture
def graph_log(monkeypatch):
    """Every GraphedForward built while the test runs (`camrender.render.denoise` imports the class at its
    top, so the name is replaced there too)."""
    import camrender.model.graphs
    import camrender.render.denoise

    made = []

    class Recorded(camrender.model.graphs.GraphedForward):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(camrender.model.graphs, "GraphedForward", Recorded)
    monkeypatch.setattr(camrender.render.denoise, "GraphedForward", Recorded)  # the renders' one user
    return made
