"""Command-line entry point: `camrender [render] --traj FILE --out VIDEO.mp4`, `camrender traj ...`, `camrender selftest`.

Subcommands live in their own modules (`cli_traj`, `cli_render`); this module only
assembles them and turns `CamrenderError` into one line on stderr with exit code 2.
Heavy imports (torch, diffusers) happen inside the commands that need them.
"""
import contextlib
import signal
import sys

import click

from camrender.parallel.distributed import is_main_process
from camrender.errors import CamrenderError

# Options that belong to the root group itself; anything else starting with "--"
# as the first argument means the user typed `camrender --traj ...` (implicit render).
_ROOT_OPTIONS = {"--help", "-h", "--version"}


class _Root(click.Group):
    def parse_args(self, ctx, args):
        if args and args[0].startswith("-") and args[0] not in _ROOT_OPTIONS:
            args = ["render", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_Root, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="camrender")
def cli():
    """Render videos along camera paths with SANA-WM.

    \b
    camrender --traj trajectories/orbit.json --out orbit.mp4 --model tiny
    camrender traj new orbit -o my_orbit.json
    camrender traj check my_orbit.json
    camrender selftest
    """


def _register():
    from camrender.cli import batch as cli_batch
    from camrender.cli import render as cli_render
    from camrender.cli import selftest
    from camrender.cli import traj as cli_traj

    cli.add_command(cli_traj.traj)
    for command in cli_render.COMMANDS:
        cli.add_command(command)
    cli.add_command(selftest.command)
    cli.add_command(cli_batch.batch)


_register()


def _say(line: str) -> None:
    """One line on stderr, from rank 0 only when several processes run the command (torchrun)."""
    if is_main_process():
        click.echo(line, err=True)


class Terminated(KeyboardInterrupt):
    """SIGTERM (sent by `timeout`, batch schedulers, container stops), raised like Ctrl-C so that
    the same cleanup runs: partial files are removed, segment checkpoints are kept."""


_terminated = []  # set when SIGTERM arrived (click turns every KeyboardInterrupt into Abort)


def _raise_terminated(signum, frame):
    _terminated.append(signum)
    raise Terminated()


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """Turn SIGTERM into `Terminated` while the command runs (main thread only: signal handlers
    can only be set there; in-process test runners may call `main` from another thread)."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv=None):
    """Run the CLI; user errors become one line on stderr and exit code 2; Ctrl-C exits 130, SIGTERM 143."""
    _terminated.clear()
    try:
        with _sigterm_as_interrupt():
            cli.main(args=argv, prog_name="camrender", standalone_mode=False)
    except CamrenderError as error:
        _say(f"camrender: error: {_one_line(error)}")
        sys.exit(error.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        if _terminated:
            _say("camrender: terminated (SIGTERM)")
            sys.exit(143)
        _say("camrender: interrupted")
        sys.exit(130)
    except click.UsageError as error:
        # one line (click's own display adds the usage and a hint); --help shows the usage
        command = error.ctx.command_path if error.ctx is not None else "camrender"
        _say(f"camrender: error: {_one_line(error.format_message())} (see {command} --help)")
        sys.exit(error.exit_code)
    except click.ClickException as error:
        _say(f"camrender: error: {_one_line(error.format_message())}")
        sys.exit(error.exit_code)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    sys.exit(0)


if __name__ == "__main__":
    main()
