"""The words camrender's settings take, their defaults and what they mean: one place for each vocabulary.

Every `click.Choice`, default and check of these settings, in the CLI and the Python API alike, and the
README's option table (`camrender.cli.options.option_table`) come from here. No torch, no model.

    PRECISION.values        ("bf16", "fp8")      the blocks' linear layers, per stage
    KERNELS.values          ("fused", "torch")   which code runs the patched blocks
    MODE.values             ("full", "segments")
    DTYPE.values            ("auto", "bfloat16", "float16", "float32")
    RECIPE.values           the checkpoint recipes (`camrender.model.stage1.recipes.RECIPES` holds them)
    PROGRESS.values         ("auto", "bar", "lines", "none")
    REFINER_OFFLOAD.values  ("none", "layers"), or a number of blocks

The kernels' own call vocabulary (their `backend` "auto" | "triton" | "torch" and matmul precision "tf32" |
"ieee") lives with them in `camrender.kernels._validate`: the kernels import nothing of camrender.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from camrender.errors import CamrenderError


@dataclasses.dataclass(frozen=True)
class Words:
    """A setting that takes one of a few words.

    name: the setting's name in the Python API (the option is `--` + name with dashes);
    values: the words, in the order help lists them; default: the word taken when none is given (None: decided
    elsewhere, e.g. from the recipe); help: one sentence for `--help` and the README; meanings: word -> what it
    does, for the help text.
    """

    name: str
    values: tuple
    default: Optional[str]
    help: str
    meanings: tuple = ()

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def describe(self) -> str:
        """The help text with each word's meaning: "Help. fused: ...; torch: ..."."""
        if not self.meanings:
            return self.help
        return f"{self.help} " + "; ".join(f"{word}: {meaning}" for word, meaning in self.meanings) + "."


PRECISION = Words(
    "precision", ("bf16", "fp8"), "bf16",
    "The transformer blocks' linear layers, both stages.",
    (("bf16", "the model's dtype"),
     ("fp8", "e4m3 weights and activations (GPUs of compute capability 8.9+: Ada, Hopper)")))
STAGE1_PRECISION = dataclasses.replace(PRECISION, name="stage1_precision", default=None,
                                       help="Stage 1's linear layers (default: --precision).", meanings=())
REFINER_PRECISION = dataclasses.replace(PRECISION, name="refiner_precision", default=None,
                                        help="The refiner's linear layers (default: --precision).", meanings=())

KERNELS = Words(
    "kernels", ("fused", "torch"), "fused",
    "Which code runs the patched blocks.",
    (("fused", "Triton kernels for stage 1 and the refiner (their PyTorch references on a CPU)"),
     ("torch", "stage 1 on the kernels' PyTorch references, the refiner on diffusers' own block code")))

MODE = Words(
    "mode", ("full", "segments"), None,
    "How the clip is denoised (default: the recipe's).",
    (("full", "the whole clip at once"), ("segments", "segment by segment with cached state")))

DTYPE = Words(
    "dtype", ("auto", "bfloat16", "float16", "float32"), "auto",
    "The model's dtype.", (("auto", "bfloat16 on a GPU, float32 on a CPU"),))
HALF_DTYPES = ("bfloat16", "float16")  # need a GPU (the pipeline's CPU kernels refuse them)

RECIPE = Words(
    "recipe", ("bidirectional", "bidirectional-nvlabs-latest", "bidirectional-diffusers", "streaming",
               "chunk-causal"), None,
    "The checkpoint's recipe (default: told from the checkpoint; the README's recipe table says what each "
    "reproduces).")  # the option's help lists the names
DEFAULT_RECIPE = "bidirectional"

PROGRESS = Words(
    "progress", ("auto", "bar", "lines", "none"), "auto",
    "How progress shows.",
    (("bar", "progress bars"),
     ("lines", "one line per segment, per denoising step at most one every 5 s, with stage, counts, rate and ETA "
               "(for logs)"),
     ("auto", "bars on a terminal, else lines"), ("none", "no progress")))

REFINER_OFFLOAD = Words(
    "refiner_offload", ("none", "layers"), "none",
    "Where the refiner's DiT lives.",
    (("none", "on the GPU"),
     ("N", "N of its 48 blocks stay in CPU memory and visit the GPU in turn behind the others' compute (N - 2 "
           "blocks' weights less on the GPU: 0.5 GiB each in bf16, 0.25 in fp8; N from 3)"),
     ("layers", "every block visits the GPU in turn (smallest, slowest; needs accelerate)")))
MIN_STREAMED_BLOCKS = 3  # fewer take no memory off the GPU: the two staging slots hold two blocks

REFINER_WINDOW = 11  # latent frames: the sink plus 10 recent ones, the released recipe's
REFINER_WINDOW_HELP = ("The refiner's KV window in latent frames: the sink plus N-1 recent frames (the official "
                       "--refiner_kv_max_frames; 2 is faster and smaller, at a quality cost).")
MAX_REFINER_WINDOW = 1024  # the RoPE table's latent frames: a longer window holds nothing more

PRESET = Words(
    "preset", ("sana-wm-bench",), None,
    "Render settings of a benchmark, for the options not given.",
    (("sana-wm-bench", "NVlabs' SANA-WM-Bench: 961 frames at 16 fps, 60 steps, guidance 5, flow shift 8.0, seed 42 "
                       "(the refiner's noise too); add --refiner as the benchmark runs it"),))
PRESETS = {"sana-wm-bench": {"frames": 961, "fps": 16.0, "steps": 60, "guidance": 5.0, "flow_shift": 8.0, "seed": 42}}

NO_REFINER = "none"
TINY = "tiny"  # the offline random-weight model (and refiner), built in code
DEFAULT_MODEL = "Efficient-Large-Model/SANA-WM_bidirectional-diffusers"

RELEASE_SIZE = (704, 1280)  # (height, width) in pixels: what the released model was trained at
TINY_SIZE = (64, 112)  # the tiny model's default: about the release aspect, small enough for a CPU


def check_word(words: Words, value, field: Optional[str] = None) -> str:
    """`value` if it is one of `words`' values, else a CamrenderError naming the setting (or `field`)."""
    if value not in words.values:
        raise CamrenderError(f"must be one of {', '.join(words.values)}, got {value!r}",
                             field=field or words.option.lstrip("-"))
    return value
