"""One front door: the command line is a layer over the Python API (same videos, side files and errors), and a
mistyped keyword names the closest valid one."""
import pytest

from camrender.errors import CamrenderError
from helpers import run_cli


def test_the_api_and_the_cli_write_the_same_files(tmp_path, capsys, monkeypatch):
    from camrender import CamrenderPipeline

    monkeypatch.chdir(tmp_path)
    (tmp_path / "cli").mkdir(), (tmp_path / "api").mkdir()
    options = dict(frames=17, steps=2, seed=3, prompt="a quiet street", mode="segments")
    argv = ["--traj", "w-8,dw-8", "--model", "tiny", "--device", "cpu", "--prompt-cache", "off", "--out",
            tmp_path / "cli" / "v.mp4", "--refiner", "tiny", "--refiner-window", "2"]
    argv += [item for name, value in options.items() for item in (f"--{name}", value)]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    pipe = CamrenderPipeline.from_pretrained("tiny", device="cpu", refiner="tiny", refiner_window=2)
    result = pipe.write(tmp_path / "api" / "v.mp4", "w-8,dw-8", prompt_cache="off", **options)
    assert result.frames == 17
    names = sorted(path.name for path in (tmp_path / "cli").iterdir())
    assert names == sorted(path.name for path in (tmp_path / "api").iterdir()) == [
        "v.mp4", "v.path.png", "v.render.json", "v.traj.json"]
    for name in names:
        cli, api = (tmp_path / "cli" / name).read_bytes(), (tmp_path / "api" / name).read_bytes()
        if name.endswith(".json"):  # the output's own path is the one difference
            cli = cli.replace(b"/cli/", b"/api/")
        assert cli == api, name


def test_a_mistyped_keyword_names_the_closest_valid_one():
    from camrender import CamrenderPipeline

    with pytest.raises(CamrenderError, match="unknown setting 'refiner_windw' .did you mean refiner_window") as caught:
        CamrenderPipeline.from_pretrained("tiny", refiner="tiny", refiner_windw=2)
    assert caught.value.field == "refiner_windw"
    pipe = CamrenderPipeline.from_pretrained("tiny", device="cpu")
    with pytest.raises(CamrenderError, match="did you mean steps"):
        pipe.request("w-16", stpes=2)
    with pytest.raises(CamrenderError) as caught:  # said once: "device: decided when ...", not "device: device: ..."
        pipe.request("w-16", device="cpu")
    assert str(caught.value) == "device: decided when the pipeline loads; pass it to CamrenderPipeline.from_pretrained"


def test_a_request_planned_for_other_settings_is_refused(tmp_path):
    from camrender import CamrenderPipeline

    pipe = CamrenderPipeline.from_pretrained("tiny", device="cpu", kernels="torch")
    other = CamrenderPipeline.from_pretrained("tiny", device="cpu")
    request = other.request("w-16", frames=17, steps=1)
    with pytest.raises(CamrenderError, match="planned for a pipeline loaded with other settings .kernels"):
        pipe(request)


def test_bad_input_is_the_same_text_from_both_doors(tmp_path, capsys):
    from camrender import CamrenderPipeline

    code, _, err = run_cli(["--traj", "w-16", "--model", "tiny", "--out", tmp_path / "v.mp4", "--refiner-window",
                            "2"], capsys)
    with pytest.raises(CamrenderError) as caught:
        CamrenderPipeline.from_pretrained("tiny", refiner_window=2)
    assert code == 2 and err.strip() == f"camrender: error: {caught.value}"
    assert list(tmp_path.iterdir()) == []
