"""Numpy renderers for the synthetic "industrial" scenes: one image and one clip per sample.

Every random draw comes from the generator passed in, so a sample is a pure function of its
seed. The label's two factors are rendered independently: ``moving`` only touches the image
and ``transient`` only touches the audio, which is what makes the label need both modalities.
Their random parameters are drawn whether or not they are used, so the rest of a sample (its
scene, its machine noise) never depends on the label.

Speed matters (thousands of samples before the first step), hence: float32 throughout (a
stray float64 scalar doubles the cost of every op it touches, so scalars are Python floats),
separable maths on 1-D coordinates, shapes evaluated on their bounding box only, cached grids.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

__all__ = ["EVENT_TYPES", "Event", "render_audio", "render_image"]

EVENT_TYPES = ("knock", "friction", "collision")
"""The transient kinds, as written in ``events.tsv``."""

_F32 = np.float32
_TAU = 2 * math.pi


class Event(NamedTuple):
    """One transient in a clip: its label and its extent in seconds."""

    label: str
    onset: float
    offset: float


@functools.lru_cache(maxsize=8)
def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates as a row ``[1, size]`` and a column ``[size, 1]``."""
    axis = np.arange(size, dtype=_F32) + _F32(0.5)
    return axis[None, :], axis[:, None]


@functools.lru_cache(maxsize=16)
def _smooth_basis(size: int, knots: int) -> np.ndarray:
    """``[size, knots]`` Gaussian interpolation weights: ``B @ G @ B.T`` turns a knot grid into smooth texture."""
    centres = (np.arange(knots) + 0.5) * size / knots
    weights = np.exp(-0.5 * ((np.arange(size)[:, None] + 0.5 - centres) / (size / knots)) ** 2)
    return (weights / weights.sum(axis=1, keepdims=True)).astype(_F32)


def _coverage(signed_distance: np.ndarray) -> np.ndarray:
    """One-pixel anti-aliased coverage from a signed distance (positive inside, in pixels)."""
    return np.clip(signed_distance + _F32(0.5), 0.0, 1.0)


def _window(size: int, xs: tuple[float, ...], ys: tuple[float, ...], pad: float) -> tuple[slice, slice]:
    """Rows and columns a shape spanning these coordinates (plus ``pad``) can touch.

    Shapes are small, so evaluating them on this window instead of the whole frame makes each
    numpy op several times cheaper.
    """
    cols = slice(max(int(min(xs) - pad) - 1, 0), max(min(int(max(xs) + pad) + 2, size), 0))
    rows = slice(max(int(min(ys) - pad) - 1, 0), max(min(int(max(ys) + pad) + 2, size), 0))
    return rows, cols


def _disc(size: int, cx: float, cy: float, radius: float, ox: float = 0.0, oy: float = 0.0) -> np.ndarray:
    """Coverage ``[H, W]`` of a disc swept from ``(cx, cy)`` by ``(ox, oy)`` (a barrel, or a barrel's shadow)."""
    rows, cols = _window(size, (cx, cx + ox), (cy, cy + oy), radius)
    xs, ys = _grid(size)
    px, py = xs[:, cols] - cx, ys[rows] - cy
    t = np.clip((px * ox + py * oy) * (1.0 / max(ox * ox + oy * oy, 1e-6)), 0.0, 1.0)
    out = np.zeros((size, size), dtype=_F32)
    out[rows, cols] = _coverage(radius - np.sqrt((px - t * ox) ** 2 + (py - t * oy) ** 2))
    return out


def _convex(size: int, points: list[tuple[float, float]]) -> np.ndarray:
    """Coverage ``[H, W]`` of the convex hull of ``points`` (a crate, or a crate swept along its shadow)."""
    hull = _hull(points)
    rows, cols = _window(size, tuple(x for x, _ in hull), tuple(y for _, y in hull), 0.0)
    xs, ys = _grid(size)
    a = np.array(hull, dtype=_F32)
    edge = np.roll(a, -1, axis=0) - a
    normal = np.stack([edge[:, 1], -edge[:, 0]], axis=1) / np.hypot(edge[:, :1], edge[:, 1:])  # outward (CCW hull)
    offset = np.sum(normal * a, axis=1)
    # Signed distance to each edge's line, all edges at once: [E, rows, cols]; outside = the largest.
    dist = normal[:, 0, None, None] * xs[:, cols] + (normal[:, 1, None, None] * ys[rows] - offset[:, None, None])
    out = np.zeros((size, size), dtype=_F32)
    out[rows, cols] = _coverage(-dist.max(axis=0))
    return out


Point = tuple[float, float]


def _cross(o: Point, a: Point, b: Point) -> float:
    """z of (a - o) x (b - o): positive when o, a, b turn counter-clockwise."""
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def _hull(points: list[Point]) -> list[Point]:
    """Counter-clockwise convex hull (Andrew's monotone chain); a handful of points, so plain Python."""
    pts = sorted(points)

    def half(seq: list[Point]) -> list[Point]:
        out: list[Point] = []
        for p in seq:
            while len(out) >= 2 and _cross(out[-2], out[-1], p) <= 0:
                out.pop()
            out.append(p)
        return out[:-1]

    return half(pts) + half(pts[::-1])


def _to_segment(p: Point, a: Point, b: Point) -> float:
    """Distance from point ``p`` to segment ``a-b``."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    t = min(1.0, max(0.0, ((p[0] - a[0]) * dx + (p[1] - a[1]) * dy) / max(dx * dx + dy * dy, 1e-12)))
    return math.hypot(p[0] - a[0] - t * dx, p[1] - a[1] - t * dy)


def _clearance(p0: Point, p1: Point, q0: Point, q1: Point) -> float:
    """Distance between segments ``p0-p1`` and ``q0-q1`` (0 when they cross)."""
    if _cross(p0, p1, q0) * _cross(p0, p1, q1) < 0 and _cross(q0, q1, p0) * _cross(q0, q1, p1) < 0:
        return 0.0
    return min(_to_segment(p0, q0, q1), _to_segment(p1, q0, q1), _to_segment(q0, p0, p1), _to_segment(q1, p0, p1))


class _Streak(NamedTuple):
    """A moving elliptical shadow: semi-axes, orientation, start point and travel during the exposure (pixels)."""

    a: float
    b: float
    theta: float
    sx: float
    sy: float
    vx: float
    vy: float


def _draw_streak(rng: np.random.Generator, size: int) -> _Streak:
    """Parameters of a shadow crossing the middle of the frame (a person walking under the lamp)."""
    a, b = rng.uniform(0.07, 0.12) * size, rng.uniform(0.04, 0.07) * size
    theta, phi = rng.uniform(0, math.pi), rng.uniform(0, _TAU)
    # Extent of the ellipse along the motion; travelling 1-1.8x that leaves a soft streak.
    extent = 2 * math.hypot(a * math.cos(phi - theta), b * math.sin(phi - theta))
    travel = extent * rng.uniform(1.0, 1.8)
    vx, vy = travel * math.cos(phi), travel * math.sin(phi)
    return _Streak(a, b, theta, rng.uniform(0.3, 0.7) * size - vx / 2, rng.uniform(0.3, 0.7) * size - vy / 2, vx, vy)


def _streak_coverage(size: int, streak: _Streak) -> np.ndarray:
    """Exposure-weighted coverage ``[H, W]`` of the moving ellipse: the motion-blurred shadow.

    A pixel's coverage is the fraction of the exposure it spends inside the ellipse, solved in
    closed form (a quadratic in time), so the motion blur is exact rather than sampled.
    """
    a, b, theta, sx, sy, vx, vy = streak
    rows, cols = _window(size, (sx, sx + vx), (sy, sy + vy), max(a, b))
    xs, ys = _grid(size)
    c, s = math.cos(theta), math.sin(theta)
    px, py = xs[:, cols] - sx, ys[rows] - sy
    wx, wy = (c / a) * px + (s / a) * py, (-s / b) * px + (c / b) * py
    dx, dy = (c * vx + s * vy) / a, (-s * vx + c * vy) / b
    qa = dx * dx + dy * dy
    qb = (dx / qa) * wx + (dy / qa) * wy
    root = np.sqrt(np.maximum(qb * qb - (wx * wx + wy * wy - 1.0) * (1.0 / qa), 0.0))
    out = np.zeros((size, size), dtype=_F32)
    out[rows, cols] = np.clip(qb + root, 0.0, 1.0) - np.clip(qb - root, 0.0, 1.0)
    return out


def _floor(rng: np.random.Generator, size: int) -> np.ndarray:
    """Floor albedo ``[3, H, W]``: a tinted base, smooth stains, fine grain, maybe a painted lane line."""
    base = rng.uniform(0.45, 0.8) * (1 + rng.uniform(-0.08, 0.08, size=3))
    coarse, fine = _smooth_basis(size, 4), _smooth_basis(size, 16)
    stains = coarse @ rng.standard_normal((4, 4), dtype=_F32) @ coarse.T
    grain = fine @ rng.standard_normal((16, 16), dtype=_F32) @ fine.T
    texture = 1 + rng.uniform(0.03, 0.08) * stains + rng.uniform(0.01, 0.03) * grain
    albedo = base.astype(_F32)[:, None, None] * texture
    angle, px, py = rng.uniform(0, math.pi), rng.uniform(0.2, 0.8) * size, rng.uniform(0.2, 0.8) * size
    width, yellow = rng.uniform(1.0, 2.5), rng.random() < 0.5
    if rng.random() < 0.5:  # a sharp-edged lane marking: a strong edge that is not a shadow
        xs, ys = _grid(size)
        paint = _coverage(width - np.abs(math.cos(angle) * (xs - px) + math.sin(angle) * (ys - py)))
        colour = np.array([0.85, 0.75, 0.15] if yellow else [0.85, 0.85, 0.85], dtype=_F32)[:, None, None]
        albedo += paint * (colour - albedo)
    return albedo


Lamp = tuple[float, float, float]


def _light(rng: np.random.Generator, size: int) -> tuple[Lamp, np.ndarray, np.ndarray, np.ndarray]:
    """A point lamp: ``(x, y, height)`` in pixels, direct irradiance ``[H, W]``, RGB colours ``[3, 1, 1]``."""
    xs, ys = _grid(size)
    lamp = (rng.uniform(-0.2, 1.2) * size, rng.uniform(-0.2, 1.2) * size, rng.uniform(0.9, 1.4) * size)
    irradiance = lamp[2] ** 2 / ((xs - lamp[0]) ** 2 + ((ys - lamp[1]) ** 2 + lamp[2] ** 2))
    warmth = rng.uniform(-0.15, 0.15)
    direct = rng.uniform(0.7, 1.0) * np.array([1 + warmth, 1.0, 1 - warmth], dtype=_F32)[:, None, None]
    ambient = rng.uniform(0.08, 0.2) * np.array([0.9, 0.95, 1.1], dtype=_F32)[:, None, None]  # bluish fill
    return lamp, irradiance, direct, ambient


def _occluders(
    rng: np.random.Generator, size: int, lamp: Lamp, streak: _Streak
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """0-3 fixed objects (barrels and crates): ``(cast shadow coverage, body coverage, colour)`` each.

    Objects and their shadows keep clear of the streak's path, in every sample whether or not
    the streak is drawn: a moving shadow hidden inside a static one would make the label
    unknowable, and avoiding the path only when it is drawn would leak the label.
    """
    path = ((streak.sx, streak.sy), (streak.sx + streak.vx, streak.sy + streak.vy))
    objects = []
    for _ in range(rng.choice(4, p=[0.25, 0.3, 0.3, 0.15])):
        for _attempt in range(8):
            cx, cy = rng.uniform(0.1, 0.9) * size, rng.uniform(0.1, 0.9) * size
            radius, height = rng.uniform(0.04, 0.09) * size, rng.uniform(0.15, 0.5) * lamp[2]
            # A point light throws the top of an object of height z away from the lamp by z / (h - z).
            ox, oy = (cx - lamp[0]) * height / (lamp[2] - height), (cy - lamp[1]) * height / (lamp[2] - height)
            shrink = min(1.0, 0.6 * size / max(math.hypot(ox, oy), 1e-6))
            ox, oy = ox * shrink, oy * shrink
            reach = 1.42 * radius + max(streak.a, streak.b) + 2  # 1.42: a crate's corner
            if _clearance((cx, cy), (cx + ox, cy + oy), *path) > reach:
                objects.append(_occluder(rng, size, cx, cy, radius, ox, oy))
                break
    return objects


def _occluder(
    rng: np.random.Generator, size: int, cx: float, cy: float, radius: float, ox: float, oy: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A barrel (disc) or a crate (rotated square) at ``(cx, cy)`` with its shadow thrown by ``(ox, oy)``."""
    angle, barrel = rng.uniform(0, math.pi / 2), rng.random() < 0.5
    colour = rng.uniform(0.15, 0.9, size=3).astype(_F32)[:, None, None]
    if barrel:
        return _disc(size, cx, cy, radius, ox, oy), _disc(size, cx, cy, radius), colour
    c, s = radius * math.cos(angle), radius * math.sin(angle)
    box = [(cx + c - s, cy + s + c), (cx - c - s, cy - s + c), (cx - c + s, cy - s - c), (cx + c + s, cy + s - c)]
    return _convex(size, box + [(x + ox, y + oy) for x, y in box]), _convex(size, box), colour


def render_image(rng: np.random.Generator, size: int, moving: bool) -> tuple[np.ndarray, np.ndarray]:
    """One scene: ``(rgb uint8 [H, W, 3], shadow mask uint8 [H, W])``.

    Args:
        rng: The sample's generator.
        size: Image side in pixels.
        moving: Whether a motion-blurred shadow crosses the scene.

    Returns:
        The image, and the exact shadow mask: the fraction of the exposure during which direct
        light is blocked, times 255. Fixed objects' shadows are 255; a moving shadow blocks a
        pixel for part of the exposure only, so its values are partial.

    Example:
        >>> image, mask = render_image(np.random.default_rng(0), 32, moving=True)
        >>> image.shape, image.dtype, mask.shape
        ((32, 32, 3), dtype('uint8'), (32, 32))
    """
    albedo = _floor(rng, size)
    lamp, irradiance, direct, ambient = _light(rng, size)
    streak = _draw_streak(rng, size)  # drawn for every sample: the rest of the scene never depends on the label
    objects = _occluders(rng, size, lamp, streak)
    exposure, glow_radius = rng.uniform(0.75, 0.95), rng.uniform(0.03, 0.05) * size
    shadow = _streak_coverage(size, streak) if moving else np.zeros((size, size), dtype=_F32)
    for cast, _, _ in objects:
        shadow = np.maximum(shadow, cast)
    # Channel-first throughout: numpy broadcasts a [3, 1, 1] colour fast, a trailing [..., 3] slowly.
    rgb = albedo * (ambient + direct * (irradiance * (1 - shadow)))
    for _, body, colour in objects:  # object tops are lit and hide the floor (and the shadow on it) below them
        rgb += body * (colour * (ambient + direct * irradiance) - rgb)
        shadow = shadow * (1 - body)
    rgb *= exposure / max(float(rgb.max()), 1e-3)
    # The lamp itself, when it hangs inside the frame and not over the streak's path (it would hide the streak).
    path = ((streak.sx, streak.sy), (streak.sx + streak.vx, streak.sy + streak.vy))
    if 0 <= lamp[0] < size and 0 <= lamp[1] < size and _clearance(lamp[:2], lamp[:2], *path) > glow_radius + streak.a:
        rgb += _disc(size, lamp[0], lamp[1], glow_radius) * (1 - rgb)
    image = (np.clip(rgb, 0.0, 1.0) * 255 + 0.5).astype(np.uint8).transpose(1, 2, 0)
    return np.ascontiguousarray(image), (shadow * 255 + 0.5).astype(np.uint8)


@functools.lru_cache(maxsize=8)
def _audio_axes(sample_rate: int, num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Cached ``(time in s [n], log frequency of each rFFT bin, floored at 20 Hz)``, both float32."""
    time = np.arange(num_samples, dtype=_F32) / _F32(sample_rate)
    freqs = np.fft.rfftfreq(num_samples, 1 / sample_rate)
    return time, np.log(np.maximum(freqs, 20.0)).astype(_F32)


def _machine(rng: np.random.Generator, sample_rate: int, num_samples: int) -> np.ndarray:
    """Stationary machine noise of unit RMS: hum (random fundamental + harmonics), maybe a whine, coloured noise.

    Everything is built in the frequency domain and summed before one inverse FFT: the
    cheapest way to get a dozen partials plus noise of any colour.
    """
    time, log_freq = _audio_axes(sample_rate, num_samples)
    bins = len(log_freq)
    noise = (rng.random(2 * bins, dtype=_F32) - _F32(0.5)).view(np.complex64)
    noise *= np.exp(log_freq * _F32(-rng.uniform(0, 1.5) / 2))  # 0 = white ... 1.5 = between pink and brown
    harmonic = np.arange(1, 11)
    f0, tilt, whine = rng.uniform(45, 180), rng.uniform(0.5, 1.5), rng.uniform(2000, 6000)
    freqs = np.append(harmonic * f0, whine)
    amps = np.append(rng.uniform(0.2, 1.0, size=10) * harmonic**-tilt, rng.uniform(0.1, 0.3) * (rng.random() < 0.5))
    phases = rng.uniform(0, _TAU, size=11)
    k = np.rint(freqs * (num_samples / sample_rate)).astype(int)
    keep = k < bins
    hum = np.zeros(bins, dtype=np.complex64)
    np.add.at(hum, k[keep], (amps * np.exp(1j * phases))[keep])  # add.at: the whine may share a harmonic's bin
    # Parseval: the RMS of irfft(X) is sqrt(2 sum |X|^2) / n, so the mix is set before the transform.
    hum *= _F32(1 / math.sqrt(max(2 * float(np.vdot(hum, hum).real), 1e-12)))
    noise *= _F32(rng.uniform(0.2, 0.8) / math.sqrt(2 * float(np.vdot(noise, noise).real)))
    wave = np.fft.irfft(hum + noise, num_samples)
    depth, rate, phase = rng.uniform(0, 0.15), rng.uniform(0.5, 4), rng.uniform(0, _TAU)
    wave *= 1 + depth * np.sin(time * _F32(_TAU * rate) + _F32(phase))  # slow load swings, not transients
    return wave * _F32(math.sqrt(num_samples / float(np.dot(wave, wave))))


def _knock(rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """A decaying resonant burst: a struck panel ringing at 0.4-2.5 kHz, with one inharmonic partial."""
    freq, tau = rng.uniform(400, 2500), rng.uniform(0.015, 0.05)
    t = np.arange(int(4.6 * tau * sample_rate), dtype=_F32) / _F32(sample_rate)  # 4.6 tau: the -40 dB point
    env = np.exp(t * _F32(-1 / tau))
    ring = np.sin(t * _F32(_TAU * freq)) + _F32(0.5) * env * np.sin(t * _F32(_TAU * 2.76 * freq))
    return env * np.minimum(1.0, t * _F32(1000)) * ring


def _friction(rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """A band-passed noise burst of 0.1-0.3 s with stick-slip flutter: something scraping."""
    n = int(rng.uniform(0.1, 0.3) * sample_rate)
    centre, width, flutter = rng.uniform(800, 4000), rng.uniform(0.3, 0.8), rng.uniform(15, 40)
    # Band-limited noise straight from random spectrum bins; a power-of-two size, as an odd FFT can be 10x slower.
    fft_size = 1 << (n - 1).bit_length()
    low, high = (round(f * fft_size / sample_rate) for f in (centre * (1 - width / 2), centre * (1 + width / 2)))
    spec = np.zeros(fft_size // 2 + 1, dtype=np.complex64)
    spec[low:high] = (rng.random(2 * (high - low), dtype=_F32) - _F32(0.5)).view(np.complex64)
    t = np.arange(n, dtype=_F32) / _F32(sample_rate)
    edges = np.minimum(1.0, np.minimum(t, t[-1] - t) * _F32(1 / 0.015))
    return np.fft.irfft(spec, fft_size)[:n] * edges * (1 + _F32(0.5) * np.sin(t * _F32(_TAU * flutter)))


def _collision(rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """A broadband impact: a fast-decaying noise crack over a low thump, then one smaller bounce."""
    tau, bounce, thump = rng.uniform(0.01, 0.04), int(rng.uniform(0.05, 0.12) * sample_rate), rng.uniform(60, 150)
    n = int(4.6 * tau * sample_rate)
    t = np.arange(n, dtype=_F32) / _F32(sample_rate)
    hit = rng.standard_normal(n, dtype=_F32) * np.exp(t * _F32(-1 / tau))
    hit += 2 * np.sin(t * _F32(_TAU * thump)) * np.exp(t * _F32(-1 / (3 * tau)))
    wave = np.zeros(bounce + n, dtype=_F32)
    wave[:n] += hit
    wave[bounce:] += _F32(0.4) * hit
    return wave


_TRANSIENTS = {"knock": _knock, "friction": _friction, "collision": _collision}


def render_audio(
    rng: np.random.Generator, sample_rate: int, num_samples: int, transient: bool
) -> tuple[np.ndarray, Event | None]:
    """One clip: ``(waveform float32 [num_samples] within [-1, 1], the transient or None)``.

    Args:
        rng: The sample's generator.
        sample_rate: Samples per second.
        num_samples: Clip length in samples.
        transient: Whether a knock, friction or collision sound happens in the clip.

    Returns:
        The waveform and, when ``transient``, the event with its onset and offset in seconds.

    Example:
        >>> wave, event = render_audio(np.random.default_rng(0), 16000, 16000, transient=True)
        >>> wave.shape, wave.dtype, event.label in EVENT_TYPES
        ((16000,), dtype('float32'), True)
    """
    wave = _machine(rng, sample_rate, num_samples)
    label = EVENT_TYPES[int(rng.integers(len(EVENT_TYPES)))]
    burst = _TRANSIENTS[label](rng, sample_rate)
    onset = rng.uniform(0.1, max(0.1, num_samples / sample_rate - 0.4))
    snr_db, peak = rng.uniform(6, 16), rng.uniform(0.3, 0.9)
    event = None
    if transient:
        # Level set on the loudest 16 ms of the burst, relative to the unit-RMS background.
        frames = burst[: max(len(burst) // 256, 1) * 256].reshape(-1, min(256, len(burst)))
        burst *= _F32(10 ** (snr_db / 20) / math.sqrt(float(np.max(np.mean(frames * frames, axis=1)))))
        start = round(onset * sample_rate)
        end = min(start + len(burst), num_samples)
        wave[start:end] += burst[: end - start]
        event = Event(label, round(start / sample_rate, 3), round(end / sample_rate, 3))
    wave *= _F32(peak / float(np.max(np.abs(wave))))
    return wave, event


def _burst_axes(
    rng: np.random.Generator,
    rate: int,
    num_samples: int,
    lengths: tuple[float, float],
    latest: float,
    snr_db: tuple[float, float],
) -> tuple[np.ndarray, float, float, float, float, np.ndarray]:
    """The hum and the draws of a task sound before its waveform: ``(wave, length, onset, snr_db, peak, t)``.

    The sound lasts a uniform draw from ``lengths`` seconds (``t``, its time axis) and starts between 0.1 s
    and ``latest`` s before the clip's end; every draw happens whatever the sound is. Then `_mix` places it.
    The binding, redundant and shared tasks' sounds.

    Example:
        >>> wave, length, onset, snr, peak, t = _burst_axes(np.random.default_rng(0), 16000, 16000, (0.2, 0.3), 0.35,
        ...                                                 (15, 25))
        >>> wave.shape, len(t) == int(length * 16000), 0.1 <= onset <= 0.65, 15 <= snr <= 25
        ((16000,), True, True, True)
    """
    wave = _machine(rng, rate, num_samples)
    length, onset = rng.uniform(*lengths), rng.uniform(0.1, max(0.1, num_samples / rate - latest))
    level, peak = rng.uniform(*snr_db), rng.uniform(0.3, 0.9)
    t = np.arange(int(length * rate), dtype=np.float32) / _F32(rate)
    return wave, length, onset, level, peak, t


def _mix(wave: np.ndarray, burst: np.ndarray, onset: float, snr_db: float, peak: float, rate: int) -> tuple[int, int]:
    """Add ``burst`` to ``wave`` at ``onset`` s, ``snr_db`` above the unit-RMS hum on its loudest 16 ms, then
    scale the clip to ``peak``; in place. Returns the burst's first and end sample (cut at the clip's end).

    The binding, redundant and shared tasks' sounds (the default task's transients keep their own level rule).

    Example:
        >>> wave = np.ones(1000, dtype=np.float32)
        >>> _mix(wave, np.ones(300, dtype=np.float32), 0.05, 0.0, 0.5, 1000), float(wave.max())
        ((50, 350), 0.5)
    """
    frames = burst[: len(burst) // 256 * 256].reshape(-1, 256)
    burst = burst * _F32(10 ** (snr_db / 20) / math.sqrt(max(float(np.max(np.mean(frames * frames, axis=1))), 1e-12)))
    start = round(onset * rate)
    end = min(start + len(burst), len(wave))
    wave[start:end] += burst[: end - start]
    wave *= _F32(peak / float(np.max(np.abs(wave))))
    return start, end
