"""Fused Triton kernels for SANA-WM and their plain PyTorch references (imports torch and triton only).

The convention, after flash-linear-attention's (each op's naive PyTorch version beside its fast one):
every op module `kernels/<name>.py` (the Triton kernels and the host functions that launch them) has
a reference module `kernels/<name>_reference.py` beside it. For each op `<op>` of `<name>.py` the
reference module holds `<op>_ref`, plain PyTorch with the op's arguments (initial state in, final
state out: `initial_state=`, `output_final_state=` / a returned final state), less the fast path's
launch and layout knobs (`backend`, `precision`, `out`, `tuning`, `num_warps`, ...); fp32 math,
rounded where the stock diffusers code rounds. An op runs its reference when its `backend`
resolves to PyTorch (a CPU without TRITON_INTERPRET=1, or backend "torch"); `camrender selftest`
and tests/kernels compare op and reference on the table of `kernels.cases`. A reference module
imports no Triton and not its op's module; pieces several references share sit in
`kernels._reference_parts` (RMSNorm, pair rotation, the UCPE transform, `rope_tables`, `rope_pairs`).

Public names:
    camera_branch      the whole camera branch of a GDN block (prep + fwd/rev scan + decode)
    delta_scan         Triton frame-wise delta rule, delta_scan_ref's signature
    cam_prep, cam_decode   standalone camera encode / decode kernels
    *_ref              their fp32 PyTorch references (kernels.<name>_reference)
"""
from ._top_level_name import handed_over

if not handed_over(__name__):  # imported as camrender.kernels, or as a bare `kernels` with no such package
    from ._reference_parts import discount_beta_ref
    from .cam_decode import cam_decode
    from .cam_decode_reference import cam_decode_ref
    from .cam_prep import cam_prep
    from .cam_prep_reference import cam_prep_ref
    from .camera_branch import camera_branch
    from .camera_branch_reference import camera_branch_ref
    from .delta_scan import delta_scan
    from .delta_scan_reference import delta_scan_ref

    __all__ = ["camera_branch", "delta_scan", "cam_prep", "cam_decode", "camera_branch_ref", "delta_scan_ref",
               "cam_prep_ref", "cam_decode_ref", "discount_beta_ref"]
