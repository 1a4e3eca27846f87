"""Run the reference kit's `make_golden.py` with the temporal short convs randomised too.

The kit randomises every all-zero and all-ones parameter of the official model after
`build_model`; the GDN blocks' K short convolutions (`attn.conv_k`, `attn.conv_k_cam`, (C, 1, K))
start as the identity (1 on the last tap), so the kit's own goldens cannot tell whether a
reimplementation carries the convs' left context across chunks. This wrapper adds
N(0, 0.3^2) to every tap of those convs (drawn after the kit's own randomisation, from
`Generator().manual_seed(seed * 1000 + 7)`) and then runs the kit unchanged; the perturbed names
are listed in the file's `randomized_ones_init_params` metadata, marked "(identity + noise)".

    SANA_WM_SITE=... python3 tests/golden/make_golden_convs.py KIT_ARGS...   (the kit's own arguments)

The kit folder is `$SANA_WM_KIT` (default /work/shared/reference/nvlabs-sana-wm).
"""
import os
import sys

KIT = os.environ.get("SANA_WM_KIT", "/work/shared/reference/nvlabs-sana-wm")
sys.path.insert(0, KIT)
import make_golden  # noqa: E402  (sets up the kit's imports; reads --fp32-softmax from sys.argv)
import torch  # noqa: E402

_kit_randomize = make_golden.randomize_


def randomize_with_convs(model, gen):
    report = _kit_randomize(model, gen)
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
    conv_gen = torch.Generator().manual_seed(seed * 1000 + 7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("attn.conv_k.weight", "attn.conv_k_cam.weight")):
                param.add_(0.3 * torch.randn(param.shape, generator=conv_gen))
                report["ones"].append(f"{name} (identity + noise)")
    return report


make_golden.randomize_ = randomize_with_convs
make_golden.main()
