"""Did the video follow the camera? Scoring rendered videos against the paths they were asked to follow.

SANA-WM-Bench's metrics (RotErr in degrees, TransErr_rel, CamMC_rel: `metrics`) on poses estimated from
the video's frames (`backends`: `colmap`, `pi3`), revisit consistency (`revisit`: PSNR, SSIM, LPIPS), one
video at a time (`score`) or a results folder against a benchmark manifest (`folder`), written as
`NAME.eval.json` and a picture (`report`, `picture`). No model import: the model layers never load here.
"""
