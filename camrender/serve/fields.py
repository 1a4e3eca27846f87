"""What a `POST /v1/videos` body may hold: the fields camrender takes from the engines that serve SANA-WM (the OpenAI
Videos API, vLLM-Omni, SGLang-diffusion), camrender's own, and those it refuses. One table: the request parser
(`camrender.serve.jobs`) reads it and docs/serve.md's compatibility tables are written from it
(`compatibility_tables`; a test keeps them equal).

Kinds: text, int, number, bool, size ("WIDTHxHEIGHT"), image (an uploaded file, base64 or a data: URL), document
(a trajectory), object (JSON: an object, or its text in a multipart field).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from camrender.trajectory import controls
from camrender.vocabulary import MODE, PRESET

ALL = "OpenAI, vLLM-Omni, SGLang"
ENGINES = "vLLM-Omni, SGLang"
OWN = "camrender"


@dataclasses.dataclass(frozen=True)
class Field:
    """One request field: its `name`, `kind`, the `plan_request` keyword it sets (None: read on its own), where
    the name comes from (`origin`) and what camrender does with it (`meaning`)."""

    name: str
    kind: str
    option: Optional[str]
    origin: str
    meaning: str


TOP = (
    Field("prompt", "text", "prompt", ALL, "Text prompt (default: the trajectory's, else empty)."),
    Field("negative_prompt", "text", "negative_prompt", ENGINES, "Negative prompt, used with guidance."),
    Field("input_reference", "image", None, ALL, "First-frame image: a file part (multipart), or base64 or a "
          "`data:` URL (JSON). A URL is refused: the server fetches nothing."),
    Field("image_reference", "image", None, "vLLM-Omni", '`{"image_url": "data:image/png;base64,..."}`; a URL is '
          "refused, `file_id` too."),
    Field("image", "image", None, OWN, "As `input_reference` (camrender's `--image`)."),
    Field("seconds", "number", None, ALL, "Clip length: `num_frames` = the recipe's 8k+1 count nearest to "
          "seconds x fps + 1 (fps: the request's, else the path's). Not with `num_frames`."),
    Field("num_frames", "int", "frames", ENGINES, "Video frames (`--frames`): 8k+1; the path is re-timed to it."),
    Field("size", "size", None, ALL, "`WIDTHxHEIGHT` (default: the model's). Not with `width` / `height`."),
    Field("width", "int", "width", ENGINES, "Video width (`--width`)."),
    Field("height", "int", "height", ENGINES, "Video height (`--height`)."),
    Field("fps", "number", "fps", ENGINES, "Output frame rate (default: the path's)."),
    Field("seed", "int", "seed", ENGINES, "Noise seed, 0 .. 2^63-1 (default: the path's, else 0: a job repeats)."),
    Field("num_inference_steps", "int", "steps", ENGINES, "Denoising steps (`--steps`; default: the recipe's)."),
    Field("guidance_scale", "number", "guidance", ENGINES, "Classifier-free guidance (`--guidance`; default: the "
          "recipe's)."),
    Field("flow_shift", "number", "flow_shift", ENGINES, "Full mode's scheduler shift (default: the recipe's)."),
    Field("model", "text", None, ALL, "The served model (`GET /health` names it): another is refused."),
    Field("user", "text", None, "OpenAI, vLLM-Omni", "Kept with the job, not used."),
    Field("n", "int", None, "SGLang", "1 only: one video per job."),
    Field("extra_params", "object", None, "vLLM-Omni", '`{"sana_wm": {...}}`: the camera path (below); other keys '
          "are refused."),
    Field("trajectory", "document", None, OWN, "Any path camrender reads: a file part (its name tells the format: "
          "v1 `.json`, nerfstudio, `transforms.json`, RealEstate10K `.txt`, COLMAP `images.txt`, `NAME_pose.npy`, "
          "`.actions`; further `trajectory` parts are the files read beside it: `cameras.txt`, "
          "`NAME_intrinsics.npy`), a JSON document, or a text (an action string, a RealEstate10K file's text)."),
    Field("preset", "text", "preset", OWN, f"Render settings of a benchmark for the fields not given: "
          f"{' or '.join(PRESET.values)} (`--preset`)."),
    Field("mode", "text", "mode", OWN, f"{' or '.join(MODE.values)} (`--mode`; default: the recipe's)."),
    Field("segment_frames", "int", "segment_frames", OWN, "Latent frames per segment (`--segment-frames`)."),
    Field("cached_segments", "int", "cached_segments", OWN, "Recent segments attended (`--cached-segments`)."),
    Field("action_scheme", "text", "action_scheme", OWN, f"Action strings: {' or '.join(controls.SCHEME_NAMES)} "
          "(`--action-scheme`)."),
    Field("translation_speed", "number", "translation_speed", OWN, "Action strings: units per frame."),
    Field("rotation_speed", "number", "rotation_speed", OWN, "Action strings: degrees per frame."),
    Field("pitch_limit", "number", "pitch_limit", OWN, "Action strings: pitch limit in degrees."),
    Field("smooth", "bool", "smooth", OWN, "Action strings: the velocity model (`--smooth`)."),
)

SANA_WM = (
    Field("action", "text", None, "vLLM-Omni", "Action string (`w-16,dw-8`): the path, rolled out with "
          "`action_scheme` (default sana-wm). With `num_frames` the path is re-timed (vLLM-Omni refuses a "
          "length that differs)."),
    Field("camera", "object", None, "vLLM-Omni", '`{"poses": [[[4x4]], ...]}`: one camera-to-world matrix per '
          "frame, OpenCV axes (as a `NAME_pose.npy`)."),
    Field("intrinsics", "object", None, "vLLM-Omni", "`{fx, fy, cx, cy}` in pixels of the first-frame image, as "
          "`--intrinsics` (vLLM-Omni: of the output size; the same when the image has the video's size)."),
    Field("translation_speed", "number", "translation_speed", "vLLM-Omni", "Action strings: units per frame."),
    Field("rotation_speed_deg", "number", "rotation_speed", "vLLM-Omni", "Action strings: degrees per frame."),
)

REFUSED = {
    "video_reference": "SANA-WM starts from one image; no video conditioning",
    "video_url": "SANA-WM starts from one image; no video conditioning",
    "video_path": "the server reads no path a client names",
    "reference_url": "the server fetches nothing: upload the image or send it as base64",
    "output_path": "the server decides where a video is written",
    "audio_reference": "no audio",
    "generate_sound": "no audio",
    "guidance_scale_2": "one transformer (Wan2.2's second expert has no counterpart)",
    "boundary_ratio": "one transformer (Wan2.2's second expert has no counterpart)",
    "true_cfg_scale": "guidance is `guidance_scale`",
    "lora": "the pipeline is loaded once, with `camrender serve`'s options",
    "diffusers_kwargs": "the pipeline is loaded once, with `camrender serve`'s options",
    "enable_frame_interpolation": "not part of camrender's render",
    "enable_upscaling": "not part of camrender's render (the refiner is `camrender serve --refiner`)",
    "quality": "the render's settings say what it is",
    "video_params": "give `width`, `height`, `num_frames`, `fps` at the top level",
}
# camrender's render options a request may not set: the server decides them
SERVER_OPTIONS = {
    "out": "the server writes the video into its store",
    "prompt_cache": "the server's folder (`camrender serve --prompt-cache`)",
    "intrinsics": "a file on the server; give `extra_params.sana_wm.intrinsics`",
    "noise_frames": "a live flight's setting",
    "controls": "recorded from the action scheme",
}
# the render options of camrender's CLI a request spells as the engines do
CLI_NAMES = {"steps": "num_inference_steps", "guidance": "guidance_scale", "frames": "num_frames",
             "traj": "trajectory"}


def by_name(fields) -> dict:
    return {field.name: field for field in fields}


def compatibility_tables() -> str:
    """docs/serve.md's tables (markdown): the fields taken, then those of `extra_params.sana_wm`, then the
    refused ones."""
    def rows(fields):
        return [f"| `{f.name}` | {f.kind} | {f.origin} | {f.meaning} |" for f in fields]

    head = ["| field | kind | from | camrender |", "|---|---|---|---|"]
    refused = ["| field | why refused |", "|---|---|"]
    refused += [f"| `{name}` | {why} |" for name, why in REFUSED.items()]
    refused += [f"| `{name}` | {why} |" for name, why in SERVER_OPTIONS.items()]
    return "\n".join(head + rows(TOP) + ["", "`extra_params.sana_wm`:", ""] + head + rows(SANA_WM) + [""] + refused)
