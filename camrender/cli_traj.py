"""`camrender traj ...`: author, check and convert trajectory files (no model import)."""
import click


@click.group()
def traj():
    """Create, check, convert and preview trajectory files."""
