"""How a command stops: an interrupt Python swallowed is raised again (camrender.cli.signals),
`python -m` exits with the code asked for after an interrupted string exec, and under torchrun an
error is said once (camrender.cli.main)."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from camrender.cli.signals import Terminated, handled_signals, raise_if_signalled, terminated


def test_a_swallowed_interrupt_is_raised_again_at_the_next_check():
    before = signal.getsignal(signal.SIGTERM)
    with handled_signals():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
        except Terminated:
            pass  # dropped, as Python drops it inside a weakref callback or __del__
        with pytest.raises(Terminated):
            raise_if_signalled()
        assert terminated()
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back
    with handled_signals():  # a new command starts with nothing recorded
        raise_if_signalled()
        assert not terminated()


def test_an_error_that_ends_the_command_after_a_signal_is_reported_as_the_signal():
    """A signal during a safetensors read comes out of torch as a ValueError (seen in CI: a prompt cache
    read, then "the text encoder was not loaded" and exit 2 instead of 143)."""
    with pytest.raises(Terminated) as stopped:
        with handled_signals():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):  # the handler runs between bytecodes
                    pass
            except Terminated as interrupt:  # as torch's C code turns it into an error of its own
                raise ValueError("could not determine the shape of object type 'torch.storage.UntypedStorage'") \
                    from interrupt
    assert isinstance(stopped.value.__cause__, ValueError)
    with pytest.raises(ValueError):
        with handled_signals():  # no signal: an error stays that error
            raise ValueError("a real error")


@pytest.mark.parametrize("forget, code", [(True, 7), (False, -signal.SIGINT)])
def test_exit_code_after_an_interrupted_string_exec_under_dash_m(tmp_path, forget, code):
    (tmp_path / "interrupted_exec.py").write_text(textwrap.dedent(f"""
        import sys
        from camrender.cli.signals import forget_interrupted_exec
        try:
            exec("raise KeyboardInterrupt")  # as when Ctrl-C lands while a dataclass is made
        except KeyboardInterrupt:
            if {forget}:
                forget_interrupted_exec()
            sys.exit(7)
    """))
    done = subprocess.run([sys.executable, "-m", "interrupted_exec"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == code, done.stderr


def test_a_rank_other_than_0_reports_only_when_rank_0_did_not_stop_it(monkeypatch, capsys):
    """Under torchrun rank 0 says the error; another rank waits to be stopped, and names itself if it
    was not (it failed alone)."""
    from camrender.cli import main as cli_main

    monkeypatch.setattr(cli_main, "RANK_0_REPORTS_S", 0.0)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(cli_main, "is_main_process", lambda: False)
    cli_main._report("camrender: error: path.json: frame 3: fx: must be positive")
    assert capsys.readouterr().err == "camrender (rank 1): error: path.json: frame 3: fx: must be positive\n"
    monkeypatch.setattr(cli_main, "is_main_process", lambda: True)
    cli_main._report("camrender: error: bad")
    assert capsys.readouterr().err == "camrender: error: bad\n"
