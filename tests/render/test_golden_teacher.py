"""Parity of the chunk-causal recipe with the original NVlabs teacher (tests/golden/chunk_causal_*.safetensors).

The golden holds the original model's weights, inputs, final latents and every model prediction of a
ChunkFlowEuler run (tools/make_golden_chunk_causal.py); bench/replay_golden.py hands it to
bench/replay_teacher.py, which replays it through camrender's original-format loader, camera code and
state-passing sampler. tests/model/test_golden_replay.py replays every golden (both kernel paths); this file
checks what is particular to the teacher.
"""
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "chunk_causal_seed1.safetensors"
_spec = importlib.util.spec_from_file_location("replay_golden", REPO / "bench" / "replay_golden.py")
replay_golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replay_golden)


def test_teacher_schedule_timesteps_and_every_step_match():
    result = replay_golden.replay(str(GOLDEN), "torch")
    assert result["recipe"] == "chunk-causal" and result["passed"], result
    assert result["schedule_matches"] and all(step["timesteps_match"] for step in result["prediction_rel_error_per_step"])
    # 3 chunks, 4 steps, interval 1/3: 6 global steps; chunk 0 cached while chunks 1-2 are in flight
    assert [tuple(s["frames"]) for s in result["prediction_rel_error_per_step"]] == [
        (0, 4), (0, 7), (0, 10), (0, 10), (4, 10), (7, 10)]
    assert [len(steps) for steps in result["prediction_rel_error_per_chunk_step"]] == [4, 4, 4]
    assert result["max_prediction_rel_error"] < 1e-4


def test_a_window_instead_of_every_earlier_chunk_is_refused_for_in_flight_chunks():
    """The streaming window cannot serve the teacher's multi-chunk calls from a cache: it is refused."""
    import pytest

    with pytest.raises(ValueError, match="cached_segments=None"):
        replay_golden.replay(str(GOLDEN), "torch", cached_segments=1)


def test_diffusers_camera_downscale_is_caught():
    """diffusers' UCPE RMS downscale is not in the original code: with it the replay fails."""
    result = replay_golden.replay(str(GOLDEN), "torch", gdn_camera_downscale=True, softmax_camera_downscale=True)
    assert result["max_rel_error"] > 1e-3

