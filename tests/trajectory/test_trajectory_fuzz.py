"""Property tests: random documents and files reach the parsers; nothing but CamrenderError may escape."""
import copy
import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from camrender.errors import CamrenderError
from camrender.trajectory.formats import actions, fileio, nerfstudio, npy, realestate10k
from camrender.trajectory.formats import v1 as v1_format
from camrender.trajectory import presets
from camrender.trajectory.v1 import parse_document

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                            HealthCheck.function_scoped_fixture])

numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 0.5, 1e308, -1e-308, 16, 704, 1280]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=8),
                    st.sampled_from(["opencv", "opengl", "c2w", "w2c", "horizontal", "vertical", "orbit", "spline"]))
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=5),
                               st.dictionaries(st.text(max_size=6), children, max_size=5)),
    max_leaves=30,
)

KEYS = ["version", "width", "height", "fps", "frames", "keyframes", "preset", "convention", "num_frames", "interpolation",
        "prompt", "image", "seed", "c2w", "w2c", "fx", "fy", "cx", "cy", "t", "frame", "position", "look_at", "up",
        "fov", "fov_axis", "name", "axes", "pose", "radius", "degrees", "rotation"]
documents = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=8)


def _only_our_error(function, *args, **kwargs):
    try:
        result = function(*args, **kwargs)
    except CamrenderError as error:
        message = str(error)
        assert message and "\n" not in message
        return None
    return result


def _valid_documents():
    frames = {
        "version": 1, "width": 64, "height": 32, "fps": 4,
        "frames": [{"c2w": np.eye(4).tolist(), "fx": 50, "fy": 50, "cx": 32, "cy": 16} for _ in range(3)],
    }
    keyframes = {
        "version": 1, "width": 64, "height": 32, "fps": 4, "interpolation": {"position": "spline", "rotation": "squad"},
        "keyframes": [
            {"t": 0, "position": [0, 0, 0], "look_at": [0, 0, 1], "fov": 60, "fov_axis": "horizontal"},
            {"frame": 4, "c2w": np.eye(4).tolist(), "fx": 40},
        ],
    }
    preset = {"version": 1, "num_frames": 9, "preset": {"name": "orbit", "radius": 1, "degrees": 30}}
    return [frames, keyframes, preset, presets.make("spiral", num_frames=9)]


def _paths(value, prefix=()):
    """Every (container, key) location inside a JSON value."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield prefix + (key,)
            yield from _paths(child, prefix + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield prefix + (index,)
            yield from _paths(child, prefix + (index,))


@SETTINGS
@given(json_values)
def test_random_json_values(doc):
    _only_our_error(parse_document, doc, "fuzz.json")


@SETTINGS
@given(documents)
def test_random_documents_with_real_keys(doc):
    _only_our_error(parse_document, doc, "fuzz.json")


@SETTINGS
@given(st.sampled_from(range(4)), st.data())
def test_mutated_valid_documents(which, data):
    doc = copy.deepcopy(_valid_documents()[which])
    for _ in range(data.draw(st.integers(1, 3))):
        locations = list(_paths(doc))
        if not locations:
            break
        location = data.draw(st.sampled_from(locations))
        parent = doc
        for step in location[:-1]:
            parent = parent[step]
        key = location[-1]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[key] = data.draw(json_values)
        elif action == "delete":
            del parent[key]
        elif isinstance(parent, dict):
            parent[data.draw(st.sampled_from(KEYS))] = data.draw(json_values)
        else:
            parent.append(data.draw(json_values))
    result = _only_our_error(parse_document, doc, "fuzz.json")
    if result is not None:
        result.validate()
        assert np.isfinite(result.c2w).all() and (result.intrinsics[:, :2] > 0).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(lambda s: s.encode("utf-8")),
                 json_values.map(lambda v: json.dumps(v).encode())))
def test_random_file_contents_for_every_reader(tmp_path_factory, content):
    folder = tmp_path_factory.mktemp("fuzz")
    for reader, name in [(v1_format.read, "a.json"), (nerfstudio.read, "camera_path.json"),
                         (realestate10k.read, "a.txt"), (actions.read, "a.actions"), (npy.read, "a_pose.npy")]:
        path = folder / name
        path.write_bytes(content)
        _only_our_error(reader, path)


@SETTINGS
@given(st.text(alphabet="wasdijklnoeWX-,，0123456789 \n", max_size=40))
def test_random_action_strings(text):
    result = _only_our_error(actions.from_string, text)
    if result is not None:
        assert result.num_frames >= 2


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.one_of(st.floats(-2, 2), st.sampled_from([0.0, 1.0, float("nan"), 1e300])),
                         min_size=17, max_size=21), min_size=1, max_size=4))
def test_random_realestate10k_rows(rows):
    text = "url\n" + "\n".join(" ".join(repr(v) for v in row) for row in rows)
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "c.txt")
        with open(path, "w") as handle:
            handle.write(text)
        _only_our_error(realestate10k.read, path)


def test_json_nan_literal_is_rejected():
    doc = fileio.parse_json('{"version": 1, "width": 4, "height": 4, "fps": NaN, "frames": []}', "n.json")
    try:
        parse_document(doc, "n.json")
    except CamrenderError as error:
        assert error.field == "fps" and "finite" in str(error)
    else:
        raise AssertionError("NaN fps accepted")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 6), max_size=4), st.sampled_from(["<f8", "<f4", ">f8", "<i4", "|b1", "<c16", "|O"]),
       st.binary(max_size=300), st.booleans())
def test_random_npy_files(tmp_path_factory, shape, descr, tail, as_intrinsics):
    """A well-formed .npy header of any shape and dtype followed by random bytes: only CamrenderError."""
    import io

    folder = tmp_path_factory.mktemp("npy")
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": tuple(shape)})
    (folder / "a_pose.npy").write_bytes(buffer.getvalue() + tail)
    if as_intrinsics:
        np.save(folder / "b_pose.npy", np.tile(np.eye(4), (3, 1, 1)))
        _only_our_error(npy.read, folder / "b_pose.npy", intrinsics=folder / "a_pose.npy")
    else:
        _only_our_error(npy.read, folder / "a_pose.npy")
