"""Inputs that once passed the checks and failed late (or with a traceback), one case each; one seed range
everywhere, the side files of a finished render, clearer messages."""
import copy
import json
import os
from pathlib import Path

import numpy as np
import pytest

from camrender import trajectory
from camrender.errors import CamrenderError
from camrender.limits import MAX_POSITION, MAX_SEED
from helpers import run_cli as run
from test_cli_checks import one_error  # the one-line, nothing-written check

REPO = Path(__file__).resolve().parents[2]
ORBIT = REPO / "trajectories" / "orbit.json"
SMALL = ["--model", "tiny", "--frames", "9", "--height", "32", "--width", "32", "--steps", "1", "--kernels", "torch"]
PER_FRAME = {"version": 1, "width": 64, "height": 32, "fps": 8,
             "frames": [{"c2w": np.eye(4).tolist(), "fx": 50, "fy": 50, "cx": 32, "cy": 16} for _ in range(9)]}


def write_doc(path, change):
    doc = copy.deepcopy(PER_FRAME)
    change(doc)
    path.write_text(json.dumps(doc))
    return path


def far_frame(doc):
    doc["frames"][6]["c2w"][0][3] = 1e300  # finite, but its squares and plot limits are not


@pytest.mark.parametrize("change, needles", [
    (far_frame, ["frame 6", "c2w", "beyond 1e+06 units"]),
    (lambda doc: doc["frames"][3].update(cx=-99999), ["frame 3", "cx", "far outside the 64x32 image"]),
    (lambda doc: doc["frames"][0].update(cy=1e9), ["frame 0", "cy", "far outside"]),
    (lambda doc: doc.update(fps=1e9), ["fps", "from 0.1 to 240"]),
    (lambda doc: doc["frames"][2].update(fx=1e-300), ["frame 2", "fx", "field of view over 179 degrees"]),
    (lambda doc: doc.update(seed=-1), ["seed", "at least 0"]),
    (lambda doc: doc.update(seed=2**63), ["seed", f"at most {MAX_SEED}"]),
])
@pytest.mark.parametrize("command", ["check", "plot", "render"])
def test_trajectory_values_refused_by_every_command(tmp_path, capsys, change, needles, command):
    path = write_doc(tmp_path / "path.json", change)
    argv = {"check": ["traj", "check", path], "plot": ["traj", "plot", path, "-o", tmp_path / "p.png"],
            "render": ["--traj", path, "--out", tmp_path / "v.mp4", "--model", "tiny"]}[command]
    line = one_error(argv, capsys, tmp_path)
    assert all(needle in line for needle in needles), line


def test_positions_up_to_the_limit_keep_every_derived_number_finite(tmp_path):
    from camrender.trajectory.stats import compute
    from camrender.views.plot import plot_trajectory

    path = write_doc(tmp_path / "path.json", lambda doc: doc["frames"][6]["c2w"][0].__setitem__(3, MAX_POSITION))
    traj = trajectory.load(path)
    stats = compute(traj)
    assert np.isfinite([stats.path_length, stats.max_move, stats.max_turn]).all()
    plot_trajectory(traj, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize("extra, needle", [
    (["--seed", "-1"], "seed: must be an integer from 0 to"),
    (["--seed", str(2**63)], "seed: must be an integer from 0 to"),
    (["--fps", "1e9"], "fps"),
    (["--fps", "0.01"], "fps"),
    (["--dtype", "float16", "--device", "cpu"], "dtype: float16 needs a CUDA device"),
    (["--dtype", "bfloat16", "--device", "cpu"], "dtype: bfloat16 needs a CUDA device"),
    (["--steps", str(10**12)], "steps: must be at most 1000"),
    (["--checkpoint-every", "nan"], "checkpoint-every: must be a number of seconds"),
    (["--transformer-weights", "{tmp}/w.json"], "must end with .safetensors or .pt"),
    (["--transformer-weights", "{tmp}/junk.pt"], "not a torch weights file"),
    (["--transformer-weights", "{tmp}/junk.safetensors"], "not a safetensors file"),
])
def test_render_options_refused_before_loading(tmp_path, capsys, extra, needle):
    (tmp_path / "w.json").write_text("{}")
    (tmp_path / "junk.pt").write_bytes(os.urandom(64))
    (tmp_path / "junk.safetensors").write_bytes(os.urandom(64))
    extra = [item.format(tmp=tmp_path) for item in extra]
    line = one_error(["--traj", ORBIT, "--out", tmp_path / "v.mp4", "--model", "tiny", *extra], capsys, tmp_path)
    assert needle in line and len(line) < 400, line
    assert "weights_only" not in line and "Re-running" not in line  # torch's advice, cut mid-sentence


def test_every_render_file_camrender_writes_renders_again(tmp_path, capsys):
    """One seed range: the largest seed the CLI takes goes into the side files and back through
    --from-render and traj check."""
    code, _, err = run(["--traj", ORBIT, "--out", tmp_path / "a.mp4", *SMALL, "--seed", str(MAX_SEED),
                        "--progress", "none"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "a.traj.json").read_text())["seed"] == MAX_SEED
    code, out, err = run(["traj", "check", tmp_path / "a.traj.json"], capsys)
    assert code == 0 and out.splitlines()[-1].split() == ["seed:", str(MAX_SEED)], err
    code, _, err = run(["render", "--from-render", tmp_path / "a.render.json", "--out", tmp_path / "b.mp4",
                        "--progress", "none"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "b.render.json").read_text())["settings"]["seed"] == MAX_SEED


def test_a_plot_that_cannot_be_drawn_is_a_warning_after_a_finished_render(tmp_path, capsys, monkeypatch):
    from camrender.views import plot

    def broken(traj, path, every=None):
        raise ValueError("Axis limits cannot be NaN or Inf")

    monkeypatch.setattr(plot, "plot_trajectory", broken)
    code, _, err = run(["--traj", ORBIT, "--out", tmp_path / "v.mp4", *SMALL, "--progress", "none"], capsys)
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert warnings == ["camrender: warning: no v.path.png: ValueError: Axis limits cannot be NaN or Inf"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.mp4", "v.render.json", "v.traj.json"]


def test_preview_of_the_widest_lens_allowed_warns_nothing(tmp_path, recwarn):
    """(1e-300 pixels, refused now, made numpy RuntimeWarnings in every band of the proxy scene.)"""
    from camrender.views.preview import write_preview

    path = write_doc(tmp_path / "path.json", lambda doc: doc["frames"][2].update(fx=0.28, fy=0.15))
    write_preview(trajectory.load(path), tmp_path / "p.mp4", width=64)
    assert (tmp_path / "p.mp4").is_file() and len(recwarn) == 0, [str(w.message) for w in recwarn]


def test_plot_keeps_library_warnings_to_itself(tmp_path, recwarn):
    from camrender.views.plot import plot_trajectory

    traj = trajectory.load(ORBIT).replace(source="orbit\u2603\U0001f3a5.json")  # glyphs DejaVu Sans lacks
    plot_trajectory(traj, tmp_path / "p.png")
    assert (tmp_path / "p.png").is_file() and len(recwarn) == 0, [str(w.message) for w in recwarn]


def test_a_huge_trajectory_file_is_refused_before_it_is_read(tmp_path, capsys):
    big = tmp_path / "big.json"
    with open(big, "wb") as handle:  # sparse: 200 MB on paper, nothing on disk
        handle.truncate(200 * 2**20)
    line = one_error(["traj", "check", big], capsys, tmp_path)
    assert "200 MiB, larger than the 32 MiB" in line


def test_a_huge_prompt_file_is_refused_before_it_is_read(tmp_path, capsys):
    big = tmp_path / "prompt.txt"
    with open(big, "wb") as handle:
        handle.truncate(50 * 2**20)
    line = one_error(["--traj", ORBIT, "--out", tmp_path / "v.mp4", "--model", "tiny", "--prompt-file", big], capsys,
                     tmp_path)
    assert "prompt.txt: file is 50 MiB, larger than the 1 MiB a prompt file may be" in line


def test_messages_name_the_real_problem(tmp_path, capsys):
    assert one_error(["traj", "check", "", "--from", "actions"], capsys, tmp_path).endswith(
        "no file given (the path is an empty string)")
    nerfstudio = tmp_path / "camera_path.json"
    nerfstudio.write_text(json.dumps({"render_width": 64, "render_height": 32, "fps": 8, "keyframes": []}))
    assert one_error(["traj", "check", nerfstudio], capsys, tmp_path).endswith("camera_path: missing required field")


@pytest.mark.parametrize("argv", [[], ["traj"]])
def test_a_bare_command_shows_its_help(capsys, argv):
    code, out, err = run(argv, capsys)
    assert code == 0 and err == "" and out.startswith("Usage: camrender") and out.count("\n") > 5


def test_retime_refuses_a_path_of_one_frame(tmp_path, capsys):
    line = one_error(["traj", "retime", ORBIT, "--seconds", "0", "-o", tmp_path / "r.json"], capsys, tmp_path)
    assert "seconds: must be a positive number" in line


def test_colmap_export_names_both_files(tmp_path, capsys):
    code, out, err = run(["traj", "convert", ORBIT, "--to", "colmap", "-o", tmp_path / "images.txt"], capsys)
    assert code == 0, err
    assert out.strip() == f"wrote {tmp_path / 'images.txt'} and {tmp_path / 'cameras.txt'}: 161 frames"


def test_seed_range_is_the_same_for_files_and_the_command_line():
    from camrender.limits import check_seed

    for seed in (0, MAX_SEED):
        assert check_seed(seed) == seed
    for seed in (-1, MAX_SEED + 1, 1.0, True, "3"):
        with pytest.raises(CamrenderError, match="seed"):
            check_seed(seed)


def test_a_json_trajectory_is_parsed_once(tmp_path, monkeypatch):
    """Telling the format of a .json file parses it; the reader gets that document, not a second parse."""
    import camrender.trajectory.formats.fileio as fileio

    calls = []
    real = fileio.parse_json
    monkeypatch.setattr(fileio, "parse_json", lambda text, path: calls.append(path) or real(text, path))
    path = write_doc(tmp_path / "path.json", lambda doc: None)
    assert trajectory.load(path).num_frames == 9 and len(calls) == 1
    path.write_text(json.dumps({**PER_FRAME, "fps": 4}))  # the reader took the document: a new load parses anew
    assert trajectory.load(path).fps == 4 and len(calls) == 2


@pytest.mark.parametrize("scale", ["nan", "0", "-1"])
def test_preview_scene_scale_is_checked_before_the_progress_bar(tmp_path, capsys, scale):
    line = one_error(["traj", "preview", ORBIT, "-o", tmp_path / "p.mp4", "--scene-scale", scale], capsys, tmp_path)
    assert "scene-scale: must be a number from" in line

