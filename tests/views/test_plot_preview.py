"""Plots and proxy-scene previews: projection geometry, every example trajectory, CLI output files."""
from __future__ import annotations

import glob
import os

import imageio.v3 as iio
import numpy as np
import pytest

from camrender.cli.main import main
from camrender.views import grain
from camrender.views.preview import (
    LANDMARKS,
    overlay_lines,
    ProxyScene,
    pose_angles,
    preview_size,
    relative_poses,
    render_frames,
    scaled_intrinsics,
)
from camrender.trajectory import Trajectory, load
from camrender.trajectory.rotations import look_at_rotation, rot_x, rot_y, rot_z

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "trajectories", "*")))


def _look_at(position, target):
    c2w = np.eye(4)
    c2w[:3, :3] = look_at_rotation(position, target, [0.0, -1.0, 0.0])
    c2w[:3, 3] = position
    return c2w


def _silhouette(prefix, c2w, intrinsics, size) -> np.ndarray:
    """Pixels covered by one landmark: where the scene with it differs from the scene without it."""
    others = tuple(lm for lm in LANDMARKS if not lm.name.startswith(prefix))
    with_it = ProxyScene().render(c2w, intrinsics, *size)
    without = ProxyScene(landmarks=others).render(c2w, intrinsics, *size)
    return np.any(with_it != without, axis=2)


def _landmark(prefix):
    return next(lm for lm in LANDMARKS if lm.name.startswith(prefix))


@pytest.mark.parametrize(
    "prefix, position, intrinsics, size",
    [
        ("red sphere", [-1.5, -0.3, 1.0], (300.0, 300.0, 160.0, 90.0), (320, 180)),
        # off-centre principal point, non-square pixels, camera up high looking down
        ("blue sphere", [2.0, -2.5, 1.0], (410.0, 380.0, 141.3, 97.6), (320, 200)),
        ("magenta sphere", [5.5, 0.2, -3.0], (250.0, 260.0, 170.2, 80.4), (300, 170)),
    ],
)
def test_landmark_looked_at_lands_on_principal_point(prefix, position, intrinsics, size):
    scene = ProxyScene()
    landmark = _landmark(prefix)
    centre = scene.landmark_center(prefix)
    c2w = _look_at(np.array(position), centre)
    image = scene.render(c2w, intrinsics, *size)
    assert image.shape == (size[1], size[0], 3) and image.dtype == np.uint8
    mask = _silhouette(prefix, c2w, intrinsics, size)
    assert mask.sum() > 50, "landmark not visible"
    rows, cols = np.nonzero(mask)
    fx, fy, cx, cy = intrinsics
    assert abs(cols.mean() - cx) < 1.0
    assert abs(rows.mean() - cy) < 1.0
    # and its size matches projection math: a sphere of radius r at distance d looks
    # like a disc of radius f * r / sqrt(d^2 - r^2) (area within 5%)
    d = np.linalg.norm(centre - np.array(position))
    r = landmark.size
    expected_area = np.pi * fx * fy * r * r / (d * d - r * r)
    assert abs(mask.sum() / expected_area - 1) < 0.05


def test_pixel_windows_never_clip_a_landmark(monkeypatch):
    # landmarks are only shaded inside a projected pixel window; with the window forced to the
    # whole image the pictures must be identical, from any pose (near, far, grazing, behind)
    rng = np.random.default_rng(7)
    scene = ProxyScene()
    poses = []
    for _ in range(24):
        c2w = np.eye(4)
        c2w[:3, :3] = rot_y(rng.uniform(-np.pi, np.pi)) @ rot_x(rng.uniform(-0.8, 0.8)) @ rot_z(rng.uniform(-0.3, 0.3))
        c2w[:3, 3] = [rng.uniform(-7, 7), rng.uniform(-1.5, 1.4), rng.uniform(-6, 12)]
        poses.append(c2w)
    intr = (40.0, 42.0, 31.0, 19.0)
    windowed = [scene.render(c2w, intr, 64, 36) for c2w in poses]
    monkeypatch.setattr(ProxyScene, "_screen_window", lambda self, obj, c2w, intr, w, h: (0, h, 0, w))
    for c2w, image in zip(poses, windowed):
        assert np.array_equal(scene.render(c2w, intr, 64, 36), image)


def test_camera_under_the_ground_sees_its_underside():
    c2w = np.eye(4)
    c2w[:3, :3] = rot_x(0.6)  # looking up
    c2w[:3, 3] = [0.3, 3.0, 0.0]  # 1.5 units under the ground plane y = 1.5
    image = ProxyScene().render(c2w, (60.0, 60.0, 32.0, 18.0), 64, 36).astype(int)
    top = image[:8]
    assert np.mean(np.abs(top[..., 0] - top[..., 2]) < 30) > 0.9  # ground colours overhead (and the blue z axis)
    assert top.std() > 3  # with its checker and grid


def test_scene_scale_scales_the_world():
    # doubling the scene and the camera position gives the same picture
    position = np.array([1.0, -0.5, -1.5])
    target = ProxyScene().landmark_center("green box")
    intr, size = (200.0, 200.0, 96.0, 54.0), (192, 108)
    small = ProxyScene(1.0).render(_look_at(position, target), intr, *size)
    large = ProxyScene(2.0).render(_look_at(2 * position, 2 * target), intr, *size)
    assert np.mean(np.abs(small.astype(int) - large.astype(int)) > 2) < 0.01


def test_level_camera_sees_sky_above_and_ground_below_the_horizon():
    intr = (120.0, 120.0, 80.0, 45.0)
    c2w = np.eye(4)
    c2w[:3, :3] = rot_y(np.pi)  # look backwards along -z: only the orange box, far off
    c2w[:3, 3] = [40.0, 0.0, 0.0]  # away from every landmark
    image = ProxyScene().render(c2w, intr, 160, 90).astype(int)
    sky, ground = image[:40], image[50:]
    assert np.all(sky[..., 2] > sky[..., 0] + 20)  # blue above the horizon row cy = 45
    assert np.all(np.abs(ground[-10:, :, 0] - ground[-10:, :, 2]) < 60)  # grey-brown ground near the camera
    assert not np.all(ground[..., 2] > ground[..., 0] + 20)


def test_ground_grid_and_axis_lines_sit_where_projection_puts_them(monkeypatch):
    # looking straight down from 1 unit above the ground at (x, z) = (0.5, 0.5), fx = fy = 200:
    # column u shows world x = 0.5 + (u - 200) / 200, row v shows world z = 0.5 - (v - 200) / 200
    monkeypatch.setattr(grain, "AMPLITUDE", 0.0)  # the lines alone: the grain's dark blotches are no lines
    c2w = np.eye(4)
    c2w[:3, :3] = rot_x(-np.pi / 2)  # camera x = world x, camera y = world -z, camera z = world +y (down)
    c2w[:3, 3] = [0.5, 1.5 - 1.0, 0.5]
    image = ProxyScene().render(c2w, (200.0, 200.0, 200.0, 200.0), 401, 401).astype(int)
    row = image[150]  # world z = 0.75: between grid lines
    brightness = row[200:400].sum(axis=1)
    line = np.nonzero(brightness < (brightness.max() + brightness.min()) / 2)[0] + 200
    assert abs(line.mean() - 300) <= 0.5 and 4 <= len(line) <= 8  # grid line x = 1 (0.03 wide) at u = 300
    assert row[200].sum() > row[300].sum() + 100  # cell centre lighter than the line
    r, g, b = image[150, 100]  # world x = 0: the z axis, drawn blue
    assert b > r + 60 and b > g + 40
    r, g, b = image[300, 250]  # world z = 0: the x axis, drawn red
    assert r > g + 60 and r > b + 60


def test_grain_is_fixed_to_the_world(monkeypatch):
    # looking straight down from 1 unit above the ground with fx = fy = 200, a camera moved 0.25 units along
    # +x sees the same ground 50 pixels to the left: the grain moves with the world, as the features a pose
    # estimator tracks must; inside a checker cell it is what gives the picture texture
    c2w = np.eye(4)
    c2w[:3, :3] = rot_x(-np.pi / 2)
    c2w[:3, 3] = [0.3, 0.5, 0.4]
    moved = c2w.copy()
    moved[0, 3] += 0.25
    intr = (200.0, 200.0, 100.0, 100.0)
    first = ProxyScene().render(c2w, intr, 201, 201).astype(int)
    second = ProxyScene().render(moved, intr, 201, 201).astype(int)
    assert np.abs(first[:, 50:] - second[:, :-50]).max() <= 2
    patch = (slice(110, 140), slice(110, 140))  # world x 0.35 .. 0.5, z 0.2 .. 0.35: one cell, no grid line
    monkeypatch.setattr(grain, "AMPLITUDE", 0.0)
    plain = ProxyScene().render(c2w, intr, 201, 201).astype(int)
    assert plain[patch].std(axis=(0, 1)).max() < 1 and first[patch].std(axis=(0, 1)).min() > 8


def test_relative_preview_ignores_where_the_path_starts():
    rng = np.random.default_rng(3)
    frames = 5
    motion = np.tile(np.eye(4), (frames, 1, 1))
    for f in range(frames):
        motion[f, :3, :3] = rot_y(0.1 * f) @ rot_x(0.03 * f)
        motion[f, :3, 3] = [0.1 * f, -0.05 * f, 0.3 * f]
    start = np.eye(4)
    start[:3, :3] = rot_z(0.4) @ rot_y(1.1)
    start[:3, 3] = rng.normal(size=3) * 10
    intr = np.tile([60.0, 60.0, 32.0, 18.0], (frames, 1))
    plain = Trajectory(motion, intr, 64, 36, 16.0)
    moved = Trajectory(start @ motion, intr, 64, 36, 16.0)
    assert np.allclose(relative_poses(moved.c2w), motion, atol=1e-12)
    a = np.stack(list(render_frames(plain, threads=1)))
    b = np.stack(list(render_frames(moved, threads=2)))
    assert np.mean(np.abs(a.astype(int) - b.astype(int)) > 2) < 0.002
    # --absolute uses the stored poses: the same as relative for a path starting at the
    # origin, something else for the moved one
    assert np.array_equal(np.stack(list(render_frames(plain, relative=False))), a)
    c = np.stack(list(render_frames(moved, relative=False)))
    assert np.mean(np.abs(a.astype(int) - c.astype(int)) > 2) > 0.2


def test_overlay_writes_only_in_the_top_left_corner():
    intr = np.tile([300.0, 300.0, 160.0, 120.0], (2, 1))
    traj = Trajectory(np.tile(np.eye(4), (2, 1, 1)), intr, 320, 240, 16.0)
    plain = next(render_frames(traj))
    stamped = next(render_frames(traj, overlay=True))
    changed = np.any(plain != stamped, axis=2)
    rows, cols = np.nonzero(changed)
    assert changed.sum() > 500
    assert rows.max() < 120 and cols.max() < 320 * 0.9 and cols.min() < 10


def test_overlay_lines_state_pose_and_fov():
    c2w = np.eye(4)
    c2w[:3, :3] = rot_y(np.radians(-20))
    c2w[:3, 3] = [1.0, -0.5, 2.25]
    lines = overlay_lines(3, 10, c2w, (50.0, 50.0, 50.0, 30.0), 100, 60)
    assert lines == ["frame 3/9", "x +1.00 y -0.50 z +2.25", "yaw -20.0 pitch +0.0 roll +0.0", "hfov 90.0"]


def test_pose_angles_signs():
    c2w = np.eye(4)
    c2w[:3, :3] = rot_y(np.radians(30)) @ rot_x(np.radians(-10)) @ rot_z(np.radians(5))
    yaw, pitch, roll = pose_angles(c2w)
    assert (round(yaw, 6), round(pitch, 6), round(roll, 6)) == (30.0, -10.0, 5.0)  # rot_x(-10 deg) looks down


def test_preview_size_and_intrinsics_scaling():
    traj = Trajectory(np.tile(np.eye(4), (1, 1, 1)), [[1000.0, 900.0, 640.0, 352.0]], 1280, 704, 16.0)
    assert preview_size(traj) == (1280, 704)
    assert preview_size(traj, width=320) == (320, 176)
    assert preview_size(traj, height=101) == (184, 102)
    assert preview_size(traj, 100, 50) == (100, 50)
    assert np.allclose(scaled_intrinsics(traj, 320, 176), [[250.0, 225.0, 160.0, 88.0]])


@pytest.mark.parametrize("path", EXAMPLES, ids=[os.path.basename(p) for p in EXAMPLES])
def test_plot_and_preview_every_example(path, tmp_path, capsys):
    traj = load(path)
    png, mp4 = tmp_path / "plot.png", tmp_path / "preview.mp4"
    for argv in (["traj", "plot", path, "-o", str(png)], ["traj", "preview", path, "-o", str(mp4), "--width", "48"]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0, capsys.readouterr().err
    plot = iio.imread(png)
    assert plot.shape[:2] == (800, 1200) and plot.std() > 10
    video = iio.imread(mp4, index=None)
    w, h = preview_size(traj, width=48)
    assert video.shape == (traj.num_frames, h, w, 3)
    assert video.std() > 10
    assert sorted(os.listdir(tmp_path)) == ["plot.png", "preview.mp4"]  # no temporary files left


def test_examples_exist():
    assert any(p.endswith("orbit.json") for p in EXAMPLES)


def test_plot_chart_values():
    from camrender.views.plot import angular_speeds, speeds
    from camrender.trajectory import stats

    frames = 6
    c2w = np.tile(np.eye(4), (frames, 1, 1))
    for f in range(frames):
        c2w[f, :3, :3] = rot_y(0.05 * f)
        c2w[f, :3, 3] = [0.0, 0.0, 0.25 * f]
    intr = np.tile([100.0, 50.0, 30.0, 25.0], (frames, 1))  # principal point off centre in x
    traj = Trajectory(c2w, intr, 100, 50, 16.0)
    assert np.allclose(speeds(traj), 4.0)
    assert np.allclose(angular_speeds(traj), np.degrees(0.05) * 16)
    hfov, vfov = stats.fields_of_view(traj.intrinsics, traj.width, traj.height)
    assert np.allclose(hfov, np.degrees(np.arctan(0.3) + np.arctan(0.7)))
    assert np.allclose(vfov, 2 * np.degrees(np.arctan(0.5)))
    # `traj check` reports the same off-centre field of view as the plot and the preview overlay
    assert np.isclose(stats.compute(traj).fov_h[0], hfov[0])


@pytest.mark.parametrize("path", [os.path.join(ROOT, "trajectories", "orbit.json"), "w-40,d-20,w-40"])
def test_plot_keeps_the_markers_and_the_speed_line_in_sight(path):
    """The scale bar and the legend sit in corners the start and end markers leave free; speed and rotation
    speed have a chart each (on one chart with two scales, a constant rotation speed hid the speed line)."""
    from camrender.cli.path_options import load_path
    from camrender.views.plot import draw

    traj, _ = load_path(path, {})
    figure = draw(traj)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    positions = traj.c2w[:, :3, 3]
    views = {"top view": positions[:, [0, 2]], "side view": np.stack([positions[:, 2], -positions[:, 1]], axis=1)}
    for ax in figure.axes:
        title = ax.get_title().split(" (")[0]
        if title not in views:
            continue
        bar = next(artist for artist in ax.artists if "unit" in artist.txt_label.get_text())
        for box in (bar.get_window_extent(renderer), ax.get_legend().get_window_extent(renderer)):
            for marker in ax.transData.transform(views[title][[0, -1]]):
                assert not box.expanded(1, 1).padded(8).contains(*marker), (title, box, marker)
    lines = {ax.get_title(): ax.get_lines() for ax in figure.axes if "speed" in ax.get_title()}
    assert sorted(lines) == ["rotation speed between frames", "speed between frames"]
    assert all(len(drawn) == 1 for drawn in lines.values())


def test_plot_single_frame(tmp_path):
    from camrender.views.plot import plot_trajectory

    traj = Trajectory(np.eye(4)[None], [[100.0, 100.0, 64.0, 36.0]], 128, 72, 16.0)
    plot_trajectory(traj, tmp_path / "one.png")
    image = iio.imread(tmp_path / "one.png")
    assert image.shape[:2] == (800, 1200) and image.std() > 10
