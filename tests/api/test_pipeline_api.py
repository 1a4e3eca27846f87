"""The Python API (`camrender.CamrenderPipeline`): the README's example runs as written, and its
results are the render's (the CLI's defaults, the stream equal to the whole path)."""
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- api-example[^>]*-->\n```python\n(.*?)```", text, re.S)
    assert match, "README.md has no api-example block"
    return match.group(1)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in a scratch folder with the repository's trajectories, on the CPU render path (PyTorch
    references, as a user runs it; the Triton interpreter would take minutes)."""
    (tmp_path / "trajectories").symlink_to(ROOT / "trajectories")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    return tmp_path


def test_the_readme_example_runs_and_renders(in_tmp, capsys):
    from camrender.render.camera_feed import SegmentCamera, trajectory_segments
    from camrender.trajectory import load

    scope = {}
    exec(compile(readme_example(), "README.md", "exec"), scope)
    pipe, frames, result = scope["pipe"], scope["frames"], scope["result"]
    assert frames.shape == (17, 64, 112, 3) and frames.dtype == np.uint8  # the tiny model's default size
    assert result.video == Path("orbit.mp4") and result.frames == 17 and (in_tmp / "orbit.mp4").stat().st_size > 0
    assert sorted(p.name for p in result.side_files) == ["orbit.path.png", "orbit.render.json", "orbit.traj.json"]
    # the stream printed one chunk per segment: 57 frames -> latent segments (0, 5), (5, 8) (3 latent
    # frames per segment, the first absorbing the rest) -> 33 + 24 frames
    assert capsys.readouterr().out.split("\n")[:3] == ["(33, 64, 112, 3)", "(24, 64, 112, 3)", ""]

    # a whole trajectory renders the same frames as its cameras streamed segment by segment, bit for bit
    path = load("trajectories/orbit.json")
    timed = pipe.request(path, frames=57).traj  # the orbit re-timed to 57 frames
    whole = pipe(timed, mode="segments", prompt="a quiet street", seed=3)
    pieces = trajectory_segments(timed, [(0, 5), (5, 8)])
    streamed = pipe.stream(pieces, frames=57, mode="segments", prompt="a quiet street", seed=3, fps=timed.fps)
    assert np.array_equal(np.concatenate(list(streamed)), whole)
    # ... and the request carries the CLI's defaults: the recipe's steps (tiny full mode: 10), guidance 5
    request = pipe.request(path, frames=17)
    assert (request.mode, request.steps, request.guidance, request.seed) == ("full", 10, 5.0, path.seed or 0)
    assert isinstance(SegmentCamera(path.c2w[:1], path.intrinsics[:1], 8, 8), SegmentCamera)


def test_settings_are_the_loaded_pipelines_and_a_render_cannot_change_them(in_tmp):
    """from_pretrained takes the stage options (precision per stage, the refiner's window) into every
    request; a render given one of the pipeline's settings is refused, not silently run without it."""
    from camrender import CamrenderPipeline
    from camrender.errors import CamrenderError
    from camrender.render.pipeline import pipeline_settings

    pipe = CamrenderPipeline.from_pretrained("tiny", refiner="tiny", refiner_window=2, device="cpu")
    request = pipe.request("trajectories/orbit.json", frames=17)
    load = request.settings
    assert (load.refiner_window, load.stage1_precision, load.refiner_precision) == (2, "bf16", "bf16")
    assert pipeline_settings(pipe.pipe, request).refiner.window == 2
    for option in (dict(refiner_window=5), dict(cuda_graphs=False), dict(kernels="torch"), dict(precision="fp8"),
                   dict(recipe="streaming")):
        with pytest.raises(CamrenderError, match="decided when the pipeline loads"):
            pipe.request("trajectories/orbit.json", frames=17, **option)
    assert pipe.request("trajectories/orbit.json", frames=17, prompt_cache="off").prompt_cache is None
    with pytest.raises(CamrenderError, match="fp8 needs a GPU") as caught:
        CamrenderPipeline.from_pretrained("tiny", device="cpu", refiner="tiny", refiner_precision="fp8")
    assert caught.value.field == "refiner-precision"
    with pytest.raises(CamrenderError, match="must be one of bf16, fp8"):
        CamrenderPipeline.from_pretrained("tiny", device="cpu", precision="fp16")
    for option in (dict(refiner_window=2), dict(refiner_offload="layers"), dict(refiner_precision="bf16")):
        with pytest.raises(CamrenderError, match="applies to the refiner") as caught:
            CamrenderPipeline.from_pretrained("tiny", device="cpu", **option)
        assert caught.value.field == next(iter(option)).replace("_", "-")  # the option's name, as the CLI's
    with pytest.raises(CamrenderError, match="at least 1 latent frame"):
        CamrenderPipeline.from_pretrained("tiny", device="cpu", refiner="tiny", refiner_window=0)


def test_streamed_refiner_blocks_render_the_same_frames(in_tmp):
    """`refiner_offload="3"`: a saved 5-block tiny refiner loaded from its folder, 3 of its blocks streaming
    from CPU memory through the two staging slots (`camrender.model.block_streaming`; a slot is refilled on
    every pass), renders what the resident refiner renders."""
    from camrender import CamrenderPipeline
    from camrender.model.block_streaming import block_streamer
    from camrender.model.refiner.tiny import build_tiny_refiner
    from camrender.render import stage_two

    build_tiny_refiner(seed=3, num_layers=5).save_pretrained(in_tmp / "refiner")
    frames = {}
    for offload in ("none", "3"):
        pipe = CamrenderPipeline.from_pretrained("tiny", refiner=str(in_tmp / "refiner"), refiner_offload=offload,
                                                 device="cpu")
        frames[offload] = pipe("trajectories/orbit.json", frames=33, mode="segments", prompt_cache="off")
        streamer = block_streamer(getattr(pipe.pipe, stage_two._ATTRIBUTE).transformer.transformer_blocks)
        assert (streamer is not None and streamer.streamed == [0, 2, 4]) == (offload == "3")
    assert frames["none"].shape[0] == 33 and np.array_equal(frames["none"], frames["3"])
