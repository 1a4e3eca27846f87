"""Fused Triton kernels for SANA-WM and their plain PyTorch references (imports torch and triton only)."""
