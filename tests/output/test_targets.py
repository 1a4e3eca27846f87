"""Claiming an output: claims share the lock in one thread, another thread or process refuses, the lock file goes
with the last release, and a lock file left by a dead process is taken over."""
import os
import subprocess
import sys
import threading

from camrender.errors import CamrenderError
from camrender.output.targets import claim_output, lock_path


def test_claims_nest_in_a_thread_and_refuse_another(tmp_path):
    out = tmp_path / "v.mp4"
    outer = claim_output(out)
    inner = claim_output(tmp_path / "v.MP4")  # the same side files, the same lock
    assert lock_path(out).exists() and lock_path(tmp_path / "v.MP4") == lock_path(out)
    refused = []

    def other_thread():
        try:
            claim_output(out)
        except CamrenderError as error:
            refused.append(str(error))

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert len(refused) == 1 and "another render of this process" in refused[0]
    inner.release()
    inner.release()  # a claim is given back once
    assert lock_path(out).exists()  # still held by the outer claim
    outer.release()
    assert not lock_path(out).exists()
    with claim_output(out):  # free again
        pass
    assert os.listdir(tmp_path) == []


def test_a_lock_file_left_by_a_dead_process_is_taken_over(tmp_path):
    out = tmp_path / "v.mp4"
    code = f"from camrender.output.targets import claim_output; claim_output({str(out)!r}); import os; os._exit(0)"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert lock_path(out).exists()  # the process died holding it: the file stays, the lock does not
    with claim_output(out):
        assert int(lock_path(out).read_text()) == os.getpid()
    assert not lock_path(out).exists()

