"""Several processes rendering one video: torch.distributed setup and CFG parallel."""
