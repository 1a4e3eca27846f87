"""`camrender traj plot|preview|concat|retime`: see and reshape a path before rendering it."""

COMMANDS = []
