"""Segment mode against golden files of the official NVlabs streaming sampler (tests/golden/, see its README).

Every committed golden is replayed through `bench/replay_golden.py` (camrender's loader, camera code
and segment sampler, fp32) with the PyTorch references, and with the fused kernels (ieee): the first two
chunks of one streaming golden through the Triton interpreter here, every golden whole on a GPU
(`-m gpu`). The final latents must match to 1e-4 relative. Changing one official rule must break it.
"""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# the segment-mode goldens (bidirectional ones replay through full mode: test_golden_bidirectional.py)
GOLDENS = sorted(g for g in (REPO / "tests" / "golden").glob("*.safetensors") if not g.stem.startswith("bidirectional"))
STREAMING = [g for g in GOLDENS if not g.stem.startswith("chunk_causal")]  # the self-forcing sampler's
_spec = importlib.util.spec_from_file_location("replay_golden", REPO / "bench" / "replay_golden.py")
replay_golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replay_golden)


def test_goldens_are_committed():
    assert len(GOLDENS) >= 2


def _assert_replays(result, chunks=None):
    assert result["chunk_bounds"] == result["golden_chunk_bounds"]
    assert chunks is None or len(result["chunk_bounds"]) == chunks + 1
    assert result["camera_conditions_rel_error"] < 1e-5 and result["chunk_plucker_rel_error"] < 1e-5
    assert max(max(steps) for steps in result["prediction_rel_error_per_chunk_step"]) < 1e-4
    assert result["max_rel_error"] <= 1e-4 and result["passed"], result


@pytest.mark.parametrize("golden", GOLDENS, ids=[g.stem for g in GOLDENS])
def test_segment_mode_replays_the_official_sampler(golden):
    _assert_replays(replay_golden.replay(str(golden), "torch"))


def test_fused_kernels_replay_the_first_two_chunks():
    """The fused kernels through the interpreter on the golden with randomised K short convs: the first
    chunk, its cache pass and the second chunk from that cache (a whole path takes minutes per golden
    through the interpreter: the GPU suite replays every golden below)."""
    golden = next(g for g in STREAMING if "convs_s6" in g.stem)
    result = replay_golden.replay(str(golden), "fused", chunks=2)
    assert result["kernels"] == "fused" and result["device"] == "cpu"
    _assert_replays(result, chunks=2)


@pytest.mark.gpu
@pytest.mark.parametrize("golden", GOLDENS, ids=[g.stem for g in GOLDENS])
def test_fused_kernels_replay_every_golden_on_the_gpu(golden):
    """Every golden, the whole path, on the fused kernels compiled for the GPU (ieee precision)."""
    result = replay_golden.replay(str(golden), "fused")
    assert result["kernels"] == "fused" and result["device"] == "cuda"
    _assert_replays(result)


@pytest.mark.parametrize("rule", [
    dict(cached_segments=2),  # a softmax window of the sink + 2 recent chunks
    dict(gdn_camera_downscale=True),  # diffusers' RMS downscale of the UCPE-encoded camera q/k/v (GDN blocks)
    dict(softmax_camera_downscale=True),  # the same in the softmax blocks (NVlabs 40151c8, diffusers)
    dict(softmax_scale="padded"),  # camera softmax at 1/sqrt(128)
])
def test_a_rule_other_than_the_official_one_is_caught(rule):
    golden = next(g for g in GOLDENS if "h48" in g.stem)  # head dim 48: padded to 128 for SDPA
    result = replay_golden.replay(str(golden), "torch", **rule)
    assert result["max_rel_error"] > 1e-3, rule


@pytest.mark.parametrize("kind", ["convs", "chunk_causal"])  # the goldens with randomised K short convs
def test_short_conv_context_is_carried_across_chunks(kind):
    """The conv-perturbed goldens fail when the camera K short conv restarts at every chunk."""
    import camrender.model.stage1.gdn_attention as gdn

    golden = next(g for g in GOLDENS if kind in g.stem)
    carried = gdn.carried_short_conv
    gdn.carried_short_conv = lambda conv, raw, call, state, tail_name, backend: (
        gdn.segment_short_conv(conv, raw, call, backend, carry=False)[0] if tail_name == "cam_key_tail"
        else carried(conv, raw, call, state, tail_name, backend))
    try:
        result = replay_golden.replay(str(golden), "torch")
    finally:
        gdn.carried_short_conv = carried
    assert result["max_rel_error"] > 1e-3
    assert result["final_latents_rel_error_per_chunk"][0] < 1e-5  # chunk 0 has no context to carry


def test_replay_cli_prints_json_and_exits_0():
    done = subprocess.run([sys.executable, str(REPO / "bench" / "replay_golden.py"), str(GOLDENS[0]), "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["max_rel_error"] <= 1e-4 and 0.9999 < result["cosine"] <= 1.0 + 1e-9
    assert len(result["prediction_rel_error_per_chunk_step"]) == len(result["chunk_bounds"]) - 1
