"""Reading SANA-WM-Bench's split folders and manifests (camrender.trajectory.formats.sana_wm_bench): per scene the
image, prompt and camera path, and one line naming the file and field for every kind of broken input."""
from __future__ import annotations

import json

import numpy as np
import pytest

from camrender.errors import CamrenderError
from camrender.trajectory.formats.sana_wm_bench import load_scene, read_bench, read_manifest
from eval_paths import FOCAL, FPS, HEIGHT, SPLIT_DIR, WIDTH, dolly, handheld, write_bench


def test_a_split_folder_its_export_folder_and_its_manifest_read_alike(tmp_path):
    manifest = write_bench(tmp_path, {"indoor_001": dolly(), "game_style_002": handheld(41)})
    for source in (tmp_path / SPLIT_DIR, manifest.parent, manifest):
        scenes = read_bench(source)
        assert [s.scene_id for s in scenes] == ["indoor_001", "game_style_002"]
        first, second = scenes
        assert first.output_name == "indoor_001_generated.mp4"
        assert first.row.prompt == first.traj.prompt == "a walk through indoor_001"
        assert first.row.scene_type == "indoor"
        assert first.traj.image == str(tmp_path / "images" / "indoor_001.png")
        assert (first.traj.width, first.traj.height) == (2 * WIDTH, 2 * HEIGHT)  # the image's pixels
        assert np.allclose(first.traj.intrinsics[0], [2 * FOCAL, 2 * FOCAL, WIDTH, HEIGHT], atol=1e-3)
        assert first.traj.fps == FPS and first.traj.num_frames == 81 and second.traj.num_frames == 41
        assert np.allclose(second.traj.c2w, handheld(41), atol=1e-6)
        assert first.traj.source == str(manifest.parent / "indoor_001.npz")


def _rewrite_row(manifest, **changes):
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    rows[-1].update(changes)
    rows[-1] = {k: v for k, v in rows[-1].items() if v is not None}
    manifest.write_text("\n".join(json.dumps(row) for row in rows) + "\n")


def _npz(manifest, scene_id, **arrays):
    path = manifest.parent / f"{scene_id}.npz"
    current = dict(np.load(path))
    current.update(arrays)
    np.savez(path, **{k: v for k, v in current.items() if v is not None})


def _error(source) -> CamrenderError:
    with pytest.raises(CamrenderError) as error:
        read_bench(source)
    assert "\n" not in str(error.value)
    return error.value


@pytest.mark.parametrize("change, where, field", [
    ({"image_path": "images/nowhere.png"}, "line 2", "image_path"),
    ({"camera_path": "nowhere.npz"}, "line 2", "camera_path"),
    ({"prompt": None}, "line 2", "prompt"),
    ({"prompt": ""}, "line 2", "prompt"),
    ({"id": "indoor_001"}, "line 2", "id"),  # the id of line 1 again
    ({"id": "../escape"}, "line 2", "id"),
])
def test_a_bad_row_names_its_line_and_field(tmp_path, change, where, field):
    manifest = write_bench(tmp_path, {"indoor_001": dolly(9), "indoor_002": dolly(9)})
    _rewrite_row(manifest, **change)
    error = _error(manifest)
    assert error.path == f"{manifest}: {where}" and error.field == field


@pytest.mark.parametrize("arrays, field, frame", [
    ({"intrinsics": None}, "intrinsics", None),
    ({"c2w": np.zeros((9, 3, 4))}, "c2w", None),
    ({"intrinsics": np.tile(np.eye(3), (8, 1, 1))}, "intrinsics", None),
    ({"num_frames": np.int64(961)}, "num_frames", None),
    ({"c2w": np.concatenate([dolly(8), 2 * np.eye(4)[None]])}, "c2w", 8),  # frame 8 is not rigid
])
def test_a_bad_camera_file_names_itself_and_the_field(tmp_path, arrays, field, frame):
    manifest = write_bench(tmp_path, {"indoor_001": dolly(9)})
    _npz(manifest, "indoor_001", **arrays)
    error = _error(tmp_path / SPLIT_DIR)
    assert error.path == str(manifest.parent / "indoor_001.npz") and error.field == field and error.frame == frame


def test_unreadable_manifests_and_files(tmp_path):
    manifest = write_bench(tmp_path, {"indoor_001": dolly(9)})
    assert "no sanawm_export_v2/run_manifest.jsonl" in str(_error(tmp_path))  # the dataset root is no split
    manifest.write_text('{"id": "a", "prompt": "p", "image_path": "x.png"\n')
    assert _error(manifest).path == f"{manifest}: line 1"
    manifest.write_text("\n\n")
    assert "holds no scenes" in str(_error(manifest))
    write_bench(tmp_path, {"indoor_001": dolly(9)})
    (manifest.parent / "indoor_001.npz").write_text("not a zip")
    assert "not a .npz archive" in str(_error(manifest))
    (tmp_path / "images" / "indoor_001.png").write_text("not a png")
    row = read_manifest(manifest)[0]
    with pytest.raises(CamrenderError) as error:
        load_scene(row)
    assert error.value.field == "image_path" and "cannot read the image" in str(error.value)


def test_paths_beside_the_manifest_are_found_too(tmp_path):
    manifest = write_bench(tmp_path, {"indoor_001": dolly(9)})
    (manifest.parent / "indoor_001.png").write_bytes((tmp_path / "images" / "indoor_001.png").read_bytes())
    _rewrite_row(manifest, image_path="indoor_001.png", camera_path="indoor_001.npz")
    assert read_bench(manifest)[0].traj.image == str(manifest.parent / "indoor_001.png")
