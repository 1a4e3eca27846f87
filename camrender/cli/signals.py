"""Ctrl-C and SIGTERM while a command runs: both stop it through the same cleanup.

`handled_signals()` turns SIGINT into `KeyboardInterrupt` and SIGTERM into `Terminated` (a
KeyboardInterrupt too, so one `except` runs the cleanup: partial files removed, segment checkpoints
kept) and records which arrived. Python drops an exception raised inside a weakref callback or a
`__del__` ("Exception ignored in ..."), so a signal that lands there would be lost and the render
would go on: `raise_if_signalled()`, called at every progress step and written chunk, raises it
again. C code can also turn the interrupt into an error of its own (a signal during a safetensors read
surfaces as torch's ValueError "could not determine the shape of object type ..."): any error that ends
the command after a signal arrived is reported as that signal, not as the error.
"""
import contextlib
import signal

_arrived = []  # the signals received while `handled_signals` is active, in order


class Terminated(KeyboardInterrupt):
    """SIGTERM (sent by `timeout`, batch schedulers, container stops), raised like Ctrl-C."""


def _interrupt(signum):
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _on_signal(signum, frame):
    _arrived.append(signum)
    raise _interrupt(signum)


def terminated() -> bool:
    """Whether SIGTERM (rather than Ctrl-C) stopped the command."""
    return signal.SIGTERM in _arrived


def raise_if_signalled() -> None:
    """Raise the interrupt of a signal that arrived but did not stop the command."""
    if _arrived:
        raise _interrupt(_arrived[-1])


@contextlib.contextmanager
def handled_signals():
    """SIGINT and SIGTERM as above while the block runs. SIGINT stays ignored where the process
    started with it ignored (a shell's background job), as Python itself leaves it. Handlers can
    only be set on the main thread: elsewhere (in-process test runners) nothing changes."""
    _arrived.clear()
    wanted = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        wanted.append(signal.SIGINT)
    previous = {}
    try:
        for signum in wanted:
            previous[signum] = signal.signal(signum, _on_signal)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    except Exception as error:
        if _arrived:
            raise _interrupt(_arrived[-1]) from error
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def forget_interrupted_exec() -> None:
    """Clear CPython's record of a KeyboardInterrupt that ended a string `exec` (one that landed
    while, say, a dataclass was being made during an import). Under `python -m` that record makes
    the interpreter kill itself with SIGINT at exit whatever exit code was asked for; each string
    evaluation starts by clearing it."""
    exec("pass")
