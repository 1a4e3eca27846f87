"""Command-line entry point: `camrender [render] --traj FILE --out VIDEO.mp4`, `camrender traj ...`,
`camrender batch JOBS`, `camrender serve`, `camrender selftest`.

Subcommands live in their own modules (`render`, `traj`, `batch`, `selftest`); this module only
assembles them and turns a user error into one line on stderr with exit code 2 (said once, by rank 0,
under torchrun), running out of GPU memory into one line of what fits the card (`memory_advice`, exit 2),
Ctrl-C into 130 and SIGTERM into 143 (`signals`).
Heavy imports (torch, diffusers) happen inside the commands that need them.
"""
import os
import sys
import time

import click

from camrender.allocator import use_expandable_segments
from camrender.cli import encode_prompt, selftest
from camrender.cli import batch as cli_batch
from camrender.cli import eval as cli_eval
from camrender.cli import play as cli_play
from camrender.cli import render as cli_render
from camrender.cli import serve as cli_serve
from camrender.cli import traj as cli_traj
from camrender.cli import memory_advice
from camrender.cli.signals import forget_interrupted_exec, handled_signals, terminated
from camrender.errors import CamrenderError
from camrender.parallel.distributed import is_main_process

# Options that belong to the root group itself; anything else starting with "--"
# as the first argument means the user typed `camrender --traj ...` (implicit render).
_ROOT_OPTIONS = {"--help", "-h", "--version"}
# click >= 8.2 raises this for a bare group (`camrender`, `camrender traj`); older click prints the help itself
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


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
    cli.add_command(cli_traj.traj)
    for command in cli_render.COMMANDS:
        cli.add_command(command)
    cli.add_command(selftest.command)
    cli.add_command(encode_prompt.command)
    cli.add_command(cli_batch.batch)
    cli.add_command(cli_play.play)
    cli.add_command(cli_eval.command)
    cli.add_command(cli_serve.serve)


_register()


def _say(line: str) -> None:
    """One line on stderr, from rank 0 only when several processes run the command (torchrun)."""
    if is_main_process():
        click.echo(line, err=True)


# How long a rank other than 0 that failed waits for torchrun to stop it: rank 0 meets the same bad
# input, reports it and exits, and torchrun then stops the others. A rank still running after that
# failed on its own and reports itself.
RANK_0_REPORTS_S = 20.0


def _report(line: str) -> None:
    """Rank 0 (or a single process) says `line`; another rank waits to be stopped (see RANK_0_REPORTS_S)
    and says it only if it was not, naming its rank."""
    if is_main_process():
        click.echo(line, err=True)
        return
    time.sleep(RANK_0_REPORTS_S)
    click.echo(line.replace("camrender:", f"camrender (rank {os.environ.get('RANK')}):", 1), err=True)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv=None):
    """Run the CLI; user errors become one line on stderr and exit code 2; Ctrl-C exits 130, SIGTERM 143."""
    use_expandable_segments()  # before any command touches CUDA (camrender.allocator)
    try:
        with handled_signals():
            cli.main(args=argv, prog_name="camrender", standalone_mode=False)
    except CamrenderError as error:
        _report(f"camrender: error: {_one_line(error)}")
        sys.exit(error.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):  # click turns a KeyboardInterrupt into Abort
        forget_interrupted_exec()
        if terminated():
            _say("camrender: terminated (SIGTERM)")
            sys.exit(143)
        _say("camrender: interrupted")
        sys.exit(130)
    except _NO_ARGS_IS_HELP as error:
        # a bare `camrender` or `camrender traj`: the help as --help shows it, not an error line
        if is_main_process():
            click.echo(error.ctx.get_help())
        sys.exit(0)
    except click.UsageError as error:
        # one line (click's own display adds the usage and a hint); --help shows the usage
        command = error.ctx.command_path if error.ctx is not None else "camrender"
        _report(f"camrender: error: {_one_line(error.format_message())} (see {command} --help)")
        sys.exit(error.exit_code)
    except click.ClickException as error:
        _report(f"camrender: error: {_one_line(error.format_message())}")
        sys.exit(error.exit_code)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except RuntimeError as error:  # torch.OutOfMemoryError, told by name (no torch import here)
        if not memory_advice.is_out_of_memory(error):
            raise
        _report(f"camrender: error: {memory_advice.out_of_memory_line(*memory_advice.current_card())}")
        sys.exit(CamrenderError.exit_code)
    sys.exit(0)


if __name__ == "__main__":
    main()
