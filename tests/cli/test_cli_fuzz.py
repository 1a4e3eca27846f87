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
BAD_SEEDS = [-1, -(2**63), 2**63, 2**64, 2**70, 1.5, "3", True, None, [], float("nan")]
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

    def far_translation(rng, doc):  # finite, but beyond what squares, plots and float32 rays survive
        doc = copy.deepcopy(doc)
        rng.choice(doc["frames"])["c2w"][rng.randrange(3)][3] = rng.choice([1e300, -1e300, 1e7, -2e6, 1e18])
        return doc

    per_frame = [field("fps", BAD_NUMBERS + [1e9, 241, 0.01]), field("width", BAD_SIZES), field("height", BAD_SIZES),
                 field("seed", BAD_SEEDS), far_translation,
                 frame_field("cx", [-99999, 1e9, -64.5, 129]), frame_field("cy", [-33, 1e12, 97]),
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
        ("camera_path.json", json.dumps({"render_height": 32, "render_width": 64, "fps": 8,  # no camera_path
                                         "keyframes": []}).encode()),
        ("camera_path.json", json.dumps({"camera_path": [{"camera_to_world": np.eye(4).ravel().tolist(), "fov": 50,
                                                          "aspect": 2}], "render_height": 32, "render_width": 64,
                                         "fps": rng.choice([1e9, 0.001, 500])}).encode()),
        ("huge.json", None),  # a sparse file past the size limit: refused before a byte is parsed
        ("demo_pose.npy", _npy_bytes(rng.choice(BAD_POSE_ARRAYS))),
        ("demo_pose.npy", b"\x80\x04K\x01." if rng.random() < 0.5 else _npy_bytes(np.array([{}], dtype=object))),
    ]
    return rng.choice(choices)


def _npy_bytes(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _bad_poses():
    stretched, infinite, far = (np.tile(np.eye(4), (9, 1, 1)) for _ in range(3))
    stretched[4, :3, :3] *= 2
    infinite[8, 2, 3] = np.inf
    far[6, 0, 3] = 1e300  # finite, past MAX_POSITION
    return [np.zeros((9, 16)), np.zeros((9, 4, 4), dtype=np.int32), stretched, infinite, np.zeros((0, 4, 4)),
            np.eye(4), np.tile(np.eye(4) * [1, 1, -1, 1], (9, 1, 1)), far]


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
        if data is None:
            with open(path, "wb") as handle:
                handle.truncate(rng.choice([65, 200, 2000]) * 2**20)
            data = b"(sparse)"
        else:
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
               ("--resume", None), ("--seed", "-1"), ("--seed", str(2**63)), ("--seed", str(2**64)),
               ("--fps", "1e9"), ("--fps", "241"), ("--fps", "0.01"), ("--dtype", "float16"), ("--dtype", "bfloat16"),
               ("--transformer-weights", "{tmp}/junk.pt"), ("--transformer-weights", "{tmp}/junk.safetensors"),
               ("--transformer-weights", "{tmp}/path.json"), ("--traj", "{tmp}/huge.json"), ("--traj", ""),
               ("--progress", "loud"), ("--steps", "1001"), ("--steps", str(10**12)), ("--checkpoint-every", "nan"),
               ("--from-render", "{tmp}/negative_seed.render.json"), ("--action-scheme", "wasd"),
               ("--translation-speed", "nan"),
               ("--rotation-speed", "-1"), ("--pitch-limit", "120"), ("--intrinsics", "{tmp}/k.txt"),
               ("--intrinsics", "{tmp}/bad_k.npy"), ("--intrinsics", "{tmp}/missing.npy"),
               ("--intrinsics", "{tmp}/far_k.npy"), ("--intrinsics", "{tmp}/wide_k.npy"),
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
    np.save(tmp_path / "far_k.npy", np.array([[500.0, 500.0, -99999, 16]]))  # principal point far off the image
    np.save(tmp_path / "wide_k.npy", np.array([[1e-300, 500.0, 32, 16]]))  # a 180 degree field of view
    np.save(tmp_path / "bad_pose.npy", BAD_POSE_ARRAYS[2])
    (tmp_path / "pickle.npy").write_bytes(_npy_bytes(np.array([{}], dtype=object)))
    (tmp_path / "empty.txt").write_text(" \n\t\n")
    (tmp_path / "bad.render.json").write_text(json.dumps({"camrender_render": 1, "settings": {"steps": "abc"},
                                                          "trajectory": PER_FRAME}))
    (tmp_path / "negative_seed.render.json").write_text(json.dumps({"camrender_render": 1, "settings": {"seed": -1},
                                                                    "trajectory": PER_FRAME}))
    (tmp_path / "junk.pt").write_bytes(bytes(random.Random(1).randrange(256) for _ in range(64)))
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 64)
    with open(tmp_path / "huge.json", "wb") as handle:
        handle.truncate(100 * 2**20)
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
        if option == "--dtype":
            args["--device"] = "cpu"  # half precision needs a GPU
        argv = [item for key, val in args.items() for item in ([key] if val is None else [key, val])]
        before = sorted(os.listdir(tmp_path))
        code, out, err = _run(argv, capsys)
        if not _one_line_error(code, out, err) or "loading" in err or sorted(os.listdir(tmp_path)) != before:
            failures.append((argv, code, err[-300:]))
    assert not failures, failures[:5]


def _jobs_lines(rng, folder):
    """A jobs file of good lines with at least one bad one (malformed, missing input, duplicate output,
    a value the render refuses)."""
    good = [{"trajectory": "path.json", "output": f"out/{i}.mp4", "frames": 9} for i in range(rng.randrange(1, 4))]
    bad = rng.choice([
        "{not json", "[1, 2]", "42", '{"trajectory": "path.json", "output": "out/x.mp4", "options": 3}',
        {"trajectory": "path.json", "output": "out/x.mp4", "colour": 1},
        {"trajectory": "path.json", "output": "out/x.mp4", "gpus": 2},
        {"trajectory": "missing.json", "output": "out/x.mp4"},
        {"trajectory": "path.json", "output": "out/x.mp4", "image": "missing.png"},
        {"trajectory": "path.json", "output": "out/0.mp4"},  # the same output as the first good line
        {"trajectory": "path.json", "output": "out/x.txt"},
        {"trajectory": "path.json", "output": "out/x.mp4", "seed": rng.choice([-1, 2**63, 2**64, 1.5, "x", []])},
        {"trajectory": "path.json", "output": "out/x.mp4", "fps": rng.choice([1e9, 0, -1, "x"])},
        {"trajectory": "path.json", "output": "out/x.mp4", "height": rng.choice([36, 0, 10**6])},
        {"trajectory": "path.json", "output": "out/x.mp4", "dtype": "float16", "device": "cpu"},
    ])
    lines = good[:]
    lines.insert(rng.randrange(len(lines) + 1), bad)
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)


def test_malformed_batch_jobs_files(tmp_path, capsys):
    """A jobs file with any bad line renders nothing: exit 2, every error on its own line, the last one
    the count, and no output folder or file left behind."""
    rng = random.Random(SEED)
    failures = []
    for case in range(40):
        folder = tmp_path / f"case{case}"
        folder.mkdir()
        (folder / "path.json").write_text(json.dumps(PER_FRAME))
        (folder / "jobs.jsonl").write_text(_jobs_lines(rng, folder))
        # (small and one step: a line that wrongly passes renders in a second and shows as a failure)
        code, out, err = _run(["batch", folder / "jobs.jsonl", "--model", "tiny", "--progress", "none", "--steps", "1",
                               "--height", "32", "--width", "32", "--kernels", "torch"], capsys)
        lines = [line for line in err.splitlines() if line.strip() and "re-timed" not in line]
        ok = (code == 2 and "Traceback" not in err and lines and all(line.startswith("camrender: error: ")
                                                                      for line in lines)
              and "jobs cannot render" in lines[-1] and "loading" not in err
              and sorted(os.listdir(folder)) == ["jobs.jsonl", "path.json"])
        if not ok:
            failures.append(((folder / "jobs.jsonl").read_text()[:300], code, err[-400:], sorted(os.listdir(folder))))
    assert not failures, failures[:3]
