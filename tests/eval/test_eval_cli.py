"""`camrender eval` measures: videos of known cameras through the proxy scene score RotErr <= 1 degree and
TransErr_rel <= 0.05 with colmap, 10x worse against another path, a still video is a failed estimate; bad input
is one line, exit code 2, nothing written; a results folder is scored against a benchmark manifest."""
from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

from camrender.eval.colmap_backend import ColmapEstimator
from camrender.eval.metrics import pose_errors
from camrender.eval.score import prepare, score
from camrender.output.video import VideoWriter
from camrender.trajectory import load, save
from eval_paths import PATHS, SPLIT_DIR, dolly, trajectory, write_bench, write_case
from helpers import run_cli

pytest.importorskip("pycolmap", reason="the colmap backend: pip install 'camrender[eval]'")

OTHER = {"orbit": "dolly", "dolly": "orbit", "handheld": "orbit"}  # a path of another shape (a Sim(3) fit
# makes a dolly and a forward walk alike)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """{name: (video, path file)} for each known path."""
    folder = tmp_path_factory.mktemp("cases")
    return {name: write_case(folder, name, make()) for name, make in PATHS.items()}


@pytest.fixture(scope="module")
def scored(cases):
    """{name: VideoScore} of each case's video against its own path, colmap."""
    estimator = ColmapEstimator()
    return {name: score(prepare(video, load(path)), estimator) for name, (video, path) in cases.items()}


@pytest.mark.parametrize("name", sorted(PATHS))
def test_colmap_recovers_the_cameras_of_a_known_path(scored, name):
    result = scored[name]
    assert result.status == "scored" and result.errors.registered.all()
    assert len(result.errors.rotation_deg) == 21
    assert result.errors.rot_err <= 1.0
    assert result.errors.trans_err_rel <= 0.05


@pytest.mark.parametrize("name", sorted(PATHS))
def test_the_same_video_against_another_path_scores_ten_times_worse(scored, name):
    # the aligned estimate stands for the video: the metrics do not see its frame or scale (test_metrics)
    right = scored[name].errors
    other = PATHS[OTHER[name]]()[scored[name].job.plan.path_indices]
    wrong = pose_errors(other, right.estimated)
    assert wrong.rot_err >= 10 * right.rot_err
    assert wrong.trans_err_rel >= 10 * right.trans_err_rel


def test_cli_scores_a_video_against_the_path_beside_it(cases, capsys):
    video, _ = cases["handheld"]
    code, out, err = run_cli(["eval", video, "--progress", "lines"], capsys)
    assert code == 0, err
    record = json.loads(video.with_suffix(".eval.json").read_text())
    assert record["status"] == "scored" and record["RotErr_unit"] == "deg"
    assert record["RotErr"] <= 1.0 and record["TransErr_rel"] <= 0.05
    assert record["registered_frames"] == record["n_frames"] == 21
    assert record["per_frame"]["path_frame"] == list(range(0, 81, 4))
    assert np.mean(record["per_frame"]["TransErr"]) == pytest.approx(record["TransErr_rel"], abs=1e-6)
    assert video.with_suffix(".eval.png").stat().st_size > 10_000
    assert f"RotErr {record['RotErr']:.3f} deg" in out
    assert "colmap features: frame 21/21" in err and "21/21 frames registered" in err


def test_a_still_video_is_a_failed_estimate_not_a_perfect_score(cases, tmp_path, capsys):
    still = next(iter(load_frames(cases["orbit"][0], 1)))
    video = tmp_path / "still.mp4"
    with VideoWriter(video, 16) as writer:
        writer.append(np.repeat(still[None], 81, axis=0))
    shutil.copy(cases["orbit"][1], tmp_path / "still.traj.json")
    code, out, err = run_cli(["eval", video, "-q"], capsys)
    assert code == 3, err
    record = json.loads((tmp_path / "still.eval.json").read_text())
    assert record["status"] == "failed" and record["RotErr"] is None and "does not move" in record["reason"]
    assert "failed estimate" in out and not (tmp_path / "still.eval.png").exists()
    # and colmap on its own places none of those frames
    estimate = ColmapEstimator().estimate(np.repeat(still[None], 21, axis=0), trajectory(dolly(21)).intrinsics)
    assert not estimate.registered.any() and estimate.failure


def test_an_estimator_that_raises_is_a_failed_estimate(cases):
    class Broken:
        name = "broken"

        def estimate(self, frames, intrinsics, progress=None):
            raise RuntimeError("no model\nhere")

    video, path = cases["dolly"]
    result = score(prepare(video, load(path)), Broken())
    assert result.status == "failed" and result.errors is None
    assert result.reason == "broken failed: RuntimeError: no model here"


def load_frames(video, count):
    from camrender.eval.video import probe, read_frames

    return read_frames(probe(video), range(count))


def _bad_video_and_path(tmp_path, cases, kind):
    video, path = tmp_path / "case.mp4", tmp_path / "path.json"
    shutil.copy(cases["dolly"][0], video)
    shutil.copy(cases["dolly"][1], path)
    if kind == "lengths":
        save(trajectory(dolly(41)), path)
    elif kind == "poses":
        save(trajectory(dolly(2)), path)
    elif kind == "video":
        video.write_text("not a video")
    return video, path


@pytest.mark.parametrize("kind, field, names", [
    ("lengths", "frames", "case.mp4"),
    ("poses", "c2w", "path.json"),
    ("video", "video", "case.mp4"),
])
def test_bad_video_or_path_is_one_line_and_writes_nothing(tmp_path, cases, capsys, kind, field, names):
    video, path = _bad_video_and_path(tmp_path, cases, kind)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = run_cli(["eval", video, "--traj", path], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{names}: {field}: " in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("backend, module, needle", [("colmap", "pycolmap", "pip install"),
                                                     ("pi3", "pi3", "github.com/yyfz/Pi3")])
def test_a_backend_not_installed_names_what_to_install(tmp_path, cases, capsys, monkeypatch, backend, module, needle):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as for a missing package
    video, path = _bad_video_and_path(tmp_path, cases, "none")
    code, _, err = run_cli(["eval", video, "--traj", path, "--backend", backend], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err and "backend" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["case.mp4", "path.json"]


def _results(tmp_path, cases):
    """A benchmark with three scenes, a results folder holding two of their videos, a revisit pair for one."""
    manifest = write_bench(tmp_path / "bench", {"indoor_001": PATHS["dolly"](), "indoor_002": PATHS["handheld"](),
                                                "outdoor_003": PATHS["orbit"]()})
    pairs = [{"frame_a": 8, "frame_b": 9, "quality_score": 1}]
    meta = {"scenes": [{"scene_id": "indoor_001", "evaluation_pairs": pairs}]}
    (manifest.parent.parent / "scene_trajectories_v2.json").write_text(json.dumps(meta))
    results = tmp_path / "results" / "my_method" / "simple_60s"
    results.mkdir(parents=True)
    shutil.copy(cases["dolly"][0], results / "indoor_001_generated.mp4")
    shutil.copy(cases["handheld"][0], results / "indoor_002_generated.mp4")
    return manifest, results


def test_a_results_folder_is_scored_against_the_manifest(tmp_path, cases, capsys, monkeypatch):
    manifest, results = _results(tmp_path, cases)
    code, out, err = run_cli(["eval", results, "--manifest", tmp_path / "bench" / SPLIT_DIR, "-q"], capsys)
    assert code == 0, err
    record = json.loads((results / "eval_aggregate.json").read_text())["records"][0]
    assert (record["method"], record["split"]) == ("my_method", "simple_60s")
    assert record["videos"]["scored"] == 2 and record["videos"]["missing"] == ["outdoor_003"]
    assert record["camera"]["n_scenes"] == 2 and record["camera"]["rot_err_deg"] <= 1.0
    assert record["camera"]["per_category"]["indoor"]["n_scenes"] == 2
    assert record["revisit"]["n_pairs"] == 1 and record["revisit"]["psnr"] > 20  # neighbouring frames of a dolly
    table = (results / "eval_aggregate.md").read_text()
    assert "| `my_method` | — | — | — |" in table and "missing videos: `outdoor_003`" in table
    for scene in ("indoor_001", "indoor_002"):
        assert json.loads((results / f"{scene}_generated.eval.json").read_text())["scene_type"] == "indoor"
    # a second run reuses what is done: no estimate is made again
    monkeypatch.setattr(ColmapEstimator, "estimate", lambda *args, **kwargs: pytest.fail("estimated again"))
    assert run_cli(["eval", results, "--manifest", manifest, "-q"], capsys)[0] == 0


def test_a_manifest_row_pointing_at_a_missing_file_writes_nothing(tmp_path, cases, capsys):
    manifest, results = _results(tmp_path, cases)
    (tmp_path / "bench" / SPLIT_DIR / "sanawm_export_v2" / "indoor_002.npz").unlink()
    before = sorted(p.name for p in results.iterdir())
    code, _, err = run_cli(["eval", results, "--manifest", manifest], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{manifest}: line 2: camera_path: file not found" in err
    assert sorted(p.name for p in results.iterdir()) == before
