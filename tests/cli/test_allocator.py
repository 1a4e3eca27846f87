"""camrender's processes run PyTorch's CUDA allocator with expandable segments unless the user set it
(`camrender.allocator`): the CLI's entry and the Python API's import set it, a user's value is kept."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from camrender.allocator import ALLOC_CONF, EXPANDABLE, USER_NAMES, use_expandable_segments
from camrender.cli.main import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_user_setting(monkeypatch):
    """Neither allocator variable set; both put back as they were after the test."""
    for name in USER_NAMES:
        monkeypatch.setenv(name, "placeholder")  # recorded, so the test's own changes are undone
        monkeypatch.delenv(name)


def run_version(argv=("--version",)):
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    return done.value.code


def test_cli_entry_sets_expandable_segments_when_unset(no_user_setting):
    assert run_version() == 0
    assert os.environ[ALLOC_CONF] == EXPANDABLE


@pytest.mark.parametrize("name, value", [(ALLOC_CONF, "max_split_size_mb:256"),
                                         ("PYTORCH_ALLOC_CONF", "expandable_segments:False")])
def test_cli_entry_keeps_the_users_setting(no_user_setting, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert run_version() == 0
    assert os.environ[name] == value
    assert name == ALLOC_CONF or ALLOC_CONF not in os.environ  # nothing added beside the user's own


def test_cli_entry_sets_it_on_a_user_error_too(no_user_setting, capsys):
    """The setting comes first, before the command runs (and touches CUDA) or fails."""
    assert run_version(["render", "--traj", "/nonexistent/path.json", "--out", "x.mp4"]) == 2
    assert os.environ[ALLOC_CONF] == EXPANDABLE


@pytest.mark.parametrize("given", [None, "garbage_collection_threshold:0.8"])
def test_python_api_import_sets_it_unless_given(given):
    env = {k: v for k, v in os.environ.items() if k not in USER_NAMES}
    if given is not None:
        env[ALLOC_CONF] = given
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-c", f"import os, camrender.api; print(os.environ.get({ALLOC_CONF!r}))"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (given or EXPANDABLE)


def test_helper_reports_what_it_did():
    environ = {}
    assert use_expandable_segments(environ) is True and environ == {ALLOC_CONF: EXPANDABLE}
    assert use_expandable_segments(environ) is False  # now set: kept
    assert use_expandable_segments({"PYTORCH_ALLOC_CONF": "x"}) is False
