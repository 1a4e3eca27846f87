"""Rendering: requests and inputs, the full and segment samplers, stage 2, decode, video output, resume."""
