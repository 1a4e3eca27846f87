"""Hostile files and values, every format and every way in: each is refused before anything loads or is written,
with one line naming the file or field, exit code 2, no traceback, no hang (FIFOs and devices as inputs), and in
bounded time (counts are checked before items are parsed one by one)."""
import contextlib
import json
import os
import signal
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
ORBIT = REPO / "trajectories" / "orbit.json"
EYE = np.eye(4).tolist()
TINY = ["--model", "tiny", "--kernels", "torch", "--steps", "1", "--prompt-cache", "off"]


@contextlib.contextmanager
def deadline(seconds):
    """Fail (instead of hanging the suite) when the block outlives `seconds`."""
    def expired(signum, frame):
        raise AssertionError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def refused(argv, capsys, folder, *names, seconds=20):
    """Run `camrender argv`: exit 2, one error line naming each of `names`, no traceback, no model loaded,
    nothing added to or removed from `folder`; returns the line."""
    before = sorted(os.listdir(folder))
    with deadline(seconds):
        code, out, err = run_cli(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("camrender: error: "), (argv, code, err)
    assert "Traceback" not in err and "loading" not in err, err
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert sorted(os.listdir(folder)) == before, (argv, err)
    return lines[0]


def write_json(path, doc):
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def nerfstudio(cameras, fov=50.0, width=64, height=32):
    flat = [x for row in EYE for x in row]
    return {"camera_path": [{"camera_to_world": flat, "fov": fov}] * cameras, "render_width": width,
            "render_height": height, "fps": 8}


def transforms(frames, **top):
    """A transforms.json of `frames` identical frames; `top` keys set to None are left out."""
    doc = {"w": 64, "h": 32, "fl_x": 50, **top}
    return {**{key: value for key, value in doc.items() if value is not None},
            "frames": [{"transform_matrix": EYE}] * frames}


def keyframes(fov):
    return {"version": 1, "width": 64, "height": 32, "fps": 8, "num_frames": 9,
            "keyframes": [{"t": 0, "position": [0, 0, 0], "look_at": [0, 0, 1], "fov": fov, "fov_axis": "horizontal"}]}


RE10K_ROW = "0 0.5 0.5 0.5 0.5 0 0 1 0 0 0 0 1 0 0 0 0 1 0"


def colmap_pair(folder, images="1 1 0 0 0 0 0 0 1 a.png\n\n", cameras="1 PINHOLE 64 32 50 50 32 16\n"):
    folder.mkdir()
    (folder / "images.txt").write_text(images)
    (folder / "cameras.txt").write_text(cameras)
    return folder / "images.txt"


# ----------------------------------------------------------------------------- not regular files
@pytest.mark.parametrize("name", ["path.json", "path.txt", "images.txt", "moves.actions"])
@pytest.mark.parametrize("kind", ["fifo", "dev/zero", "dev/urandom"])
def test_fifos_and_devices_are_refused_as_trajectories(tmp_path, capsys, name, kind):
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(f"/{kind}")
    for command in (["traj", "check", path], ["--traj", path, "--out", tmp_path / "v.mp4", *TINY]):
        refused(command, capsys, tmp_path, name, "not a regular file")


@pytest.mark.parametrize("kind", ["fifo", "dev/zero"])
def test_fifos_and_devices_are_refused_as_other_inputs(tmp_path, capsys, kind):
    special = tmp_path / "special"
    os.mkfifo(special) if kind == "fifo" else special.symlink_to(f"/{kind}")
    render = ["--traj", ORBIT, "--out", tmp_path / "v.mp4", *TINY]
    refused(render + ["--prompt-file", special], capsys, tmp_path, "special", "not a regular file")
    refused(["--from-render", special, "--out", tmp_path / "v.mp4"], capsys, tmp_path, "special")
    refused(["batch", special, "--model", "tiny"], capsys, tmp_path, "special", "jobs file")
    (tmp_path / "first.png").symlink_to(special)
    refused(render + ["--image", tmp_path / "first.png"], capsys, tmp_path, "first.png")
    (tmp_path / "w.safetensors").symlink_to(special)
    refused(render + ["--transformer-weights", tmp_path / "w.safetensors"], capsys, tmp_path, "w.safetensors",
            "not a regular file")
    (tmp_path / "k.npy").symlink_to(special)
    refused(render + ["--intrinsics", tmp_path / "k.npy"], capsys, tmp_path, "k.npy")
    doc = json.loads(ORBIT.read_text())
    write_json(tmp_path / "with_image.json", {**doc, "image": "first.png"})
    refused(["traj", "check", tmp_path / "with_image.json"], capsys, tmp_path, "image", "not a regular file")
    colmap = colmap_pair(tmp_path / "model")
    (colmap.parent / "cameras.txt").unlink()
    (colmap.parent / "cameras.txt").symlink_to(special)
    refused(["traj", "check", colmap], capsys, tmp_path, "cameras.txt", "not a regular file")


# ----------------------------------------------------------------------------- one set of limits
def test_image_sides_past_the_limit_are_refused_by_every_format(tmp_path, capsys):
    big = 9_999_999
    cases = [
        (tmp_path / "head.txt", f"camrender:{big}x720\n{RE10K_ROW}\n", "line 1: width"),
        (write_json(tmp_path / "transforms.json", transforms(2, w=big)), None, "w"),
        (write_json(tmp_path / "camera_path.json", nerfstudio(2, width=big)), None, "render_width"),
        (colmap_pair(tmp_path / "model", cameras=f"1 PINHOLE {big} 32 50 50 32 16\n"), None, "WIDTH"),
    ]
    for path, text, field in cases:
        if text is not None:
            path.write_text(text)
        refused(["traj", "check", path], capsys, tmp_path, path.name if path.name != "images.txt" else "cameras.txt",
                field)
    refused(["traj", "convert", ORBIT, "-o", tmp_path / "x.json", "--width", str(big)], capsys, tmp_path, "--width")


@pytest.mark.parametrize("make", ["nerfstudio", "transforms", "re10k", "colmap", "v1"])
def test_paths_of_too_many_frames_are_refused_before_parsing_them(tmp_path, capsys, make):
    count = 50_001
    if make == "nerfstudio":
        path = write_json(tmp_path / "camera_path.json", nerfstudio(count))
    elif make == "transforms":
        path = write_json(tmp_path / "transforms.json", transforms(count))
    elif make == "re10k":
        path = tmp_path / "cams.txt"
        path.write_text("url\n" + "".join(f"{i * 62500} {RE10K_ROW[2:]}\n" for i in range(count)))
    elif make == "colmap":
        rows = "".join(f"{i + 1} 1 0 0 0 0 0 0 1 f{i}.png\n\n" for i in range(count))
        path = colmap_pair(tmp_path / "model", images=rows)
    else:
        frame = {"c2w": EYE, "fx": 50, "fy": 50, "cx": 32, "cy": 16}
        path = write_json(tmp_path / "path.json", {"version": 1, "width": 64, "height": 32, "fps": 8,
                                                   "frames": [frame] * count})
    started = time.perf_counter()
    refused(["traj", "check", path], capsys, tmp_path, "50001 > 50000")
    assert time.perf_counter() - started < 15  # refused for its count, not after every item (a 38 s case)


def test_numbers_of_thousands_of_digits_are_refused_in_one_line(tmp_path, capsys):
    images = colmap_pair(tmp_path / "a", images="1" * 5000 + " 1 0 0 0 0 0 0 1 a.png\n\n")
    refused(["traj", "check", images], capsys, tmp_path, "IMAGE_ID", "5000 digits")
    images = colmap_pair(tmp_path / "b", cameras="9" * 5000 + " PINHOLE 64 32 50 50 32 16\n")
    refused(["traj", "check", images], capsys, tmp_path, "CAMERA_ID")
    images = colmap_pair(tmp_path / "c", images="1 " + "7" * 5000 + " 0 0 0 0 0 0 1 a.png\n\n")
    line = refused(["traj", "check", images], capsys, tmp_path, "QW")
    assert len(line) < 300


# ----------------------------------------------------------------------------- numbers at the edges
def test_fields_of_view_at_the_edges_are_refused_where_they_enter(tmp_path, capsys):
    tiny = 5e-324
    cases = [
        (write_json(tmp_path / "keys.json", keyframes(tiny)), "keyframes[0].fov"),
        (write_json(tmp_path / "keys2.json", keyframes(0.001)), "keyframes[0].fov"),
        (write_json(tmp_path / "preset.json", {"version": 1, "preset": {"name": "pan", "fov": tiny}}), "preset.fov"),
        (write_json(tmp_path / "camera_path.json", nerfstudio(2, fov=tiny)), "fov"),
        (write_json(tmp_path / "t1" / "transforms.json", transforms(2, camera_angle_x=tiny, fl_x=None)),
         "camera_angle_x"),
        (write_json(tmp_path / "t2" / "transforms.json", {"w": 64, "h": 32, "camera_angle_y": tiny,
                                                           "frames": [{"transform_matrix": EYE}]}), "camera_angle_y"),
        (write_json(tmp_path / "focal.json", {"version": 1, "width": 64, "height": 32, "fps": 8, "frames": [
            {"c2w": EYE, "fx": 1e300, "fy": 50, "cx": 32, "cy": 16}]}), "fx"),
    ]
    for path, field in cases:
        refused(["traj", "check", path], capsys, tmp_path, path.name, field)
    refused(["traj", "new", "static", "-o", tmp_path / "n.json", "--fov", str(tiny)], capsys, tmp_path, "fov")


@pytest.mark.parametrize("argv, field", [
    (["pan", "--degrees", "1e12"], "degrees"),
    (["pan", "--degrees", "1e7"], "degrees"),
    (["orbit", "--degrees", "-1e9"], "degrees"),
    (["spiral", "--turns", "1e9"], "turns"),
    (["zoom", "--factor", "1e308"], "fx"),
    (["dolly", "--distance", "1e300"], "c2w"),
])
def test_preset_values_that_expand_without_end_are_refused_at_once(tmp_path, capsys, argv, field):
    started = time.perf_counter()
    refused(["traj", "new", *argv, "-o", tmp_path / "n.json"], capsys, tmp_path, field)
    assert time.perf_counter() - started < 5  # refused, not expanded (1e7 degrees took 16 s and 630 MB)


def test_preset_blocks_take_any_key_as_a_parameter_name(tmp_path, capsys):
    for key in ("_where", "where", "params", "name2", "self"):
        path = write_json(tmp_path / f"{key}.json", {"version": 1, "preset": {"name": "static", key: 1}})
        refused(["traj", "check", path], capsys, tmp_path, f"preset.{key}", "unknown parameter")


@pytest.mark.parametrize("argv, field", [
    (["traj", "retime", ORBIT, "--seconds", "1e308", "-o", "{tmp}/r.json"], "seconds"),
    (["traj", "retime", ORBIT, "--fps", "1e308", "-o", "{tmp}/r.json"], "fps"),
    (["traj", "retime", ORBIT, "--seconds", "5e-324", "-o", "{tmp}/r.json"], "seconds"),
    (["traj", "preview", ORBIT, "-o", "{tmp}/p.mp4", "--scene-scale", "1e308"], "scene-scale"),
    (["traj", "preview", ORBIT, "-o", "{tmp}/p.mp4", "--scene-scale", "1e-308"], "scene-scale"),
    (["traj", "preview", ORBIT, "-o", "{tmp}/p.mp4", "--scene-scale", "nan"], "scene-scale"),
    (["--traj", ORBIT, "--out", "{tmp}/v.mp4", *TINY, "--refiner", "tiny", "--refiner-window", str(10**20)],
     "refiner-window"),
    (["--traj", ORBIT, "--out", "{tmp}/v.mp4", *TINY, "--refiner", "tiny", "--refiner-window", "1025"],
     "refiner-window"),
    (["play", "--model", "tiny", "--max-seconds", "inf", "--port", "0"], "max-seconds"),
    (["play", "--model", "tiny", "--max-seconds", "nan", "--port", "0"], "max-seconds"),
    (["traj", "check", "w-10", "--translation-speed", "1e308"], "translation-speed"),
    (["traj", "check", "d-10", "--rotation-speed", "1e308"], "rotation-speed"),
    (["--traj", ORBIT, "--out", "{tmp}/v.mp4", *TINY, "--height", "8", "--width", "8"], "height"),
    (["--traj", ORBIT, "--out", "{tmp}/v.mp4", *TINY, "--height", "64", "--width", "8"], "width"),
])
def test_values_out_of_range_are_refused_where_they_enter(tmp_path, capsys, argv, field):
    refused([str(item).format(tmp=tmp_path) for item in argv], capsys, tmp_path, field)


def test_a_render_file_asking_for_an_endless_noise_draw_is_refused(tmp_path, capsys):
    render = tmp_path / "r.render.json"
    doc = {"camrender_render": 1, "settings": {"noise_frames": 10**12, "model": "tiny", "kernels": "torch",
                                               "steps": 1, "num_frames": 9},
           "trajectory": json.loads(ORBIT.read_text())}
    write_json(render, doc)
    refused(["--from-render", render, "--out", tmp_path / "v.mp4"], capsys, tmp_path, "noise-frames")


# ----------------------------------------------------------------------------- checked before anything loads
def test_a_side_file_name_taken_by_a_folder_is_found_before_the_render(tmp_path, capsys):
    for name in ("v.traj.json", "v.render.json", "v.path.png", ".v.mp4.lock"):
        (tmp_path / name).mkdir()
        refused(["--traj", ORBIT, "--out", tmp_path / "v.mp4", *TINY], capsys, tmp_path, name, "directory")
        (tmp_path / name).rmdir()


def test_an_output_whose_side_files_cannot_be_named_is_refused_before_the_render(tmp_path, capsys):
    out = tmp_path / ("a" * 250 + ".mp4")  # fits itself; NAME.traj.json (260 bytes) would not
    refused(["--traj", ORBIT, "--out", out, *TINY], capsys, tmp_path, "traj.json beside it", "255")
    refused(["--traj", ORBIT, "--out", tmp_path / ("b" * 256 + ".mp4"), *TINY], capsys, tmp_path, "file name")


def test_play_checks_its_address_and_port_before_loading(tmp_path, capsys):
    refused(["play", "--model", "tiny", "--host", "192.0.2.1", "--out", tmp_path / "f"], capsys, tmp_path, "host",
            "no interface")
    refused(["play", "--model", "tiny", "--host", "no-such-host.invalid", "--out", tmp_path / "f"], capsys, tmp_path,
            "host")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused(["play", "--model", "tiny", "--port", str(port), "--out", tmp_path / "f"], capsys, tmp_path, "port",
                "in use")


def test_the_prompt_file_wins_over_the_render_files_prompt(tmp_path, capsys):
    first = tmp_path / "a.mp4"
    code, _, err = run_cli(["--traj", ORBIT, "--out", first, *TINY, "--frames", "9", "--height", "16", "--width",
                            "16", "--prompt", "from the first render"], capsys)
    assert code == 0, err
    (tmp_path / "p.txt").write_text("from the prompt file\n")
    code, _, err = run_cli(["--from-render", tmp_path / "a.render.json", "--prompt-file", tmp_path / "p.txt",
                            "--out", tmp_path / "b.mp4"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "b.render.json").read_text())["settings"]["prompt"] == "from the prompt file"
