"""The synthetic proxy scene a path preview looks at (numpy only, no torch): ground, sky and landmarks in
the OpenCV world frame of the trajectory, ray cast per pixel. See `camrender.views.preview` for the
scene's layout and conventions."""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from camrender.errors import CamrenderError
from camrender.limits import MAX_POSITION
from camrender.views.grain import grain, surface_grain

GROUND_Y = 1.5
"""World y of the ground plane for scale 1 (OpenCV +y is down: the ground is 1.5 units below the origin)."""


def _rgb255(r, g, b):
    # colours on a 0..255 scale plus 0.5: blends stay inside, truncation to uint8 rounds
    return np.array([r, g, b], np.float32) * 255.0 + 0.5


_SKY_HORIZON = _rgb255(0.80, 0.86, 0.92)
_SKY_ZENITH = _rgb255(0.25, 0.45, 0.80)
_X_AXIS_LINE = _rgb255(0.80, 0.15, 0.10)
_Z_AXIS_LINE = _rgb255(0.10, 0.25, 0.85)
# the ground is a grey luminance (checker + grid lines) times a warm tint
_GROUND_TINT = np.array([1.0, 0.97, 0.90], np.float32)
_GROUND_LIGHT_L = np.float32(0.64 * 255)
_GROUND_DARK_L = np.float32(0.53 * 255)
_GRID_LINE_L = np.float32(0.30 * 255)
_LIGHT_DIR = np.array([0.4, -0.8, -0.3])  # towards the light (from above, right, behind)
_LIGHT_DIR = _LIGHT_DIR / np.linalg.norm(_LIGHT_DIR)
_FOG_DISTANCE = 60.0  # world units (scale 1) at which ground and landmarks are half faded into the horizon colour
_GRID_SPACING = 1.0
_GRID_WIDTH = 0.03
_AXIS_WIDTH = 0.08
_BAND_ROWS = 32


@dataclass(frozen=True)
class Landmark:
    """One coloured object of the proxy scene (positions in world units at scale 1).

    kind: "sphere" (size = radius) or "box" (size = half extents (x, y, z), axis aligned).
    colour: RGB in [0, 1].
    """

    name: str
    kind: str
    center: tuple[float, float, float]
    size: float | tuple[float, float, float]
    colour: tuple[float, float, float]


LANDMARKS: tuple[Landmark, ...] = (
    Landmark("red sphere (ahead)", "sphere", (0.0, 1.0, 3.0), 0.5, (0.90, 0.12, 0.10)),
    # a thin post under the first view axis, 2 units ahead (the default orbit centre); its top
    # stays 0.25 below eye level so forward moves do not run into the middle of the view
    Landmark("dark post (orbit centre)", "box", (0.0, 0.875, 2.0), (0.03, 0.625, 0.03), (0.20, 0.20, 0.22)),
    Landmark("green box", "box", (3.0, 1.0, 6.0), (0.5, 0.5, 0.5), (0.15, 0.70, 0.20)),
    Landmark("blue sphere", "sphere", (-3.0, 0.9, 6.0), 0.6, (0.15, 0.30, 0.90)),
    Landmark("yellow pillar (far ahead)", "box", (0.0, 0.0, 12.0), (0.3, 1.5, 0.3), (0.95, 0.85, 0.10)),
    Landmark("magenta sphere (right)", "sphere", (5.0, 1.0, 0.0), 0.5, (0.85, 0.15, 0.75)),
    Landmark("cyan sphere (left)", "sphere", (-5.0, 1.0, 0.0), 0.5, (0.10, 0.80, 0.85)),
    Landmark("orange box (behind)", "box", (0.0, 0.9, -5.0), (0.6, 0.6, 0.6), (0.95, 0.50, 0.10)),
    Landmark("white pillar", "box", (-6.0, 0.0, 9.0), (0.25, 1.5, 0.25), (0.92, 0.92, 0.92)),
)


@dataclass(frozen=True)
class _Object:
    kind: str
    center: np.ndarray  # (3,) float64
    size: np.ndarray  # (1,) radius or (3,) half extents
    colour: np.ndarray  # (3,) float32
    corners: np.ndarray  # (8, 3) bounding-box corners, world


class ProxyScene:
    """The synthetic scene, scaled by `scale` (world units per scene unit) about the origin."""

    def __init__(self, scale: float = 1.0, landmarks: tuple[Landmark, ...] = LANDMARKS):
        if not (math.isfinite(scale) and 1 / MAX_POSITION <= scale <= MAX_POSITION):
            raise CamrenderError(f"must be a number from {1 / MAX_POSITION:g} to {MAX_POSITION:g} (the range of camera "
                                 f"positions), got {scale:g}", field="scene-scale")
        self.scale = float(scale)
        self.ground_y = GROUND_Y * self.scale
        self.landmarks = landmarks
        self._objects = [self._object(lm) for lm in landmarks]

    def _object(self, lm: Landmark) -> _Object:
        center = np.asarray(lm.center, np.float64) * self.scale
        if lm.kind == "sphere":
            size = np.array([float(lm.size)]) * self.scale
            half = np.repeat(size, 3)
        elif lm.kind == "box":
            size = np.asarray(lm.size, np.float64) * self.scale
            half = size
        else:
            raise ValueError(f"unknown landmark kind {lm.kind!r}")
        signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], np.float64)
        return _Object(lm.kind, center, size, np.asarray(lm.colour, np.float32), center + signs * half)

    def landmark_center(self, name_prefix: str) -> np.ndarray:
        """World position (3,) of the first landmark whose name starts with `name_prefix`."""
        for lm, obj in zip(self.landmarks, self._objects):
            if lm.name.startswith(name_prefix):
                return obj.center.copy()
        raise KeyError(name_prefix)

    # -- rendering ---------------------------------------------------------------------------

    def render(self, c2w: np.ndarray, intrinsics, width: int, height: int, *,
               executor: ThreadPoolExecutor | None = None) -> np.ndarray:
        """Render one frame.

        c2w: (4, 4) OpenCV camera-to-world; intrinsics: (fx, fy, cx, cy) in pixels of
        width x height. Returns (height, width, 3) uint8 RGB. `executor` spreads bands of
        rows over threads.
        """
        fx, fy, cx, cy = (float(v) for v in intrinsics)
        if not (fx > 0 and fy > 0):
            raise CamrenderError(f"focal lengths must be positive, got fx={fx}, fy={fy}", field="intrinsics")
        c2w = np.asarray(c2w, np.float64)
        rot = c2w[:3, :3]
        cols = (np.arange(width, dtype=np.float64) - cx) / fx
        rows = (np.arange(height, dtype=np.float64) - cy) / fy
        # unnormalised world ray directions d = R @ (x, y, 1) split as column term + row term,
        # so each component of a band costs one broadcast add. The camera-frame z component of
        # d is 1: a ray parameter t is the depth along the optical axis.
        col_terms = (rot[:, 0:1] * cols[None, :]).astype(np.float32)  # (3, W)
        row_terms = (rot[:, 1:2] * rows[None, :] + rot[:, 2:3]).astype(np.float32)  # (3, H)
        frame = _Frame(
            origin=c2w[:3, 3].copy(),
            col_terms=col_terms,
            row_terms=row_terms,
            pixel_angle=0.5 / fx + 0.5 / fy,
            windows=[self._screen_window(obj, c2w, (fx, fy, cx, cy), width, height) for obj in self._objects],
        )
        planes = np.empty((3, height, width), np.float32)  # colour, 0..255 + 0.5
        depth = np.empty((height, width), np.float32)  # ray parameter t of the nearest surface
        image = np.empty((height, width, 3), np.uint8)
        bands = [(r0, min(r0 + _BAND_ROWS, height)) for r0 in range(0, height, _BAND_ROWS)]

        def run(function):
            def guarded(band):  # numpy's error state is per thread: rays at grazing angles overflow harmlessly
                with np.errstate(all="ignore"):
                    function(band)

            if executor is not None:
                list(executor.map(guarded, bands))
            else:
                for band in bands:
                    guarded(band)

        # 1. sky and ground, band by band (cache sized, spread over threads)
        run(lambda band: self._background_band(frame, band, planes, depth))
        # 2. landmarks, each over the pixel window it can cover (one pass per object keeps
        #    the Python overhead per frame small)
        for obj, window in zip(self._objects, frame.windows):
            if window is not None:
                self._object_hits(obj, frame, window, planes, depth)

        # 3. float planes -> interleaved uint8 (truncation rounds: colours carry + 0.5)
        def to_uint8(band):
            r0, r1 = band
            for c in range(3):
                image[r0:r1, :, c] = planes[c, r0:r1]

        run(to_uint8)
        return image

    def _screen_window(self, obj: _Object, c2w, intr, width, height):
        """Pixel rectangle (v0, v1, u0, u1) that can contain the object, or None when it cannot be seen."""
        fx, fy, cx, cy = intr
        if obj.kind == "sphere":
            centre = (obj.center - c2w[:3, 3]) @ c2w[:3, :3]  # camera frame
            spans = [_sphere_span(centre[axis], centre[2], obj.size[0], f, c, size)
                     for axis, f, c, size in ((0, fx, cx, width), (1, fy, cy, height))]
            if spans[0] is None or spans[1] is None:
                return None
            (u_lo, u_hi), (v_lo, v_hi) = spans
        else:
            cam = (obj.corners - c2w[:3, 3]) @ c2w[:3, :3]  # (8, 3) corners in the camera frame
            z = cam[:, 2]
            if np.all(z <= 0):
                return None
            if np.any(z <= 1e-6):  # the box straddles the camera plane: no bounded projection
                return (0, height, 0, width)
            u = fx * cam[:, 0] / z + cx
            v = fy * cam[:, 1] / z + cy
            u_lo, u_hi, v_lo, v_hi = u.min(), u.max(), v.min(), v.max()
        u0, u1 = int(max(0, math.floor(u_lo) - 1)), int(min(width, math.ceil(u_hi) + 2))
        v0, v1 = int(max(0, math.floor(v_lo) - 1)), int(min(height, math.ceil(v_hi) + 2))
        if u0 >= u1 or v0 >= v1:
            return None
        return (v0, v1, u0, u1)

    def _rays(self, frame: "_Frame", rows: slice, cols: slice):
        """World ray directions dx, dy, dz (each (h, w) float32) and their length for a pixel block."""
        ct, rt = frame.col_terms, frame.row_terms
        dx = ct[0, None, cols] + rt[0, rows, None]
        dy = ct[1, None, cols] + rt[1, rows, None]
        dz = ct[2, None, cols] + rt[2, rows, None]
        norm = np.sqrt(dx * dx + dy * dy + dz * dz)
        return dx, dy, dz, norm

    def _background_band(self, frame: "_Frame", band, planes: np.ndarray, depth: np.ndarray) -> None:
        """Sky and ground for rows [r0, r1) into planes[:, r0:r1] and depth[r0:r1]."""
        r0, r1 = band
        dx, dy, dz, norm = self._rays(frame, slice(r0, r1), slice(None))
        down = dy / norm  # sine of the angle below the horizon
        above = self.ground_y - frame.origin[1]  # camera height over the ground (+y is down)

        # sky: pale at the horizon, deeper towards the zenith
        up = np.minimum(down, 0)
        np.sqrt(-up, out=up)

        # the ground plane is seen from above (rays going down) or, with the camera under it,
        # from below; bands without such rays are sky only
        sees_ground = (above > 0 and dy.max() > 0) or (above < 0 and dy.min() < 0)
        if sees_ground:
            depth[r0:r1] = self._ground(frame, above, dx, dy, dz, norm, down, up, planes[:, r0:r1])
        else:
            depth[r0:r1] = np.inf
            for c in range(3):
                np.multiply(up, _SKY_ZENITH[c] - _SKY_HORIZON[c], out=planes[c, r0:r1])
                planes[c, r0:r1] += _SKY_HORIZON[c]

    def _ground(self, frame, above, dx, dy, dz, norm, down, up, out):
        """Ground blended with sky into `out` (3, h, w); returns the ray depth t to the ground
        (huge where a ray misses it). `up` (sky gradient weight) is zeroed under the horizon
        when the camera is below the ground."""
        if above > 0:
            t = np.float32(above) / np.maximum(dy, np.float32(1e-12))
        else:
            t = np.float32(above) / np.minimum(dy, np.float32(-1e-12))
            up *= dy >= 0
        s_inv = np.float32(1.0 / (self.scale * _GRID_SPACING))
        gx = (np.float32(frame.origin[0]) + t * dx) * s_inv  # ground point in grid cells
        gz = (np.float32(frame.origin[2]) + t * dz) * s_inv
        fog = t * norm
        fog *= np.float32(1.0 / (_FOG_DISTANCE * self.scale))
        fog += 1
        np.divide(1, fog, out=fog)  # 1 near the camera, -> 0 far away and for rays missing the ground
        # checker (0 light, 1 dark)
        checker = np.floor(gx) + np.floor(gz)
        checker *= 0.5
        checker -= np.floor(checker)
        # pixel footprint on the ground in grid cells (stretched at grazing angles); the
        # box-filtered line coverage then fades thin far lines instead of aliasing.
        inv_fp = np.sqrt(np.maximum(np.abs(down), np.float32(0.02)))
        inv_fp /= t
        inv_fp *= np.float32(1.0 / (frame.pixel_angle * s_inv))
        dist = np.minimum(np.abs(gx - np.rint(gx)), np.abs(gz - np.rint(gz)))
        grid = _cover(dist, _GRID_WIDTH * 0.5, inv_fp)
        lum = _GROUND_LIGHT_L + checker * np.float32(_GROUND_DARK_L - _GROUND_LIGHT_L)
        lum *= grain(gx, gz, inv_fp)  # blotches for feature detectors (camrender.views.grain)
        lum += grid * (np.float32(_GRID_LINE_L) - lum)
        # axis lines (world x axis at z = 0, z axis at x = 0), blended only in bands that show them
        axis_half = _AXIS_WIDTH * 0.5 * self.scale * s_inv
        cover_x_axis = _cover(np.abs(gz), axis_half, inv_fp)
        cover_z_axis = _cover(np.abs(gx), axis_half, inv_fp)
        has_x_axis, has_z_axis = cover_x_axis.any(), cover_z_axis.any()
        has_sky = up.any()  # False in bands below the horizon
        for c in range(3):
            g = lum * _GROUND_TINT[c]
            if has_x_axis:
                g += cover_x_axis * (_X_AXIS_LINE[c] - g)
            if has_z_axis:
                g += cover_z_axis * (_Z_AXIS_LINE[c] - g)
            g -= _SKY_HORIZON[c]
            g *= fog
            if has_sky:
                g += up * (_SKY_ZENITH[c] - _SKY_HORIZON[c])
            np.add(g, _SKY_HORIZON[c], out=out[c])
        return t

    def _object_hits(self, obj: _Object, frame: "_Frame", window, all_planes, all_depth):
        """Shade the object into `all_planes` (3, H, W) inside `window` where it is nearer than
        `all_depth` (H, W), which is updated."""
        v0, v1, u0, u1 = window
        dx, dy, dz, norm = self._rays(frame, slice(v0, v1), slice(u0, u1))
        planes = all_planes[:, v0:v1, u0:u1]
        depth = all_depth[v0:v1, u0:u1]
        ox, oy, oz = (frame.origin - obj.center).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if obj.kind == "sphere":
                r = np.float32(obj.size[0])
                a = norm * norm
                b = dx * ox + dy * oy + dz * oz
                c = np.float32(ox * ox + oy * oy + oz * oz - r * r)
                disc = b * b - a * c
                hit = disc >= 0
                if not hit.any():
                    return
                t = (-b - np.sqrt(np.maximum(disc, 0))) / a
                hit &= (t > 0) & (t < depth)
                if not hit.any():
                    return
                nx = (ox + t * dx) / r
                ny = (oy + t * dy) / r
                nz = (oz + t * dz) / r
            else:
                tnear = np.full(dx.shape, -np.inf, np.float32)
                tfar = np.full(dx.shape, np.inf, np.float32)
                face = np.zeros(dx.shape, np.int8)
                for axis, (o, d, h) in enumerate(zip((ox, oy, oz), (dx, dy, dz), obj.size.astype(np.float32))):
                    t1 = (-h - o) / d
                    t2 = (h - o) / d
                    lo = np.minimum(t1, t2)
                    hi = np.maximum(t1, t2)
                    parallel = d == 0  # ray inside the slab: unbounded; outside: miss
                    if parallel.any():
                        inside = abs(o) <= h
                        lo[parallel] = -np.inf if inside else np.inf
                        hi[parallel] = np.inf if inside else -np.inf
                    face[lo > tnear] = axis
                    np.maximum(tnear, lo, out=tnear)
                    np.minimum(tfar, hi, out=tfar)
                t = tnear
                hit = (tfar >= tnear) & (tnear > 0) & (t < depth)
                if not hit.any():
                    return
                nx = np.where(face == 0, -np.sign(dx), 0).astype(np.float32)
                ny = np.where(face == 1, -np.sign(dy), 0).astype(np.float32)
                nz = np.where(face == 2, -np.sign(dz), 0).astype(np.float32)
        lx, ly, lz = _LIGHT_DIR.astype(np.float32)
        shade = np.float32(0.45) + np.float32(0.55) * np.maximum(nx * lx + ny * ly + nz * lz, 0)
        s_inv, distance = np.float32(1.0 / self.scale), t * norm
        with np.errstate(invalid="ignore", over="ignore"):  # pixels the object misses hold t = +-inf: masked below
            shade *= surface_grain((ox + t * dx) * s_inv, (oy + t * dy) * s_inv, (oz + t * dz) * s_inv, (nx, ny, nz),
                                   np.float32(self.scale / frame.pixel_angle) / distance)
        fog = 1 / (1 + distance * np.float32(1.0 / (_FOG_DISTANCE * self.scale)))
        for c in range(3):
            value = _SKY_HORIZON[c] + fog * (np.minimum(obj.colour[c] * 255.0 * shade, 255.0) + 0.5 - _SKY_HORIZON[c])
            np.copyto(planes[c], value, where=hit)
        np.copyto(depth, t, where=hit)


@dataclass
class _Frame:
    origin: np.ndarray  # (3,) float64 camera centre, world
    col_terms: np.ndarray  # (3, W) float32: R[:, 0] * (u - cx) / fx
    row_terms: np.ndarray  # (3, H) float32: R[:, 1] * (v - cy) / fy + R[:, 2]
    pixel_angle: float  # radians per pixel at the image centre (mean of 1/fx, 1/fy)
    windows: list  # per object: (v0, v1, u0, u1) or None


def _sphere_span(a: float, z: float, radius: float, focal: float, centre: float, size: int):
    """Pixel range (lo, hi) along one image axis covered by a sphere whose centre is at (a, z)
    in the plane of that camera axis and the optical axis, or None when it is out of view.

    The planes through the camera centre that contain the other image axis and touch the
    sphere make angles atan2(a, z) +- asin(r / hypot(a, z)) with the optical axis.
    """
    distance = math.hypot(a, z)
    if distance <= radius * 1.000001:  # camera inside (or on) the sphere's cylinder of view
        return (-1.0, size + 1.0) if z + radius > 0 else None
    middle, half = math.atan2(a, z), math.asin(radius / distance)
    lo, hi = middle - half, middle + half
    limit = math.pi / 2 - 1e-6
    if hi <= -limit or lo >= limit:
        return None  # entirely behind the camera plane on this axis
    lo, hi = max(lo, -limit), min(hi, limit)
    return centre + focal * math.tan(lo), centre + focal * math.tan(hi)


def _cover(dist, half_width, inv_footprint):
    """Fraction of a pixel covered by a line of half width `half_width` at distance `dist`
    (same units); a box filter of width 1 / inv_footprint. Returns float32 in [0, 1]."""
    cover = np.float32(half_width) * inv_footprint
    cap = np.minimum(cover + cover, np.float32(1))  # a line thinner than a pixel covers 2w/fp at most
    cover += np.float32(0.5)
    cover -= dist * inv_footprint
    np.maximum(cover, 0, out=cover)
    np.minimum(cover, cap, out=cover)
    return cover


# -- whole paths -------------------------------------------------------------------------------
