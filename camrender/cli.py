"""Command-line entry point: `camrender [render] --traj FILE --out VIDEO.mp4`, `camrender traj ...`, `camrender selftest`.

Subcommands live in their own modules (`cli_traj`, `cli_render`); this module only
assembles them and turns `CamrenderError` into one line on stderr with exit code 2.
Heavy imports (torch, diffusers) happen inside the commands that need them.
"""
import sys

import click

from camrender.distributed import is_main_process
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
    from camrender import cli_batch, cli_render, cli_traj

    cli.add_command(cli_traj.traj)
    for command in cli_render.COMMANDS:
        cli.add_command(command)
    cli.add_command(cli_batch.batch)


_register()


def _say(line: str) -> None:
    """One line on stderr, from rank 0 only when several processes run the command (torchrun)."""
    if is_main_process():
        click.echo(line, err=True)


def main(argv=None):
    """Run the CLI; user errors become one line on stderr and exit code 2."""
    try:
        cli.main(args=argv, prog_name="camrender", standalone_mode=False)
    except CamrenderError as error:
        _say(f"camrender: error: {error}")
        sys.exit(error.exit_code)
    except click.exceptions.Abort:
        _say("camrender: interrupted")
        sys.exit(130)
    except KeyboardInterrupt:
        _say("camrender: interrupted")
        sys.exit(130)
    except click.ClickException as error:
        if is_main_process():
            error.show()
        sys.exit(error.exit_code)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    sys.exit(0)


if __name__ == "__main__":
    main()
