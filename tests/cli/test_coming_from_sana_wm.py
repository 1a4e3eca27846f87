"""docs/coming-from-sana-wm.md's flag tables against both command lines: every flag of NVlabs' two scripts has a
row, and every camrender option a row names is an option of camrender's click commands (read from the commands
themselves), so the page cannot drift from either."""
import ast
import os
import re
from pathlib import Path

import click
import pytest

from camrender.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "coming-from-sana-wm.md"
KIT = Path(os.environ.get("SANA_WM_KIT", "/work/shared/reference/nvlabs-sana-wm")) / "src" / \
    "inference_video_scripts" / "wm"

# the argparse flags of NVlabs' scripts (5498e5b, the kit's src/), in their order
NVLABS_FLAGS = {
    "inference_sana_wm.py": (
        "--image --prompt --output_dir --name --camera --action --translation_speed --rotation_speed_deg "
        "--intrinsics --num_frames --fps --step --cfg_scale --flow_shift --sampling_algo --chunk_interval_k "
        "--num_cached_blocks --sink_token --num_frame_per_block --denoising_step_list --save_stage1 "
        "--negative_prompt --seed --no_action_overlay --config --model_path --no_refiner --refiner_root "
        "--refiner_gemma_root --refiner_seed --sink_size --refiner_block_size --refiner_kv_max_frames "
        "--offload_vae --offload_refiner").split(),
    "inference_sana_wm_streaming.py": (
        "--image --prompt --output_dir --name --camera --action --translation_speed --rotation_speed_deg "
        "--intrinsics --num_frames --fps --cfg_scale --flow_shift --seed --negative_prompt --streaming_root "
        "--config --model_path --causal_vae_path --refiner_root --refiner_gemma_root --denoising_step_list "
        "--num_frame_per_block --refiner_block_size --refiner_kv_max_frames --refiner_seed --sink_size "
        "--no_sink_token --num_cached_blocks --streaming_crf --streaming_preset --streaming_encoder --output_mode "
        "--no_mp4 --benchmark_json --benchmark_repeats --profile_cuda --sample_frames_npz --sample_frame_stride "
        "--no_compile --offload_vae --offload_refiner --offload_text_encoder --stage1_precision "
        "--refiner_precision").split(),
}
FLAG = re.compile(r"--[a-z0-9][a-z0-9_-]*")


def tables() -> dict:
    """{script: [(NVlabs cell, camrender cell, notes cell)]} of the page's "`SCRIPT`, flag by flag" sections."""
    found, script = {}, None
    for line in PAGE.read_text().splitlines():
        heading = re.match(r"## `([a-z_]+\.py)`, flag by flag", line)
        if heading:
            script = heading.group(1)
            found[script] = []
        elif line.startswith("## "):
            script = None
        elif script and line.startswith("| ") and not line.startswith("| NVlabs flag"):
            cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
            assert len(cells) == 3, line
            found[script].append(tuple(cells))
    return found


def code_spans(cell: str) -> list:
    return re.findall(r"`([^`]*)`", cell)


def command_options() -> dict:
    """{command path ("render", "traj preview", ...): its option spellings} of camrender's click commands."""
    options = {}

    def walk(command, path):
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}".strip())
        else:
            options[path] = {spelling for param in command.params for spelling in (*param.opts, *param.secondary_opts)
                             if spelling.startswith("--")}

    walk(cli, "")
    return options


def test_every_nvlabs_flag_has_a_row():
    rows = tables()
    assert set(rows) == set(NVLABS_FLAGS)
    for script, flags in NVLABS_FLAGS.items():
        named = [flag for nvlabs, _, _ in rows[script] for span in code_spans(nvlabs) for flag in FLAG.findall(span)]
        assert sorted(set(named)) == sorted(flags), script
        assert len(named) == len(set(named)), f"{script}: a flag with two rows"


def test_every_camrender_option_named_exists():
    """The camrender column names `render`'s options; a note may name another command's (`camrender traj preview
    --overlay`)."""
    options = command_options()
    everywhere = set().union(*options.values())
    missing = []
    for script, rows in tables().items():
        for nvlabs, ours, notes in rows:
            for span in code_spans(ours):
                missing += [(script, nvlabs, flag) for flag in FLAG.findall(span) if flag not in options["render"]]
            for span in code_spans(notes):
                command = re.match(r"camrender ((?:traj )?[a-z-]+)", span)
                known = options[command.group(1)] if command else everywhere
                # NVlabs' own spellings (underscores) may be quoted in a note
                missing += [(script, nvlabs, flag) for flag in FLAG.findall(span)
                            if flag not in known and "_" not in flag]
    assert not missing, f"options named in {PAGE.name} that camrender lacks: {missing}"


def test_the_flag_list_is_nvlabs_argparse():
    """NVLABS_FLAGS against the scripts themselves, where NVlabs' sources are at hand ($SANA_WM_KIT)."""
    if not KIT.is_dir():
        pytest.skip("NVlabs' SANA-WM sources are not here ($SANA_WM_KIT)")
    for script, flags in NVLABS_FLAGS.items():
        tree = ast.parse((KIT / script).read_text())
        declared = [arg.value for node in ast.walk(tree)
                    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"
                    for arg in node.args if isinstance(arg, ast.Constant) and str(arg.value).startswith("--")]
        assert declared == flags, script
