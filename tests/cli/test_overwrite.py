"""--overwrite/--no-overwrite: render replaces an existing video by default (and says so), batch skips it by default;
either way round on request."""
import json

from helpers import run_cli

TINY = ["--model", "tiny", "--device", "cpu", "--frames", "9", "--steps", "1", "--height", "32", "--width", "32",
        "--prompt-cache", "off"]


def test_render_replaces_by_default_and_refuses_with_no_overwrite(tmp_path, capsys):
    out = tmp_path / "v.mp4"
    out.write_bytes(b"an older video")
    code, _, err = run_cli(["--traj", "w-8", "--out", out, "--no-overwrite", *TINY], capsys)
    assert code == 2 and err.count("\n") == 1 and "overwrite: exists: pass --overwrite" in err
    assert out.read_bytes() == b"an older video" and sorted(p.name for p in tmp_path.iterdir()) == ["v.mp4"]
    code, _, err = run_cli(["--traj", "w-8", "--out", out, *TINY], capsys)
    assert code == 0 and f"replacing {out}" in err and out.read_bytes() != b"an older video"


def test_batch_skips_by_default_and_renders_again_with_overwrite(tmp_path, capsys):
    (tmp_path / "jobs.jsonl").write_text(json.dumps({"trajectory": "w-8", "output": "v.mp4"}) + "\n")
    (tmp_path / "v.mp4").write_bytes(b"an older video")
    code, _, err = run_cli(["batch", tmp_path / "jobs.jsonl", *TINY], capsys)
    assert code == 0 and "1 skipped (output exists)" in err and (tmp_path / "v.mp4").read_bytes() == b"an older video"
    code, _, err = run_cli(["batch", tmp_path / "jobs.jsonl", "--overwrite", *TINY], capsys)
    assert code == 0 and "1 done" in err and (tmp_path / "v.mp4").read_bytes() != b"an older video"
