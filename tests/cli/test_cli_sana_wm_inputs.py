"""NVlabs' official inputs on the command line, as they are (action scheme options, pose and
intrinsics .npy, prompt files, frame snapping), resolved into a request without loading a model."""
import json
import os

import numpy as np
import PIL.Image
import pytest

from camrender.cli.render import plan_from_options, render
from camrender.render.settings_file import write_render_json
from camrender.trajectory.controls import make_scheme, rollout
from camrender.trajectory.crop import crop_intrinsics
from camrender.trajectory.formats import actions

from helpers import run_cli


def resolve(argv):
    """The RenderRequest and notes of a `camrender render` command line (nothing loads, nothing renders)."""
    notes = []
    params = render.make_context("render", [str(a) for a in argv]).params
    params.pop("from_render")
    return plan_from_options(params, notes)[0], notes


def test_action_scheme_options_prompt_file_and_the_render_json(tmp_path):
    (tmp_path / "p.txt").write_text("\ufeff  a red barn in the snow \n\n", encoding="utf-8")
    request, notes = resolve(["--traj", "w-10,dw-6,j-3", "--model", "tiny", "--out", tmp_path / "v.mp4",
                              "--prompt-file", tmp_path / "p.txt", "--action-scheme", "diffusers",
                              "--translation-speed", "0.1", "--smooth", "--frames", "25"])
    scheme = make_scheme("diffusers", translation_speed=0.1, smooth=True)
    assert request.prompt == "a red barn in the snow" and request.traj.prompt == request.prompt
    # 19 frames, fewer than the 25 asked: the first 17 (8k+1 nearest to 19, ties up, never past 19)
    assert request.num_frames == 17 and "fewer than the 25 asked: rendering its first 17" in notes[0]
    np.testing.assert_array_equal(request.traj.c2w, rollout(scheme, actions.parse_actions("w-10,dw-6,j-3"))[:17])
    write_render_json(request, tmp_path / "v.render.json")
    settings = json.loads((tmp_path / "v.render.json").read_text())["settings"]
    assert settings["controls"] == scheme.to_dict() and settings["prompt"] == "a red barn in the snow"
    request, _ = resolve(["--traj", "w-16", "--model", "tiny", "--out", tmp_path / "v.mp4", "--no-smooth"])
    assert request.controls == make_scheme("sana-wm", smooth=False).to_dict() and request.num_frames == 17


def test_a_path_shorter_than_frames_is_noted_also_when_it_renders_whole(tmp_path):
    """--frames N with a shorter path: always one note, whether the path is cut to 8k+1 or already is."""
    whole, notes = resolve(["--traj", "w-40", "--model", "tiny", "--out", tmp_path / "v.mp4", "--frames", "81"])
    assert whole.num_frames == 41 and len(notes) == 1 and "fewer than the 81 asked: rendering all 41" in notes[0]
    cut, notes = resolve(["--traj", "w-44", "--model", "tiny", "--out", tmp_path / "v.mp4", "--frames", "81"])
    assert cut.num_frames == 41 and len(notes) == 1 and "fewer than the 81 asked: rendering its first 41" in notes[0]
    same, notes = resolve(["--traj", "w-40", "--model", "tiny", "--out", tmp_path / "v.mp4"])
    assert same.num_frames == 41 and notes == []
    timed, notes = resolve(["--traj", "w-44", "--model", "tiny", "--out", tmp_path / "v.mp4"])
    assert timed.num_frames == 49 and notes == ["the path is re-timed to 49 frames (8k+1, the bidirectional recipe's "
                                                "frame counts)"]


def test_pose_npy_with_an_image_is_mapped_as_the_official_cli(tmp_path):
    PIL.Image.new("RGB", (1000, 600)).save(tmp_path / "first.png")
    c2w = rollout(make_scheme(), [{"w", "d"}] * 40)
    np.save(tmp_path / "demo_pose.npy", c2w.astype(np.float32))
    k = np.array([[[800.0, 0, 500], [0, 800, 300], [0, 0, 1]], [[900.0, 0, 510], [0, 900, 290], [0, 0, 1]]])
    np.save(tmp_path / "demo_intrinsics.npy", k)  # found beside the pose file, fitted over the 41 frames
    request, notes = resolve(["--traj", tmp_path / "demo_pose.npy", "--image", tmp_path / "first.png",
                              "--model", "tiny", "--out", tmp_path / "v.mp4", "--height", "64", "--width", "112"])
    assert (request.traj.width, request.traj.height) == (1000, 600) and request.controls is None and not notes
    from camrender.render.camera import build_camera_inputs

    camera = build_camera_inputs(request.traj, height=64, width=112, vae_stride=(8, 8, 8))
    vec4 = np.stack([np.linspace(800, 900, 41), np.linspace(800, 900, 41), np.linspace(500, 510, 41),
                     np.linspace(300, 290, 41)], axis=1)
    # NVlabs: scale = max(64/600, 112/1000) = 0.112 -> 112 x 67, crop top 1
    expected = vec4 * [0.112, 67 / 600, 0.112, 67 / 600] - [0, 0, 0, 1]
    np.testing.assert_allclose(camera["intrinsics"].double().numpy(), expected, atol=0.01)
    np.testing.assert_allclose(crop_intrinsics(vec4, (1000, 600), (112, 64)), expected, atol=1e-9)


def one_error(argv, capsys, folder):
    before = sorted(os.listdir(folder))
    code, _, err = run_cli(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("camrender: error: "), err
    assert "Traceback" not in err and "loading" not in err and sorted(os.listdir(folder)) == before
    return lines[0]


@pytest.mark.parametrize("extra, expected", [
    (["--traj", "w-9", "--action-scheme", "wasd"], "'wasd' is not one of 'sana-wm', 'diffusers'"),
    (["--traj", "w-9", "--pitch-limit", "100"], "pitch-limit: must be within 0-90 degrees"),
    (["--traj", "w-9", "--prompt-file", "{tmp}/empty.txt"], "empty.txt: prompt-file: the prompt file is empty"),
    (["--traj", "w-9", "--prompt-file", "{tmp}/empty.txt", "--prompt", "x"], "not both"),
    (["--traj", "w-9", "--intrinsics", "{tmp}/k.json"], "k.json: intrinsics: must be a .npy file"),
    (["--traj", "{tmp}/obj_pose.npy"], "obj_pose.npy: c2w: holds Python objects (a pickle)"),
])
def test_bad_inputs_stop_before_the_model(tmp_path, capsys, extra, expected):
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "k.json").write_text("[]")
    np.save(tmp_path / "obj_pose.npy", np.array([None], dtype=object), allow_pickle=True)
    argv = [a.format(tmp=tmp_path) for a in extra] + ["--model", "tiny", "--out", tmp_path / "v.mp4"]
    assert expected in one_error(argv, capsys, tmp_path)


def test_batch_jobs_take_the_new_options_and_skip_intrinsics_files(tmp_path):
    from camrender.batch.jobs import read_jobs
    from camrender.batch.plan import plan_jobs
    from camrender.cli.batch import job_keys, resolver

    (tmp_path / "p.prompt").write_text("a lighthouse\n")
    np.save(tmp_path / "a_pose.npy", rollout(make_scheme(), [{"w"}] * 16))
    np.save(tmp_path / "a_intrinsics.npy", np.array([500.0, 500.0, 640, 352]))
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_text("\n".join(json.dumps(job) for job in [
        {"trajectory": "w-16", "output": "w.mp4", "prompt_file": "p.prompt", "action-scheme": "diffusers",
         "options": {"smooth": True, "pitch_limit": 30}},
        {"trajectory": "a_pose.npy", "output": "a.mp4", "intrinsics": "a_intrinsics.npy", "smooth": None},
        {"trajectory": "w-16", "output": "bad.mp4", "prompt_file": "missing.txt"},
    ]) + "\n")
    jobs = read_jobs(jobs_file, job_keys())
    planned = plan_jobs(jobs, resolver({"model": "tiny"}))
    assert [job.status for job in planned] == ["render", "render", "failed"], planned[0].reason[-300:]
    first = planned[0].request
    assert first.prompt == "a lighthouse" and first.controls == make_scheme("diffusers", smooth=True,
                                                                             pitch_limit=30).to_dict()
    assert planned[1].request.traj.intrinsics[0, 0] == 500.0 and "missing.txt: file not found" in planned[2].reason
    folder_jobs = read_jobs(tmp_path, job_keys(), tmp_path / "out")
    assert [os.path.basename(job.where) for job in folder_jobs] == ["a_pose.npy"]


@pytest.mark.parametrize("scheme_name", ["sana-wm", "diffusers"])
def test_concat_and_retime_read_action_strings_in_the_scheme_asked(tmp_path, capsys, scheme_name):
    from camrender.trajectory import load

    scheme = make_scheme(scheme_name, smooth=False)
    code, _, err = run_cli(["traj", "concat", "w-10", "d-6", "--action-scheme", scheme_name, "--no-smooth",
                            "-o", tmp_path / "c.json"], capsys)
    assert code == 0, err
    first, second = rollout(scheme, actions.parse_actions("w-10")), rollout(scheme, actions.parse_actions("d-6"))
    joined = load(str(tmp_path / "c.json")).c2w
    assert len(joined) == len(first) + len(second) - 1
    np.testing.assert_allclose(joined[len(first) - 1], first[-1], atol=1e-6)
    # the second part moved rigidly onto the first's end: its last pose relative to its start is kept
    np.testing.assert_allclose(np.linalg.inv(joined[len(first) - 1]) @ joined[-1],
                               np.linalg.inv(second[0]) @ second[-1], atol=1e-6)
    code, _, err = run_cli(["traj", "retime", "w-10,d-6", "--fps", "32", "--action-scheme", scheme_name,
                            "--no-smooth", "-o", tmp_path / "r.json"], capsys)
    assert code == 0, err
    np.testing.assert_allclose(load(str(tmp_path / "r.json")).c2w[-1],
                               rollout(scheme, actions.parse_actions("w-10,d-6"))[-1], atol=1e-6)
