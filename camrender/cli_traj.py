"""`camrender traj ...`: author, check and convert trajectory files (no model import)."""
import click

from camrender import cli_traj_view


@click.group()
def traj():
    """Create, check, convert and preview trajectory files."""


for _command in cli_traj_view.COMMANDS:
    traj.add_command(_command)
