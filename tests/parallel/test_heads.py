"""The head split (`camrender.parallel.heads`) on the CPU: gloo, two processes, tiny models.

The split blocks, FFNs and the whole forward equal the unsplit ones, and a segment-mode render on two
processes equals the one-process render and only rank 0 writes: all on the PyTorch references, the CPU
render path (the Triton kernels on a head slice, through the interpreter: tests/kernels/test_kernels_head_split.py).
"""
import pytest
import torch

from camrender.errors import CamrenderError
from camrender.parallel.cfg import check_split, head_split_size
from camrender.parallel.heads import check_heads
from test_distributed import REPO, assert_one_video_written, assert_ranks_agree, max_rel, run_processes
from test_render_cli import run_cli, small_trajectory

WORKER = REPO / "tests" / "parallel" / "heads_worker.py"


def torchrun(args, cwd, interpret, nproc=2):
    """`torchrun --nproc-per-node NPROC ARGS`, the Triton kernels through the interpreter or not."""
    return run_processes(["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args], cwd,
                         interpret=interpret)


def test_split_modules_and_forward_equal_the_whole_model(tmp_path):
    code, err, _ = torchrun([WORKER, "modules", tmp_path / "modules.pt"], tmp_path, interpret=False)
    assert code == 0, err[-3000:]
    rank0, rank1 = torch.load(tmp_path / "modules.pt", weights_only=False)
    assert rank0["heads"] == rank1["heads"] == [2, 2]  # 4 heads of the tiny model, 2 per rank
    assert rank0["qkv_rows"] == 48  # this rank's q, k, v channels: 3 x 32 / 2, sliced from the weights
    names = ["attn0", "cross0", "ffn0", "attn1", "cross1", "ffn1", "forward"]  # block 0 GDN, block 1 softmax
    assert max(rank0["floors"].values()) < 5e-4  # the bar below stays far under a wrong split's error (1e-1)
    for name in names:
        for results in (rank0, rank1):
            split, whole = results[name]
            assert split.shape == whole.shape
            # within 1e-5, or twice the unsplit part's own one-ulp noise where this machine's BLAS makes that larger
            bar = max(1e-5, 2 * results["floors"][name])
            assert max_rel(split, whole) <= bar, (name, max_rel(split, whole), bar)
        assert torch.equal(rank0[name][0], rank1[name][0])  # every rank holds the same whole output


def test_segment_mode_on_two_processes_equals_one_and_rank_0_writes(tmp_path):
    path = small_trajectory(tmp_path)
    out = tmp_path / "work" / "v.mp4"
    out.parent.mkdir()
    code, err, _ = torchrun([WORKER, "segments", tmp_path / "latents.pt", "render", "--traj", path, "--out", out,
                             "--model", "tiny", "--mode", "segments", "--segment-frames", "1", "--device", "cpu"],
                            tmp_path, interpret=False)
    assert code == 0, err[-3000:]
    results = torch.load(tmp_path / "latents.pt", weights_only=False)
    # three segments of one latent frame: the states pass twice
    assert all(results[dtype]["ranks"][0].shape[2] == 3 for dtype in ("torch.float32", "torch.float64"))
    assert_ranks_agree(results, {"torch.float32": 1e-5, "torch.float64": 1e-6})
    assert_one_video_written(out, err)
    assert err.count("every block's heads split over 2 GPUs") == 1


def test_guided_full_mode_on_four_processes_is_cfg_times_head_split(tmp_path):
    code, err, _ = torchrun([WORKER, "full", tmp_path / "latents.pt", "4.0"], tmp_path, interpret=False, nproc=4)
    assert code == 0, err[-3000:]
    results = torch.load(tmp_path / "latents.pt", weights_only=False)
    assert results["layout"][0] == (1, 2)  # rank 0 keeps 1 of the tiny model's 2 heads: a head split of 2
    # float32 on the GDN-only tiny model (dist_worker.precision_model says why); float64: the kernels'
    # references still take the norms' RMS in fp32
    assert_ranks_agree(results, {"torch.float32": 1e-5, "torch.float64": 1e-6}, ranks=4)


def test_heads_split_2_4_or_5_ways_and_other_counts_are_refused():
    for size in (1, 2, 4, 5, 10, 20):
        check_heads(20, size)
    with pytest.raises(CamrenderError) as refused:
        check_heads(20, 3)
    assert "\n" not in str(refused.value) and "20 heads do not split over 3 GPUs" in str(refused.value)
    assert refused.value.field == "gpus"


@pytest.mark.parametrize("mode, guidance, gpus, heads", [
    ("full", 4.0, 1, 1), ("full", 4.0, 2, 1), ("full", 4.0, 4, 2), ("full", 4.0, 8, 4),
    ("full", None, 2, 2), ("full", 1.0, 4, 4), ("segments", None, 2, 2), ("segments", 4.0, 5, 5),
])
def test_layouts_of_a_video_group(mode, guidance, gpus, heads):
    check_split(mode, guidance, gpus)
    assert head_split_size(mode, guidance, gpus) == heads


def test_guided_full_mode_on_an_odd_group_is_refused():
    with pytest.raises(CamrenderError, match="3 GPUs per video do not halve"):
        check_split("full", 4.0, 3)


def test_segment_resume_on_several_gpus_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = small_trajectory(tmp_path)
    code, _, err = run_cli(["--traj", path, "--out", tmp_path / "v.mp4", "--model", "tiny", "--device", "cpu",
                            "--mode", "segments", "--gpus", "2", "--resume"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--resume does not work with several GPUs" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["path.json"]
