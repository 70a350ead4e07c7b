"""Renderers of the synthetic generator's ``task="binding"``: a grille's slat angle (image) and a beep or hiss (audio).

The label is whether the two agree (see `sss.data.synthetic`); these only draw one sample's image or clip.
"""

from __future__ import annotations

import math

import numpy as np

from sss.data import _render
from sss.data._render import Event

__all__ = ["BINDING_SHADOWS", "BINDING_SOUNDS", "binding_audio", "binding_image"]

BINDING_SHADOWS = ("slats_0", "slats_90")
"""The binding task's image factor: the slat angle of the grille's shadow (degrees)."""

BINDING_SOUNDS = ("beep", "hiss")
"""The binding task's audio factor, in partner order: ``BINDING_SOUNDS[k]`` matches ``BINDING_SHADOWS[k]``."""


def binding_image(rng: np.random.Generator, size: int, shadow: int) -> tuple[np.ndarray, np.ndarray]:
    """A floor under a lamp and a grille's shadow: a disc of slats at ``90 * shadow`` degrees (+-9), sharp-edged.

    No fixed objects: their solid shadows would only dilute the one cue. The disc (radius 0.35 of the
    side) and the slat pitch (6-8 px at 64 px) are large so that an untrained CNN's pooled features
    already tell the angles apart (97-99% by a linear probe; 69% with a 0.25 disc and 4-6 px slats,
    which left most runs on the chance plateau). Every draw happens whatever ``shadow`` is, so only
    the slat angle depends on it. Returns ``(rgb uint8 [H, W, 3], mask uint8 [H, W])``.

    Example:
        >>> image, mask = binding_image(np.random.default_rng(0), 64, shadow=1)
        >>> image.shape, mask.dtype, bool(0.15 < (mask > 127).mean() < 0.25)  # slats: half of a 0.35-radius disc
        ((64, 64, 3), dtype('uint8'), True)
    """
    albedo = _render._floor(rng, size)
    _, irradiance, direct, ambient = _render._light(rng, size)
    cx, cy, radius = rng.uniform(0.35, 0.65) * size, rng.uniform(0.35, 0.65) * size, 0.35 * size
    angle = shadow * math.pi / 2 + rng.uniform(-0.15, 0.15)
    period, exposure = rng.uniform(3 / 32, 1 / 8) * size, rng.uniform(0.75, 0.95)
    xs, ys = _render._grid(size)
    across = math.cos(angle) * (xs - cx) + math.sin(angle) * (ys - cy)  # distance across the slats
    to_slat = np.abs((across / period) % 1.0 - 0.5) * period
    disc = _render._coverage(radius - np.sqrt((xs - cx) ** 2 + (ys - cy) ** 2))
    cover = disc * _render._coverage(period / 4 - to_slat)  # slats half the pitch wide
    rgb = albedo * (ambient + direct * (irradiance * (1 - cover)))
    rgb *= exposure / max(float(rgb.max()), 1e-3)
    image = (np.clip(rgb, 0.0, 1.0) * 255 + 0.5).astype(np.uint8).transpose(1, 2, 0)
    return np.ascontiguousarray(image), (cover * 255 + 0.5).astype(np.uint8)


def binding_audio(rng: np.random.Generator, rate: int, num_samples: int, sound: int) -> tuple[np.ndarray, Event]:
    """Machine hum plus one 0.2-0.35 s signal 15-25 dB above it: ``BINDING_SOUNDS[sound]``.

    A beep is a 0.5-2.5 kHz tone, a hiss white noise: one lit mel band against all of them, which a
    small log-mel CNN tells apart even untrained (99% by a linear probe on its pooled features; the
    default task's knock, friction and collision reach 66-78%). Everything but the signal's own
    waveform is drawn first, so the hum, onset and level never depend on ``sound``.

    Example:
        >>> wave, event = binding_audio(np.random.default_rng(0), 16000, 16000, sound=1)
        >>> wave.shape, event.label, 0.1 <= event.onset < event.offset <= 1.0
        ((16000,), 'hiss', True)
    """
    wave, _, onset, snr_db, peak, t = _render._burst_axes(rng, rate, num_samples, (0.2, 0.35), 0.4, (15, 25))
    n = len(t)
    edges = np.minimum(1.0, np.minimum(t, t[-1] - t) * np.float32(100))  # 10 ms ramps: no click at the ends
    if sound == 0:
        burst = np.sin(t * np.float32(2 * math.pi * rng.uniform(500, 2500))) * edges
    else:
        burst = rng.standard_normal(n, dtype=np.float32) * edges
    # Level set on the loudest 16 ms of the signal, relative to the unit-RMS hum (as the default's transients).
    start, end = _render._mix(wave, burst, onset, snr_db, peak, rate)
    return wave, Event(BINDING_SOUNDS[sound], round(start / rate, 3), round(end / rate, 3))
