"""Never a wrong or partial output with exit 0: a full disk (a file-size limit, RLIMIT_FSIZE, in a child process)
under every writer, two renders of one output at once, batch outputs that collide, names at the edges (long,
with a quote or a line break), and the mp4 every mode writes (unfragmented, index first, frames counted)."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from camrender.output.mp4_check import read_summary
from helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
ORBIT = REPO / "trajectories" / "orbit.json"
TINY = ["--model", "tiny", "--kernels", "torch", "--steps", "1", "--prompt-cache", "off", "-q"]

# Runs camrender commands in one child process, each under its own file-size limit (bytes; "half:PATH" is half
# the size of PATH, measured when the case runs; null: none). SIGXFSZ is ignored, so a write past the limit
# fails as it does on a full disk (ffmpeg, whose signals a subprocess gets back to their defaults, is stopped
# by it instead). A case {"cache": folder} stores a prompt-cache entry of 4 KB. Prints one result per case.
DRIVER = textwrap.dedent("""
    import contextlib, io, json, os, resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    from camrender.cli.main import main
    results = []
    for case in json.loads(sys.argv[1]):
        limit = case["limit"]
        if isinstance(limit, str):
            limit = os.path.getsize(limit.split(":", 1)[1]) // 2
        err, notes, code = io.StringIO(), [], 0
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft if limit is None else limit, hard))
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                if "cache" in case:
                    import torch
                    from camrender.render.prompt_cache import PromptCache
                    key = {"stage": "stage1", "prompt": "p", "dtype": "float32"}
                    got = PromptCache(case["cache"], log=notes.append).fetch(key, lambda: {"embeds": torch.ones(1024)})
                    code = int(got["embeds"].sum())
                else:
                    main(case["argv"])
        except SystemExit as done:
            code = done.code
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        results.append({"code": code, "err": err.getvalue(), "notes": notes})
    print(json.dumps(results))
""")


def run_limited(cases):
    """[{"code", "err", "notes"}] of `cases` ({"limit", "argv"} or {"limit", "cache"}) run by DRIVER."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(cases, default=str)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def one_error(result, *names):
    lines = [line for line in result["err"].splitlines() if line.strip()]
    assert result["code"] == 2 and len(lines) == 1 and lines[0].startswith("camrender: error: "), result
    assert "Traceback" not in result["err"]
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def test_a_full_disk_never_leaves_a_partial_file_or_exits_0(tmp_path):
    """Every writer under a file-size limit: the full-mode mp4, the segment files, their join, a checkpoint,
    `traj preview`, `traj plot`, `encode-prompt`, text, binary and two-file trajectory formats; a prompt-cache
    entry is a note."""
    render = ["--traj", ORBIT, *TINY, "--frames", "65", "--height", "32", "--width", "32"]
    segments = [*render, "--mode", "segments", "--segment-frames", "1"]
    folders = {name: tmp_path / name for name in ("full", "empty", "seg", "join", "ckpt", "preview", "text", "npy", "colmap",
                                                 "plot", "cache", "encode", "measure")}
    for folder in folders.values():
        folder.mkdir()
    measured = folders["measure"] / "v.mp4"
    cases = [
        {"limit": 3000, "argv": [*render, "--out", folders["full"] / "v.mp4"]},
        {"limit": 0, "argv": [*render, "--out", folders["empty"] / "v.mp4"]},  # not a byte more: the lock too
        {"limit": 1000, "argv": [*segments, "--out", folders["seg"] / "v.mp4"]},
        {"limit": None, "argv": [*segments, "--out", measured]},  # its size: the join's limit below is half of it
        {"limit": f"half:{measured}", "argv": [*segments, "--out", folders["join"] / "v.mp4"]},
        {"limit": 50_000, "argv": [*segments, "--checkpoint-every", "0", "--out", folders["ckpt"] / "v.mp4"]},
        {"limit": 2000, "argv": ["traj", "preview", ORBIT, "-o", folders["preview"] / "p.mp4", "--width", "64"]},
        {"limit": 300, "argv": ["traj", "new", "orbit", "-o", folders["text"] / "n.json"]},
        {"limit": 3000, "argv": ["traj", "convert", ORBIT, "-o", folders["npy"] / "n_pose.npy"]},
        {"limit": 3000, "argv": ["traj", "convert", ORBIT, "-o", folders["colmap"] / "images.txt"]},
        {"limit": 3000, "argv": ["traj", "plot", ORBIT, "-o", folders["plot"] / "p.png"]},
        {"limit": 1000, "cache": folders["cache"]},
        {"limit": 1000, "argv": ["encode-prompt", "--prompt", "a long enough prompt " * 20, "--model", "tiny",
                                 "--device", "cpu", "--prompt-cache", folders["encode"]]},
    ]
    full, empty, seg, _, join, ckpt, preview, text, npy, colmap, plot, cache, encode = run_limited(cases)
    one_error(full, "v.mp4", "writing the video failed")
    one_error(empty, "v.mp4", "writing the video failed")
    one_error(seg, "segment-00000.mp4", "writing the video failed")
    one_error(join, "v.mp4", "joining the segments failed")
    one_error(ckpt, "checkpoint.safetensors", "cannot write the checkpoint")
    one_error(preview, "p.mp4")
    one_error(text, "n.json", "cannot write")
    one_error(npy, "cannot write")  # (the pose file or the intrinsics beside it: neither is left)
    one_error(colmap, "cannot write")  # (images.txt or cameras.txt: neither is left)
    one_error(plot, "p.png", "cannot write")
    for name in ("full", "empty", "seg", "join", "ckpt", "preview", "text", "npy", "colmap", "plot"):
        assert os.listdir(folders[name]) == [], (name, os.listdir(folders[name]))
    # the cache entry that could not be stored is a note; the tensors come back, no temporary file stays
    assert cache["code"] == 1024 and len(cache["notes"]) == 1 and "continuing" in cache["notes"][0], cache
    assert os.listdir(folders["cache"]) == []
    one_error(encode, "prompt cache entry")
    assert not [name for name in os.listdir(folders["encode"]) if not name.endswith(".safetensors")]
    for entry in folders["encode"].iterdir():  # an entry that is there is whole
        from camrender.render.safetensors_header import read_header
        read_header(entry)


def hold_output(out):
    """Another process holding `out`'s claim (as a render does from before its model loads); returns it."""
    code = ("import sys, time; from camrender.output.targets import claim_output; "
            f"claim_output({str(out)!r}); print('held', flush=True); time.sleep(120)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_render_of_an_output_in_use_refuses_before_loading(tmp_path, capsys):
    out = tmp_path / "c.mp4"
    holder = hold_output(out)
    try:
        for target in (out, tmp_path / "c.MP4"):  # c.MP4 shares c.render.json: the same claim
            for mode in ("full", "segments"):
                code, _, err = run_cli(["--traj", ORBIT, *TINY, "--mode", mode, "--out", target], capsys)
                lines = [line for line in err.splitlines() if line.strip()]
                assert code == 2 and len(lines) == 1 and f"pid {holder.pid}" in lines[0], err
                assert "loading" not in err
        assert sorted(os.listdir(tmp_path)) == [".c.mp4.lock"]
    finally:
        holder.kill()
        holder.wait()
    # the claim died with its process: the next render takes it over and leaves no lock file
    code, _, err = run_cli(["--traj", ORBIT, *TINY, "--frames", "9", "--height", "16", "--width", "16", "--out", out],
                           capsys)
    assert code == 0, err
    assert sorted(os.listdir(tmp_path)) == ["c.mp4", "c.path.png", "c.render.json", "c.traj.json"]


def batch_errors(tmp_path, capsys, jobs, *extra):
    (tmp_path / "path.json").write_text(ORBIT.read_text())
    (tmp_path / "jobs.jsonl").write_text("".join(json.dumps(job) + "\n" for job in jobs))
    before = sorted(os.listdir(tmp_path))
    code, _, err = run_cli(["batch", tmp_path / "jobs.jsonl", *TINY, *extra], capsys)
    assert code == 2 and "Traceback" not in err and "loading" not in err, err
    assert sorted(os.listdir(tmp_path)) == before
    return [line for line in err.splitlines() if line.strip()]


def test_batch_refuses_outputs_that_collide_or_are_folders(tmp_path, capsys):
    lines = batch_errors(tmp_path, capsys, [{"trajectory": "path.json", "output": "c.mp4"},
                                            {"trajectory": "path.json", "output": "c.MP4"}])
    assert any("line 2" in line and "same output as" in line and "case" in line for line in lines), lines
    (tmp_path / "taken.mp4").mkdir()
    lines = batch_errors(tmp_path, capsys, [{"trajectory": "path.json", "output": "taken.mp4"}])
    assert any("taken" in line or "line 1" in line for line in lines) and "is a directory" in lines[0], lines


@pytest.mark.parametrize("summary", ["jobs.jsonl", "path.json", "a.mp4", "a.render.json", "a.traj.json"])
def test_batch_refuses_a_summary_over_its_own_files(tmp_path, capsys, summary):
    lines = batch_errors(tmp_path, capsys, [{"trajectory": "path.json", "output": "a.mp4"}],
                         "--summary", tmp_path / summary)
    assert len(lines) == 1 and "summary" in lines[0] and summary in lines[0], lines


def test_a_jobs_line_holding_a_line_separator_is_one_job(tmp_path, capsys):
    (tmp_path / "path.json").write_text(ORBIT.read_text())
    prompt = "first\u2028second\u0085third\x0cfourth"
    (tmp_path / "jobs.jsonl").write_text(json.dumps({"trajectory": "path.json", "output": "a.mp4", "prompt": prompt},
                                                    ensure_ascii=False) + "\n", encoding="utf-8")
    code, _, err = run_cli(["batch", tmp_path / "jobs.jsonl", *TINY, "--frames", "9", "--height", "16", "--width",
                            "16", "--progress", "none"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "a.render.json").read_text())["settings"]["prompt"] == prompt


@pytest.mark.parametrize("mode", ["full", "segments"])
def test_names_at_the_edges_render_whole(tmp_path, capsys, mode):
    """A 240-character name (its temporary and probe names are cut to fit), and a folder whose name holds a
    quote and a line break (segment mode joins through a list file ffmpeg parses)."""
    odd = tmp_path / "it's a\nfolder"
    odd.mkdir()
    for out in (tmp_path / ("n" * 236 + ".mp4"), odd / "v.mp4"):
        code, _, err = run_cli(["--traj", ORBIT, *TINY, "--mode", mode, "--segment-frames", "1", "--frames", "25",
                                "--height", "16", "--width", "16", "--out", out], capsys)
        assert code == 0, err
        summary = read_summary(out)
        assert (summary.frames, summary.width, summary.height, summary.fragmented) == (25, 16, 16, False)
        data = out.read_bytes()
        assert data.index(b"moov") < data.index(b"mdat")  # index first (+faststart), in both modes
        assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.stem[:8])) == \
            sorted([out.name, *(out.stem + s for s in (".path.png", ".render.json", ".traj.json"))])
