"""Fused Triton kernels for SANA-WM and their plain PyTorch references (imports torch and triton only).

The convention, after flash-linear-attention's (each op's naive PyTorch version beside its fast one, one
signature for both):

- Ops. The public ops of an op module `kernels/<name>.py` are the names in its `__all__` (the host functions
  callers use; the launch steps beside them, such as `cam_prep.cam_stage` or `delta_scan.run_scan`, are not ops).
- References. Beside each op module sits `kernels/<name>_reference.py`, holding `<op>_ref` for each op `<op>`:
  plain PyTorch with the op's arguments, less the fast path's launch and layout knobs (`backend`,
  `matmul_precision`, `out`, `tuning`, `num_warps`, ...); fp32 math, rounded where the stock diffusers code
  rounds. A reference module imports no Triton and not its op's module; pieces several references share sit in
  `kernels._reference_parts` (RMSNorm, pair rotation, the UCPE transform, `rope_tables`, `rope_pairs`).
- `backend`. Every op takes `backend=` ("auto" | "triton" | "torch", `_validate.BACKENDS`): "triton" runs its
  kernels, "torch" its `<op>_ref` (the op's outputs, written into `out` where given), "auto" the kernels on CUDA
  or under TRITON_INTERPRET=1 and the reference elsewhere (`_validate.use_triton`).
- State. Every op that carries a state across segments (`delta_scan`, `camera_branch`, `main_branch`, and
  `short_conv`, whose state is the raw input of the frames its causal half reads) takes `initial_state` and
  `output_final_state=False`, and returns `(output, final_state)`, final_state None unless asked; its reference
  likewise.
- `matmul_precision`. Ops with matrix products on tensor cores take `matmul_precision=` ("tf32" | "ieee",
  `_validate.MATMUL_PRECISIONS`): the `tl.dot` input precision. "Precision" alone means the linear layers'
  "bf16" / "fp8" (camrender.model.fp8), never this.
- Cases. `kernels.cases` is the table of cases, grouped by op, each comparing an op with its reference (a
  stateful op's final state included); `camrender selftest` prints it op by op and tests/kernels runs it.
  tests/kernels/test_reference_layout.py and test_kernel_cases.py check this convention.

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
