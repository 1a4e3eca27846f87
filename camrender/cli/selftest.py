"""`camrender selftest`: every fused kernel against its PyTorch reference on small shapes.

Runs on the GPU when one is present, else through the Triton interpreter on the CPU
(TRITON_INTERPRET=1 must be set before triton is imported; when it is not and triton is
already loaded, the test re-runs itself in a fresh interpreter process).

Cases come from `default_cases()` below. A case is a `SelftestCase`: `name`, `shape` (a label),
`run(device) -> (actual, expected)` where both are tensors or equal-length tuples of tensors,
and `tolerance`: the case passes when max |actual - expected| <= tolerance * max(1, max |expected|).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from typing import Callable

import click


@dataclasses.dataclass
class SelftestCase:
    name: str
    shape: str
    run: Callable
    tolerance: float = 1e-4


@dataclasses.dataclass
class SelftestResult:
    kernel: str
    shape: str
    max_error: float
    time_ms: float
    passed: bool
    error: str = ""


# ----------------------------------------------------------------------------- random inputs
def _generator(seed):
    """CPU generator: inputs are drawn on the CPU and moved, so every device sees the same values."""
    import torch

    return torch.Generator(device="cpu").manual_seed(seed)


def _randn(shape, generator, device, scale=1.0):
    import torch

    return (torch.randn(shape, generator=generator) * scale).to(device)


def _rand(shape, generator, device, low=0.0, high=1.0):
    import torch

    return (low + (high - low) * torch.rand(shape, generator=generator)).to(device)


def _random_se3(count, generator, device):
    """(count, 4, 4) random rigid transforms (rotation from QR, det +1; translation ~ N(0, 1))."""
    import torch

    q, r = torch.linalg.qr(torch.randn(count, 3, 3, generator=generator))
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]
    q[torch.det(q) < 0, :, 0] *= -1
    m = torch.eye(4).repeat(count, 1, 1)
    m[:, :3, :3] = q
    m[:, :3, 3] = torch.randn(count, 3, generator=generator)
    return m.to(device)


def _ray_transforms(batch, tokens, dim, generator, device):
    """(P, P_T, P_inv, rope_cam) shaped like diffusers' `_prepare_ucpe_ray_transforms` output."""
    import torch

    p = _random_se3(batch * tokens, generator, device).reshape(batch, tokens, 4, 4)
    p_inv = torch.linalg.inv(p)
    rope = _random_rope(tokens, dim // 4, generator, device)
    return p, p.transpose(-1, -2).contiguous(), p_inv.contiguous(), rope


# ----------------------------------------------------------------------------- default cases
def _scan_case(batch, heads, frames, spatial, dim):
    def run(device):
        from camrender import kernels

        g = _generator(1)
        q = _randn((batch, heads, frames, spatial, dim), g, device, 0.3)
        k = _randn((batch, heads, frames, spatial, dim), g, device, 0.3)
        v = _randn((batch, heads, frames, spatial, dim), g, device)
        beta = _rand((batch, heads, frames, spatial), g, device)
        decay = _rand((batch, heads, frames), g, device, 0.5, 1.0)
        state = _randn((batch, heads, dim, dim), g, device, 0.1)
        starts = _middle_segment_start(frames, device)
        args = (q, k, v, beta, decay)
        kwargs = dict(initial_state=state, segment_starts=starts)
        return kernels.delta_scan(*args, precision="ieee", **kwargs), kernels.delta_scan_ref(*args, **kwargs)

    return SelftestCase("delta_scan", f"B{batch} H{heads} T{frames} S{spatial} D{dim}", run)


def _middle_segment_start(frames, device):
    """Bool (T,) segment starts with one cut in the middle (the reverse scan restarts there)."""
    import torch

    starts = torch.zeros(frames, dtype=torch.bool, device=device)
    starts[frames // 2] = True
    return starts


def _camera_inputs(batch, heads, frames, spatial, dim, device):
    g = _generator(2)
    tokens = frames * spatial
    q, k, v = (_randn((batch, tokens, heads, dim), g, device) for _ in range(3))
    beta = _rand((batch, heads, frames, spatial), g, device)
    decay = _rand((batch, heads, frames), g, device, 0.5, 1.0)
    rays = _ray_transforms(batch, tokens, dim, g, device)
    qw = _rand((heads * dim,), g, device, 0.5, 1.5)
    kw = _rand((heads * dim,), g, device, 0.5, 1.5)
    state = _randn((batch, heads, dim, dim), g, device, 0.1)
    return q, k, v, beta, decay, rays, qw, kw, state


def _cam_prep_case(batch, heads, frames, spatial, dim):
    def run(device):
        from camrender import kernels

        q, k, v, _, _, rays, qw, kw, _ = _camera_inputs(batch, heads, frames, spatial, dim, device)
        kwargs = dict(num_frames=frames, q_norm_weight=qw, k_norm_weight=kw)
        return kernels.cam_prep(q, k, v, rays, **kwargs), kernels.cam_prep_ref(q, k, v, rays, **kwargs)

    return SelftestCase("cam_prep", f"B{batch} H{heads} T{frames} S{spatial} D{dim}", run)


def _cam_decode_case(batch, heads, frames, spatial, dim):
    def run(device):
        from camrender import kernels

        g = _generator(3)
        tokens = frames * spatial
        x = _randn((batch, heads, tokens, dim), g, device)
        p, _, _, rope = _ray_transforms(batch, tokens, dim, g, device)
        return kernels.cam_decode(x, p, rope), kernels.cam_decode_ref(x, p, rope)

    return SelftestCase("cam_decode", f"B{batch} H{heads} N{frames * spatial} D{dim}", run)


def _camera_branch_case(batch, heads, frames, spatial, dim):
    def run(device):
        from camrender import kernels

        q, k, v, beta, decay, rays, qw, kw, state = _camera_inputs(batch, heads, frames, spatial, dim, device)
        kwargs = dict(q_norm_weight=qw, k_norm_weight=kw, initial_state=state, return_final_state=True)
        fused = kernels.camera_branch(q, k, v, beta, decay, rays, precision="ieee", backend="triton", **kwargs)
        reference = kernels.camera_branch(q, k, v, beta, decay, rays, backend="torch", **kwargs)
        return fused, reference

    return SelftestCase("camera_branch", f"B{batch} H{heads} T{frames} S{spatial} D{dim}", run)


def _main_cases(batch, heads, frames, spatial, dim):
    """Main-branch kernels: short conv (with and without cached frames), prep, the whole branch."""
    from camrender.kernels import main_reference as ref
    from camrender.kernels.main_branch import main_branch
    from camrender.kernels.main_prep import main_prep
    from camrender.kernels.short_conv import short_conv

    channels, tokens = heads * dim, frames * spatial
    label = f"B{batch} H{heads} T{frames} S{spatial} D{dim}"

    def inputs(device):
        g = _generator(4)
        x = _randn((batch, tokens, channels), g, device)
        weight = _randn((channels, 1, 4), g, device, 0.5)
        norm_w = _rand((channels,), g, device, 0.5, 1.5)
        rope = _random_rope(tokens, dim // 2, g, device)
        return g, x, weight, norm_w, rope

    def run_conv(device):
        _, x, weight, _, _ = inputs(device)
        return (short_conv(x, weight, frames, backend="triton"), ref.short_conv_ref(x, weight, frames))

    def run_prep(device):
        _, x, _, norm_w, rope = inputs(device)
        kwargs = dict(scale=dim ** -0.5, rope=rope)
        return main_prep(x, norm_w, heads, **kwargs), ref.main_prep_ref(x, norm_w, heads, **kwargs)

    def run_branch(device):
        g, x, _, norm_w, rope = inputs(device)
        k = _randn((batch, tokens, channels), g, device)
        v = _randn((batch, tokens, channels), g, device)
        beta = _rand((batch, heads, frames, spatial), g, device)
        decay = _rand((batch, heads, frames), g, device, 0.5, 1.0)
        kwargs = dict(q_norm_weight=norm_w, k_norm_weight=norm_w)
        fused = main_branch(x, k, v, beta, decay, rope, precision="ieee", backend="triton", **kwargs)
        return fused, ref.main_branch_ref(x, k, v, beta, decay, rope, **kwargs)

    def run_conv_context(device):
        g, x, weight, _, _ = inputs(device)
        context = _randn((batch, 3 * spatial, channels), g, device)  # 3 cached frames (segment mode)
        fused = short_conv(x, weight, frames, left_context=context, backend="triton")
        return fused, ref.short_conv_ref(x, weight, frames, left_context=context)

    return [SelftestCase("short_conv", label, run_conv), SelftestCase("short_conv+context", label, run_conv_context),
            SelftestCase("main_prep", label, run_prep), SelftestCase("main_branch", label, run_branch),
            *_softmax_camera_cases(batch, heads, frames, spatial, dim)]


def _softmax_camera_cases(batch, heads, frames, spatial, dim):
    """UCPE encode/decode around the softmax blocks' camera SDPA."""
    from camrender.kernels.main_reference import cam_softmax_decode_ref as decode_ref
    from camrender.kernels.main_reference import cam_softmax_encode_ref as encode_ref
    from camrender.kernels.softmax_cam import cam_softmax_decode as decode
    from camrender.kernels.softmax_cam import cam_softmax_encode as encode

    tokens, channels = frames * spatial, heads * dim
    label = f"B{batch} H{heads} N{tokens} D{dim}"

    def run_encode(device):
        g = _generator(5)
        q, k, v = (_randn((batch, tokens, channels), g, device) for _ in range(3))
        rays = _ray_transforms(batch, tokens, dim, g, device)
        weights = dict(q_norm_weight=_rand((channels,), g, device, 0.5, 1.5),
                       k_norm_weight=_rand((channels,), g, device, 0.5, 1.5))
        return encode(q, k, v, rays, heads=heads, **weights), encode_ref(q, k, v, rays, heads=heads, **weights)

    def run_decode(device):
        g = _generator(6)
        o = _randn((batch, heads, tokens, 128), g, device)
        rays = _ray_transforms(batch, tokens, dim, g, device)
        return decode(o, rays, dim=dim), decode_ref(o, rays, dim=dim)

    return [SelftestCase("cam_softmax_encode", label, run_encode), SelftestCase("cam_softmax_decode", label, run_decode)]


def _glue_cases(batch, frames, spatial, channels):
    """The block's single-pass adaLN glue (kernels.block_glue) and the FFN's GLU depthwise conv."""
    from camrender.kernels import block_glue as glue
    from camrender.kernels.ffn_glu import glu_depthwise as glu
    from camrender.kernels.ffn_glu import glu_depthwise_ref as glu_ref

    tokens = frames * spatial
    label = f"B{batch} T{frames} S{spatial} C{channels}"

    def tensors(device, count, shape):
        g = _generator(7)
        return [_randn(shape, g, device) for _ in range(count)]

    def run_norm(device):
        x, r = tensors(device, 2, (batch, tokens, channels))
        shift, scale = tensors(device, 2, (batch, frames, channels))
        fused = glue.residual_ada_norm(x, r, shift, scale, backend="triton")
        return fused, glue.residual_ada_norm_ref(x, r, shift, scale)

    def run_residual(device):
        x, y, z = tensors(device, 3, (batch, tokens, channels))
        (gate,) = tensors(device, 1, (batch, frames, channels))
        return (glue.gated_residual(x, y, gate, y2=z, backend="triton"), glue.gated_residual_ref(x, y, gate, z))

    def run_gate(device):
        a, b, gate = tensors(device, 3, (batch, tokens, channels))
        return glue.silu_gate(a, gate, b=b, backend="triton"), glue.silu_gate_ref(a, gate, b)

    height, width = 3, spatial // 3

    def run_glu(device):
        g = _generator(8)
        h = _randn((batch * frames, height * width, 2 * channels), g, device)
        weight = _randn((2 * channels, 1, 3, 3), g, device, 0.3)
        bias = _randn((2 * channels,), g, device, 0.1)
        return (glu(h, weight, bias, height, width, backend="triton"), glu_ref(h, weight, bias, height, width))

    return [SelftestCase("residual_ada_norm", label, run_norm), SelftestCase("gated_residual", label, run_residual),
            SelftestCase("silu_gate", label, run_gate),
            SelftestCase("glu_depthwise", f"F{batch * frames} {height}x{width} C{2 * channels}", run_glu)]


def _random_rope(tokens, pairs, generator, device):
    """Complex (1, 1, N, pairs) unit rotations at uniform random angles (a RoPE table)."""
    import torch

    angles = torch.rand(1, 1, tokens, pairs, generator=generator) * 2 * math.pi
    return torch.polar(torch.ones_like(angles), angles).to(device)


def default_cases() -> list:
    """Small shapes covering each kernel: head dims 16 and 112 (the release), odd frame/token counts."""
    cases = []
    for batch, heads, frames, spatial, dim in ((1, 2, 3, 6, 16), (2, 1, 2, 5, 112)):
        cases += [
            _scan_case(batch, heads, frames, spatial, dim),
            _cam_prep_case(batch, heads, frames, spatial, dim),
            _cam_decode_case(batch, heads, frames, spatial, dim),
            _camera_branch_case(batch, heads, frames, spatial, dim),
        ]
    cases += _main_cases(1, 2, 3, 6, 16)
    cases += _glue_cases(2, 3, 6, 40)
    return cases


# ----------------------------------------------------------------------------- running
def _as_tuple(value):
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def compare(actual, expected) -> tuple[float, float]:
    """(max abs error, max |expected|) over all paired tensors."""
    actual, expected = _as_tuple(actual), _as_tuple(expected)
    if len(actual) != len(expected):
        raise ValueError(f"kernel returned {len(actual)} outputs, reference {len(expected)}")
    error, scale = 0.0, 0.0
    for a, e in zip(actual, expected):
        if tuple(a.shape) != tuple(e.shape):
            raise ValueError(f"shape {tuple(a.shape)} != reference {tuple(e.shape)}")
        a, e = a.float(), e.float()
        error = max(error, float((a - e).abs().max()) if a.numel() else 0.0)
        scale = max(scale, float(e.abs().max()) if e.numel() else 0.0)
    return error, scale


def run_case(case: SelftestCase, device) -> SelftestResult:
    import torch

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    try:
        if device.type == "cuda":
            case.run(device)  # compile and warm up; the timed run below is the measured one
        sync()
        start = time.perf_counter()
        actual, expected = case.run(device)
        sync()
        elapsed = (time.perf_counter() - start) * 1e3
        error, scale = compare(actual, expected)
        passed = math.isfinite(error) and error <= case.tolerance * max(1.0, scale)
        return SelftestResult(case.name, case.shape, error, elapsed, passed)
    except Exception as exc:  # a crashing kernel is a failed case, reported like the others
        return SelftestResult(case.name, case.shape, float("nan"), float("nan"), False, f"{type(exc).__name__}: {exc}")


def format_table(results, mode: str) -> str:
    rows = [("kernel", "shape", "max error", "time", "pass")]
    for r in results:
        time_text = "-" if math.isnan(r.time_ms) else f"{r.time_ms:.1f} ms"
        rows.append((r.kernel, r.shape, f"{r.max_error:.2e}", time_text, "ok" if r.passed else "FAIL"))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [f"camrender selftest ({mode})"]
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    lines += [f"{r.kernel} [{r.shape}]: {r.error}" for r in results if r.error]
    passed = sum(r.passed for r in results)
    lines.append(f"{passed}/{len(results)} passed")
    return "\n".join(lines)


def _needs_fresh_interpreter() -> bool:
    import torch

    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if "triton" in sys.modules:
        return True
    os.environ["TRITON_INTERPRET"] = "1"  # triton not imported yet: the setting still takes effect
    return False


def main(as_json: bool = False, cases=None) -> int:
    """Run the cases, print the table (or JSON); return 0 when all pass, 1 otherwise."""
    if cases is None and _needs_fresh_interpreter():
        env = dict(os.environ, TRITON_INTERPRET="1")
        argv = [sys.executable, "-m", "camrender.cli.selftest"] + (["--json"] if as_json else [])
        return subprocess.run(argv, env=env).returncode
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mode = f"GPU: {torch.cuda.get_device_name(device)}" if device.type == "cuda" else "CPU, Triton interpreter"
    results = [run_case(case, device) for case in (default_cases() if cases is None else cases)]
    ok = bool(results) and all(r.passed for r in results)
    if as_json:
        payload = {"device": mode, "passed": ok, "cases": [dataclasses.asdict(r) for r in results]}
        print(json.dumps(payload, indent=2, allow_nan=True))
    else:
        print(format_table(results, mode))
    return 0 if ok else 1



@click.command("selftest")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def command(as_json):
    """Check every fused kernel against its PyTorch reference on small shapes.

    Runs on the GPU when there is one, else through the Triton interpreter on the CPU.
    Exit code 1 when any kernel disagrees with its reference.
    """
    sys.exit(main(as_json=as_json))


if __name__ == "__main__":
    sys.exit(main(as_json="--json" in sys.argv[1:]))
