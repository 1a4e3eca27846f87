"""Revisit consistency (PSNR and SSIM against NVlabs' `eval_unified.py`, the pairs found on a path) and which frames
are scored (the skip-first-frame rule, lengths, intervals)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from camrender.errors import CamrenderError
from camrender.eval.revisit import MAX_PAIRS, path_pairs, psnr, score_pairs, ssim
from camrender.eval.sampling import frame_plan, skips_first_frame
from eval_paths import dolly, kit_module


def test_psnr_and_ssim_agree_with_the_released_evaluator():
    pytest.importorskip("scipy", reason="the released SSIM filters with scipy.ndimage")
    kit = kit_module("eval_unified")
    rng = np.random.default_rng(0)
    for shape in ((37, 53, 3), (12, 11, 3), (64, 64, 4)):
        a = rng.integers(0, 256, shape, dtype=np.uint8)
        b = np.clip(a.astype(int) + rng.integers(-40, 40, shape), 0, 255).astype(np.uint8)
        assert abs(ssim(a, b) - kit.compute_ssim(a, b)) <= 1e-9
        assert abs(psnr(a, b) - kit._psnr(a, b)) <= 1e-9
    assert psnr(a, a) == kit._psnr(a, a) == 100.0 and ssim(a, a) == pytest.approx(1.0)


def _out_and_back(frames: int = 97) -> np.ndarray:
    """Forward 2 units and back the same way, facing forward throughout (16 fps: 6 s)."""
    c2w = np.tile(np.eye(4), (frames, 1, 1))
    c2w[:, 2, 3] = 2.0 * (1 - np.abs(np.linspace(-1.0, 1.0, frames)))
    return c2w


def test_revisits_are_found_where_the_path_comes_back():
    c2w = _out_and_back()
    pairs = path_pairs(c2w, 16.0)
    assert 1 <= len(pairs) <= MAX_PAIRS
    for pair in pairs:
        a, b = pair["frame_a"], pair["frame_b"]
        assert b - a >= 32  # two seconds apart at least
        assert a + b == 96  # the same place on the way out and back
        assert pair["distance"] <= 0.05 * 2.0 and pair["angle_deg"] <= 10
    ends = [(p["frame_a"], p["frame_b"]) for p in pairs]
    assert all(max(abs(a - c), abs(b - d)) >= 32 for i, (a, b) in enumerate(ends) for c, d in ends[:i])
    assert path_pairs(dolly(), 16.0) == []  # never comes back
    assert all(p["frame_a"] >= 10 for p in path_pairs(c2w, 16.0, first=10))


def test_revisit_scores_are_means_over_the_pairs():
    rng = np.random.default_rng(2)
    frames = {i: rng.integers(0, 256, (20, 30, 3), dtype=np.uint8) for i in range(4)}
    frames[3] = frames[0].copy()
    result = score_pairs([{"frame_a": 0, "frame_b": 3}, {"frame_a": 1, "frame_b": 2}], frames)
    assert result["pairs"][0]["psnr"] == 100.0
    assert result["psnr"] == pytest.approx((100.0 + psnr(frames[1], frames[2])) / 2)
    assert result["ssim"] == pytest.approx((1.0 + ssim(frames[1], frames[2])) / 2)
    assert "lpips" not in result
    assert score_pairs([], frames) == {"pairs": []}


def test_frames_scored_every_interval_less_frame_0_when_skipping():
    plan = frame_plan(961, 961, 4, False)
    assert len(plan) == 241 and plan.path_indices[-1] == 960 and np.array_equal(plan.video_indices, plan.path_indices)
    plan = frame_plan(961, 961, 4, True)
    assert plan.path_indices[0] == 4 and len(plan) == 240 and np.array_equal(plan.video_indices, plan.path_indices)
    stripped = frame_plan(960, 961, 4, True)  # a video whose frame 0 was already removed
    assert np.array_equal(stripped.path_indices, plan.path_indices)
    assert np.array_equal(stripped.video_indices, plan.path_indices - 1)


@pytest.mark.parametrize("video, path, interval, skip, field", [
    (960, 961, 4, False, "frames"),  # one short without the rule
    (959, 961, 4, True, "frames"),
    (962, 961, 4, True, "frames"),
    (2, 2, 1, False, "c2w"),  # fewer than 3 poses
    (9, 9, 4, True, "interval"),  # frames 4, 8 only
])
def test_frame_plan_refuses(video, path, interval, skip, field):
    with pytest.raises(CamrenderError) as error:
        frame_plan(video, path, interval, skip, video="v.mp4", path="p.json")
    assert error.value.field == field
    assert error.value.path == ("p.json" if field == "c2w" else "v.mp4" if field == "frames" else None)


def test_skip_first_frame_auto_follows_the_refiner(tmp_path):
    method = tmp_path / "method"
    split = method / "simple_60s"
    split.mkdir(parents=True)
    video = split / "scene_001_generated.mp4"
    assert skips_first_frame("auto", video)[0] is False  # nothing says: not refined
    (method / "method_info.json").write_text(json.dumps({"model": "x", "refiner": "ltx2"}))
    assert skips_first_frame("auto", video)[0] is True
    (split / "scene_001_generated.render.json").write_text(json.dumps({"settings": {"refiner": None}}))
    skip, why = skips_first_frame("auto", video)  # camrender's own side file wins
    assert skip is False and "render.json" in why
    (split / "scene_001_generated.render.json").write_text(json.dumps({"settings": {"refiner": "refiner_diffusers"}}))
    assert skips_first_frame("auto", video)[0] is True
    assert skips_first_frame("no", video)[0] is False and skips_first_frame("yes", split / "other.mp4")[0] is True
