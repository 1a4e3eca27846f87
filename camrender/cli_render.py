"""`camrender render` and `camrender selftest` (torch/diffusers imported inside the commands)."""

COMMANDS = []
