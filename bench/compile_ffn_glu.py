"""Compile kernels.ffn_glu's kernel for sm_90 without a GPU and print its resource usage.

    python bench/compile_ffn_glu.py [--lanes 128 --block-c 8 --num-warps 4 --prefetch 2] [--dtype bf16] [--silu tanh]

Release shape by default (F = 42 images of 22 x 40 pixels, 2Hd = 13440). Prints one JSON object:
registers, stack / local bytes (spills), shared memory, and SASS instruction counts of interest
(16-byte loads and stores, shuffles, MUFU, barriers, local-memory traffic), read with the
`cuobjdump` shipped in Triton's NVIDIA backend.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from camrender.kernels import ffn_glu  # noqa: E402

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
SASS_OPS = ("LDG.E.128", "STG.E.128", "LDS", "STS", "SHFL", "MUFU", "BAR", "LDL", "STL")


def compile_kernel(args):
    n_chunks, chunk_w, group = ffn_glu.column_plan(args.width, args.lanes)
    hidden = args.hidden
    ints = {
        "HEIGHT": args.height, "WIDTH": args.width, "HIDDEN": hidden, "N_TASKS": args.frames * n_chunks,
        "N_CHUNKS": n_chunks, "CHUNK_W": chunk_w, "stride_hf": args.height * args.width * 2 * hidden,
        "stride_hp": 2 * hidden, "stride_of": args.height * args.width * hidden, "stride_op": hidden,
    }
    pointers = {"h_ptr": args.dtype, "w_ptr": args.dtype, "b_ptr": args.dtype, "out_ptr": args.dtype}
    constexprs = {"HAS_BIAS": True, "LANES": args.lanes, "GROUP": group, "BLOCK_C": args.block_c,
                  "PREFETCH": args.prefetch, "FAST_EXP": True, "TANH": args.silu == "tanh"}
    signature, attrs = {}, {}
    # Same specialisation as a launch: pointers 16-byte aligned, integers divisible by 16 flagged.
    for index, name in enumerate(list(pointers) + list(ints)):
        if name in pointers:
            signature[name] = "*" + pointers[name]
            attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "i32"
            if ints[name] % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
    signature.update({name: "constexpr" for name in constexprs})
    source = ASTSource(ffn_glu._glu_depthwise_kernel, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": args.num_warps, "num_stages": 1})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=42)
    parser.add_argument("--silu", default=ffn_glu.DEFAULT_TUNING["silu"], choices=["exp", "tanh"])
    parser.add_argument("--height", type=int, default=22)
    parser.add_argument("--width", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=6720, help="Hd (h has 2*Hd channels)")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    tuning = ffn_glu.DEFAULT_TUNING
    parser.add_argument("--lanes", type=int, default=tuning["lanes"])
    parser.add_argument("--block-c", type=int, default=tuning["block_c"])
    parser.add_argument("--num-warps", type=int, default=tuning["num_warps"])
    parser.add_argument("--prefetch", type=int, default=tuning["prefetch"])
    args = parser.parse_args()

    kernel = compile_kernel(args)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "kernel.cubin")
        with open(cubin, "wb") as f:
            f.write(kernel.asm["cubin"])
        usage = subprocess.run([CUOBJDUMP, "-res-usage", cubin], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([CUOBJDUMP, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    report = {
        "triton": triton.__version__, "target": "sm_90", "dtype": args.dtype,
        "tuning": {"lanes": args.lanes, "block_c": args.block_c, "num_warps": args.num_warps,
                   "prefetch": args.prefetch},
        "registers": int(found.group(1)), "stack_bytes": int(found.group(2)),
        "shared_bytes": int(found.group(3)), "local_bytes": int(found.group(4)),
        "sass_counts": {op: len(re.findall(r"\b" + re.escape(op) + r"\b", sass)) for op in SASS_OPS},
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
