"""Fused Triton kernels for SANA-WM and their plain PyTorch references (imports torch and triton only).

Public names:
    camera_branch      the whole camera branch of a GDN block (prep + fwd/rev scan + decode)
    delta_scan         Triton frame-wise delta rule, delta_scan_ref's signature
    cam_prep, cam_decode   standalone camera encode / decode kernels
    *_ref              fp32 PyTorch references (kernels.reference)
"""
from .cam_decode import cam_decode
from .cam_prep import cam_prep
from .camera_branch import camera_branch
from .delta_scan import delta_scan
from .reference import (cam_decode_ref, cam_prep_ref, camera_branch_ref, delta_scan_ref,
                        discount_beta_ref)

__all__ = ["camera_branch", "delta_scan", "cam_prep", "cam_decode", "camera_branch_ref", "delta_scan_ref",
           "cam_prep_ref", "cam_decode_ref", "discount_beta_ref"]
