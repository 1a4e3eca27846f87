"""`camrender traj new|check|convert` through camrender.cli.main.main: outputs, exit codes, one-line errors."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from camrender.cli.main import main
from camrender.trajectory import load

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(capsys, *argv):
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    out, err = capsys.readouterr()
    return done.value.code, out, err


def _assert_one_line_error(code, err, *needles):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("camrender: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_new_writes_a_loadable_keyframe_file(tmp_path, capsys):
    out = tmp_path / "o.json"
    code, stdout, _ = run(capsys, "traj", "new", "orbit", "--degrees", "45", "--frames", "33", "-o", str(out),
                          "--prompt", "a hall", "--seed", "5")
    assert code == 0 and "33 frames" in stdout
    doc = json.loads(out.read_text())
    assert "keyframes" in doc and doc["prompt"] == "a hall" and doc["seed"] == 5
    t = load(out)
    assert t.num_frames == 33 and t.c2w[-1, 0, 3] > 0


def test_new_expand_and_image_relative_to_file(tmp_path, capsys):
    (tmp_path / "first.png").write_bytes(b"x")
    sub = tmp_path / "paths"
    sub.mkdir()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code, _, err = run(capsys, "traj", "new", "pan", "--expand", "--frames", "9", "--image", "first.png",
                           "-o", "paths/p.json")
    finally:
        os.chdir(cwd)
    assert code == 0, err
    doc = json.loads((sub / "p.json").read_text())
    assert len(doc["frames"]) == 9 and doc["image"] == "../first.png"
    assert load(sub / "p.json").image == str(tmp_path / "first.png")


def test_check_prints_the_summary(capsys):
    code, out, _ = run(capsys, "traj", "check", os.path.join(ROOT, "trajectories", "orbit.json"))
    assert code == 0
    for label in ("frames:       161 at 16 fps", "duration:     10.000 s", "path length:", "fov range:    horizontal 60.00-60.00",
                  "max step:"):
        assert label in out, out


def test_check_reports_path_length_and_steps(tmp_path, capsys):
    run(capsys, "traj", "new", "dolly", "--distance", "2", "--frames", "17", "-o", str(tmp_path / "d.json"))
    code, out, _ = run(capsys, "traj", "check", str(tmp_path / "d.json"))
    assert code == 0 and "path length:  2 units" in out and "max step:     0.125 units/frame" in out
    run(capsys, "traj", "new", "dolly", "--distance", "1", "--frames", "17", "-o", str(tmp_path / "one.json"))
    code, out, _ = run(capsys, "traj", "check", str(tmp_path / "one.json"))
    assert code == 0 and "path length:  1 unit\n" in out


def test_convert_between_formats_and_from_an_action_string(tmp_path, capsys):
    src = os.path.join(ROOT, "trajectories", "pan.json")
    assert run(capsys, "traj", "convert", src, "-o", str(tmp_path / "p.txt"))[0] == 0
    assert run(capsys, "traj", "convert", str(tmp_path / "p.txt"), "-o", str(tmp_path / "p_path.json"),
               "--to", "nerfstudio")[0] == 0
    np.testing.assert_allclose(load(tmp_path / "p_path.json").c2w, load(src).c2w, atol=1e-9)
    code, _, err = run(capsys, "traj", "convert", "w-8,l-8", "--from", "actions", "-o", str(tmp_path / "a.json"))
    assert code == 0, err
    assert load(tmp_path / "a.json").num_frames == 17


@pytest.mark.parametrize(
    "argv,needles",
    [
        (["traj", "check", "{tmp}/missing.json"], ["missing.json: file not found"]),
        (["traj", "check", "{tmp}/bad.json"], ["bad.json: frame 0: fy: must be positive"]),
        (["traj", "new", "crane", "-o", "{tmp}/x.json"], ["unknown preset"]),
        (["traj", "new", "pan", "--radius", "2", "-o", "{tmp}/x.json"], ["does not take --radius"]),
        (["traj", "new", "orbit", "--radius", "-2", "-o", "{tmp}/x.json"], ["preset.radius: must be positive"]),
        (["traj", "convert", "{tmp}/bad.json", "-o", "{tmp}/y.txt"], ["frame 0: fy"]),
        (["traj", "convert", "w-5,q-3", "--from", "actions", "-o", "{tmp}/y.json"], ["unknown keys q"]),
        (["traj", "convert", "{tmp}/good.json", "-o", "{tmp}/y.txt", "--to", "blender"], ["unknown format"]),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_output(tmp_path, capsys, argv, needles):
    frame = {"c2w": np.eye(4).tolist(), "fx": 10, "fy": 0, "cx": 1, "cy": 1}
    (tmp_path / "bad.json").write_text(json.dumps({"version": 1, "width": 4, "height": 4, "fps": 1, "frames": [frame]}))
    frame["fy"] = 10
    (tmp_path / "good.json").write_text(json.dumps({"version": 1, "width": 4, "height": 4, "fps": 1, "frames": [frame]}))
    before = set(os.listdir(tmp_path))
    code, _, err = run(capsys, *[a.format(tmp=tmp_path) for a in argv])
    _assert_one_line_error(code, err, *needles)
    assert set(os.listdir(tmp_path)) == before  # no partial or temp files


def test_console_script_in_a_subprocess(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('{"version": 1, "frames": [')
    env = dict(os.environ)
    result = subprocess.run([sys.executable, "-c", "from camrender.cli.main import main; main()", "traj", "check", str(bad)],
                            capture_output=True, text=True, env=env, timeout=120)
    _assert_one_line_error(result.returncode, result.stderr, "broken.json: invalid JSON at line 1")
    assert result.stdout == ""


def test_traj_commands_do_not_import_torch(tmp_path):
    code = (
        "import sys\nfrom camrender.cli.main import main\n"
        "try:\n    main(['traj', 'check', sys.argv[1]])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules and 'diffusers' not in sys.modules, 'heavy import'\n"
    )
    result = subprocess.run([sys.executable, "-c", code, os.path.join(ROOT, "trajectories", "keyframed.json")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
