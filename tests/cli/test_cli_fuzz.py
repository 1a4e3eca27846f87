"""Held-out style fuzz of the command line: a few hundred random malformed trajectory files and
render command lines, each must give exit code 2, one line on stderr, no traceback, no file
left behind, and (render) stop before the model loads. Runs in-process (seconds)."""
import copy
import io
import json
import os
import random

import numpy as np

from helpers import run_cli as _run

SEED = 16
PER_FRAME = {"version": 1, "width": 64, "height": 32, "fps": 8,
             "frames": [{"c2w": np.eye(4).tolist(), "fx": 50, "fy": 50, "cx": 32, "cy": 16} for _ in range(9)]}
KEYFRAMES = {"version": 1, "width": 64, "height": 32, "fps": 8, "num_frames": 17,
             "keyframes": [{"t": 0, "position": [0, 0, 0], "look_at": [0, 0, 1], "fov": 60},
                           {"t": 2, "position": [1, 0, 0], "look_at": [0, 0, 1]}]}
BAD_NUMBERS = [0, -1, -0.5, "8", None, [], {}, True, float("nan"), float("inf"), -float("inf")]
BAD_SIZES = [0, -64, 1.5, "64", None, [64], True, 10**12]
BAD_MATRICES = [[], [[1, 0, 0]], "eye", np.eye(3).tolist(), (np.eye(4) * 2).tolist(), [[float("nan")] * 4] * 4,
                [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 2]], [["a"] * 4] * 4]


def _mutations():
    """Functions doc -> bytes, each making a valid document invalid."""
    def field(name, values):
        return lambda rng, doc: {**doc, name: rng.choice(values)}

    def drop(name):
        return lambda rng, doc: {k: v for k, v in doc.items() if k != name}

    def item_field(items, name, values):  # one entry of doc[items] gets a bad `name`
        def mutate(rng, doc):
            doc = copy.deepcopy(doc)
            rng.choice(doc[items])[name] = rng.choice(values)
            return doc
        return mutate

    def frame_field(name, values):
        return item_field("frames", name, values)

    def keyframe_field(name, values):
        return item_field("keyframes", name, values)

    per_frame = [field("fps", BAD_NUMBERS), field("width", BAD_SIZES), field("height", BAD_SIZES),
                 field("version", [0, 2, "1", None, 1.5]), drop("version"), field("frames", [[], {}, "x", [1, 2]]),
                 frame_field("c2w", BAD_MATRICES), frame_field("fx", BAD_NUMBERS), frame_field("fy", BAD_NUMBERS)]
    keyframes = [field("num_frames", [0, -9, 1.5, "17", float("nan")]),
                 keyframe_field("t", ["0", None, float("nan"), -5]),
                 keyframe_field("position", [[0, 0], "origin", [0, 0, float("inf")]]),
                 keyframe_field("fov", [0, -10, 180, 400, "wide", float("nan")]),
                 field("keyframes", [[], [{}], "x"]), field("interpolation", [{"position": "cubic"}, "spline", 3])]
    return [(PER_FRAME, m) for m in per_frame] + [(KEYFRAMES, m) for m in keyframes]


def _text_cases(rng):
    """(file name, bytes) of malformed files of every format."""
    valid = json.dumps(PER_FRAME)
    cut = rng.randrange(1, len(valid) - 1)
    row = " ".join(["0"] + ["0.5"] * 4 + ["0", "0"] + ["1", "0", "0", "0", "0", "1", "0", "0", "0", "0", "1", "0"])
    bad_row = row.rsplit(" ", rng.randrange(1, 5))[0]  # fewer than 19 numbers
    choices = [
        ("cut.json", valid[:cut].encode()),
        ("bytes.json", bytes(rng.randrange(256) for _ in range(40)) + b"\xff"),
        ("list.json", json.dumps(rng.choice([[], [1, 2], "text", 3, None])).encode()),
        ("re10k.txt", f"https://example\n{row}\n{bad_row}\n".encode()),
        ("re10k.txt", f"{row}\n{row.replace('0.5', rng.choice(['nan', 'x', '-0.5', '0']), 1)}\n".encode()),
        ("camera_path.json", json.dumps({"camera_path": rng.choice([[], [{}], [{"camera_to_world": [1] * 15}]]),
                                         "render_height": 32, "render_width": 64, "fps": 8}).encode()),
        ("transforms.json", json.dumps({"frames": rng.choice([[], [{}], [{"transform_matrix": [[1]]}]])}).encode()),
        ("images.txt", f"# Image list\n1 1 0 0 0 0 0 {rng.choice(['x', '0 1', ''])} a.png\n\n".encode()),
        ("moves.actions", rng.choice(["w-0", "q-5", "w--5", "", "w-abc", "w-80,", "w-1.5"]).encode()),
        ("demo_pose.npy", _npy_bytes(rng.choice(BAD_POSE_ARRAYS))),
        ("demo_pose.npy", b"\x80\x04K\x01." if rng.random() < 0.5 else _npy_bytes(np.array([{}], dtype=object))),
    ]
    return rng.choice(choices)


def _npy_bytes(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _bad_poses():
    stretched, infinite = np.tile(np.eye(4), (9, 1, 1)), np.tile(np.eye(4), (9, 1, 1))
    stretched[4, :3, :3] *= 2
    infinite[8, 2, 3] = np.inf
    return [np.zeros((9, 16)), np.zeros((9, 4, 4), dtype=np.int32), stretched, infinite, np.zeros((0, 4, 4)),
            np.eye(4), np.tile(np.eye(4) * [1, 1, -1, 1], (9, 1, 1))]


BAD_POSE_ARRAYS = _bad_poses()


def _one_line_error(code, out, err):
    lines = [line for line in err.splitlines() if line.strip()]
    return code == 2 and len(lines) == 1 and lines[0].startswith("camrender: error: ") and "Traceback" not in err


def test_malformed_trajectory_files(tmp_path, capsys):
    rng = random.Random(SEED)
    mutations = _mutations()
    failures = []
    for case in range(240):
        folder = tmp_path / f"case{case}"
        folder.mkdir()
        if case % 3 == 2:
            name, data = _text_cases(rng)
        else:
            base, mutate = rng.choice(mutations)
            name, data = "path.json", json.dumps(mutate(rng, copy.deepcopy(base))).encode()
        path = folder / name
        path.write_bytes(data)
        command = rng.choice([["traj", "check", path], ["traj", "convert", path, "-o", folder / "out.json"],
                              ["traj", "plot", path, "-o", folder / "plot.png"],
                              ["--traj", path, "--out", folder / "v.mp4", "--model", "tiny"]])
        code, out, err = _run(command, capsys)
        if not _one_line_error(code, out, err) or sorted(os.listdir(folder)) != [name]:
            failures.append((name, data[:120], command[:2], code, err[-300:], sorted(os.listdir(folder))))
    assert not failures, failures[:5]


# (option, value) pairs that are wrong whatever else is on the command line
BAD_OPTIONS = [("--frames", "0"), ("--frames", "-3"), ("--frames", "8193"), ("--frames", "100000"), ("--frames", "2"),
               ("--frames", "abc"), ("--guidance", "nan"), ("--guidance", "inf"), ("--guidance", "-1"),
               ("--fps", "inf"), ("--fps", "0"), ("--fps", "nan"), ("--height", "66"), ("--height", "0"),
               ("--width", "100000"), ("--width", "1.5"), ("--steps", "0"), ("--seed", "1e3"), ("--seed", str(2**70)),
               ("--device", "tpu"), ("--device", "cuda:99"), ("--dtype", "fp8"), ("--mode", "half"),
               ("--kernels", "x"), ("--out", "{tmp}/x.txt"), ("--out", "{tmp}/missing/x.mp4"), ("--out", "{tmp}"),
               ("--transformer-weights", "{tmp}/missing.pt"), ("--vae", "{tmp}/no_vae"), ("--model", "./no/such"),
               ("--segment-frames", "0"), ("--cached-segments", "-1"), ("--checkpoint-every", "-5"),
               ("--image", "{tmp}/missing.png"), ("--traj", "{tmp}/missing.json"), ("--traj", "w--5"),
               ("--traj", "{tmp}"), ("--bogus", "1"), ("--from-render", "{tmp}/missing.render.json"),
               ("--from-render", "{tmp}/bad.render.json"), ("--from-render", "{tmp}/path.json"),
               ("--resume", None), ("--action-scheme", "wasd"), ("--translation-speed", "nan"),
               ("--rotation-speed", "-1"), ("--pitch-limit", "120"), ("--intrinsics", "{tmp}/k.txt"),
               ("--intrinsics", "{tmp}/bad_k.npy"), ("--intrinsics", "{tmp}/missing.npy"),
               ("--traj", "{tmp}/bad_pose.npy"), ("--traj", "{tmp}/pickle.npy"), ("--prompt-file", "{tmp}/empty.txt"),
               ("--prompt-file", "{tmp}/missing.txt")]
GOOD_OPTIONS = [("--steps", "1"), ("--seed", "3"), ("--prompt", "a room"), ("--guidance", "2"), ("--fps", "12"),
                ("--frames", "17"), ("--height", "32"), ("--width", "48"), ("--kernels", "torch"), ("--model", "tiny")]


def test_malformed_render_command_lines(tmp_path, capsys):
    rng = random.Random(SEED)
    traj = tmp_path / "path.json"
    traj.write_text(json.dumps(PER_FRAME))
    (tmp_path / "k.txt").write_text("500 500 32 16")
    np.save(tmp_path / "bad_k.npy", np.array([[500.0, 0.0, 32, 16]]))  # fy = 0
    np.save(tmp_path / "bad_pose.npy", BAD_POSE_ARRAYS[2])
    (tmp_path / "pickle.npy").write_bytes(_npy_bytes(np.array([{}], dtype=object)))
    (tmp_path / "empty.txt").write_text(" \n\t\n")
    (tmp_path / "bad.render.json").write_text(json.dumps({"camrender_render": 1, "settings": {"steps": "abc"},
                                                          "trajectory": PER_FRAME}))
    failures = []
    for case in range(120):
        option, value = rng.choice(BAD_OPTIONS)
        args = {"--traj": str(traj), "--out": str(tmp_path / "v.mp4"), "--model": "tiny"}
        for good, good_value in rng.sample(GOOD_OPTIONS, rng.randrange(0, 4)):
            if good != option:
                args[good] = good_value
        args[option] = None if value is None else value.format(tmp=tmp_path)
        if option == "--from-render" and rng.random() < 0.5:
            del args["--traj"]  # alone, the file's own problem shows; with --traj, the clash does
        if option == "--resume":
            args["--mode"] = "full"
        argv = [item for key, val in args.items() for item in ([key] if val is None else [key, val])]
        before = sorted(os.listdir(tmp_path))
        code, out, err = _run(argv, capsys)
        if not _one_line_error(code, out, err) or "loading" in err or sorted(os.listdir(tmp_path)) != before:
            failures.append((argv, code, err[-300:]))
    assert not failures, failures[:5]
