"""Renderers of the synthetic generator's ``task="shared"``: both modalities show the same latent machine type.

Sixteen machine types (`SHARED_TYPES`) stand on the floor, the product of two factors, each seen
*and* heard: type ``k`` has form ``s = k // 4`` and size ``v = k % 4``. The camera sees the shadow of
the machine's grille, of pattern ``GRILLES[s]`` with a pitch of ``PITCHES[v]`` (`SHARED_SHADOWS`);
the microphone hears its sound, ``SHARED_SOUNDS[s]`` (a tone, a band of hiss, pulses, a sweep) in the
band around ``BANDS[v]`` Hz. As in real video, the sound's source is the machine in view, so
matching an image to its clip means recognising the type in both: what contrastive pretraining learns.

The label is a function of the type that neither factor gives alone: the four classes
(`SHARED_CLASSES`) are the Latin square ``(s + v) % 4``, so each class holds four types, one of each
form and one of each size, and a model must tell all sixteen types apart to classify. Everything
else is drawn independently per modality and whatever the type: the grille's place, size and depth
of shadow, the floor, the lamp, fixed objects with sharp shadows (distractors) and sensor noise in
the image; the hum, onset, level and band jitter in the clip. The cues are deliberately faint
(`IMAGE_NOISE`, `SNR_DB`): hundreds of labelled samples do not pin sixteen types down, thousands do,
and so do thousands of unlabelled image-clip pairs.
"""

from __future__ import annotations

import math

import numpy as np

from sss.data import _render
from sss.data._render import Event

__all__ = [
    "BANDS",
    "GRILLES",
    "PITCHES",
    "SHARED_CLASSES",
    "SHARED_SHADOWS",
    "SHARED_SOUNDS",
    "SHARED_TYPES",
    "SHARED_VERSION",
    "shared_audio",
    "shared_class",
    "shared_image",
]

SHARED_CLASSES = ("line_a", "line_b", "line_c", "line_d")
"""Classes of ``task="shared"``: the production line a machine type belongs to, ``(s + v) % 4`` (`shared_class`)."""

GRILLES = ("vertical", "horizontal", "grid", "diamond")
"""Each form ``s``'s grille: vertical or horizontal slats, a square grid of bars, a grid turned 45 degrees.

All four look the same mirrored, so a horizontal flip (``data.augment``) never turns one type into another."""

PITCHES = (0.066, 0.096, 0.139, 0.2)
"""Pitch of each size ``v``'s grille as a fraction of the image side (4, 6, 9 and 13 px at 64 px), +-4%.

Steps of 1.45x: a random-resized crop (``data.augment``, up to 1.41x) blurs neighbouring sizes at most."""

BANDS = (450.0, 800.0, 1400.0, 2500.0)
"""Centre frequency in Hz of each size ``v``'s sound, +-5%."""

SHARED_SOUNDS = ("tone", "hiss", "pulses", "sweep")
"""Each form ``s``'s sound: a steady tone, a band of hiss, a pulsed tone, a sweep across the band."""

SHARED_SHADOWS = tuple(f"{grille}_{round(64 * p)}px" for grille in GRILLES for p in PITCHES)
"""Each type's grille shadow (its ``shadow`` column): the pattern and its pitch at 64 px."""

SHARED_TYPES = tuple(f"m{k:02d}" for k in range(16))
"""The latent machine types (the ``machine`` column); type ``k`` has form ``k // 4`` and size ``k % 4``."""

IMAGE_NOISE = (0.04, 0.08)
"""Range of the per-pixel sensor noise's standard deviation (images in [0, 1])."""

SHADOW_DEPTH = (0.2, 0.5)
"""Range of the fraction of direct light the grille's slats block (soft, partial shadows)."""

SNR_DB = (4.0, 12.0)
"""Range of the machine's sound level above the hum, on its loudest 16 ms."""

SHARED_VERSION = 1
"""Bump when this task's rendering changes (its stamp records it)."""


def shared_class(machine: int) -> int:
    """The class (index into `SHARED_CLASSES`) of machine type ``machine``: ``(form + size) % 4``.

    Example:
        >>> [shared_class(k) for k in range(8)]  # each class: one type of each form and each size
        [0, 1, 2, 3, 1, 2, 3, 0]
    """
    return (machine // 4 + machine % 4) % 4


def shared_image(rng: np.random.Generator, size: int, machine: int) -> tuple[np.ndarray, np.ndarray]:
    """A floor under a lamp, 0-3 fixed objects and machine ``machine``'s grille shadow, with sensor noise.

    The grille is a disc of radius 0.2-0.26 of the side, placed at random clear of the objects' shadows,
    of pattern ``GRILLES[machine // 4]`` (turned by up to 6 degrees) and pitch ``PITCHES[machine % 4]``;
    its bars block a random `SHADOW_DEPTH` of the direct light. Returns ``(rgb uint8 [H, W, 3], shadow mask
    uint8 [H, W])`` (the mask: the fraction of direct light blocked, times 255).

    Example:
        >>> image, mask = shared_image(np.random.default_rng(0), 64, machine=5)
        >>> image.shape, mask.dtype, bool(0 < (mask > 64).mean() < 0.5)
        ((64, 64, 3), dtype('uint8'), True)
    """
    albedo = _render._floor(rng, size)
    lamp, irradiance, direct, ambient = _render._light(rng, size)
    cx, cy, radius = rng.uniform(0.35, 0.65) * size, rng.uniform(0.35, 0.65) * size, rng.uniform(0.2, 0.26) * size
    angle = (math.pi / 4 if machine // 4 == 3 else 0.0) + rng.uniform(-0.1, 0.1)
    period = PITCHES[machine % 4] * size * rng.uniform(0.96, 1.04)
    depth, sigma, exposure = rng.uniform(*SHADOW_DEPTH), rng.uniform(*IMAGE_NOISE), rng.uniform(0.75, 0.95)
    # The objects keep clear of the grille: a still "streak" over it is what `_occluders` avoids.
    objects = _render._occluders(rng, size, lamp, _render._Streak(radius, radius, 0.0, cx, cy, 0.0, 0.0))
    noise = rng.standard_normal((3, size, size), dtype=np.float32)
    xs, ys = _render._grid(size)
    disc = _render._coverage(radius - np.sqrt((xs - cx) ** 2 + (ys - cy) ** 2))
    shadow = disc * _bars(xs - cx, ys - cy, angle, period, machine // 4) * np.float32(depth)
    for cast, _, _ in objects:
        shadow = np.maximum(shadow, cast)
    rgb = albedo * (ambient + direct * (irradiance * (1 - shadow)))
    for _, body, colour in objects:  # object tops are lit and hide the floor below them
        rgb += body * (colour * (ambient + direct * irradiance) - rgb)
        shadow = shadow * (1 - body)
    rgb *= exposure / max(float(rgb.max()), 1e-3)
    rgb += noise * np.float32(sigma)
    image = (np.clip(rgb, 0.0, 1.0) * 255 + 0.5).astype(np.uint8).transpose(1, 2, 0)
    return np.ascontiguousarray(image), (shadow * 255 + 0.5).astype(np.uint8)


def _bars(x: np.ndarray, y: np.ndarray, angle: float, period: float, grille: int) -> np.ndarray:
    """Coverage of ``GRILLES[grille]``'s bars at offsets ``(x, y)``: slats half the pitch wide, grid bars a third."""
    turns = {0: (0.0,), 1: (math.pi / 2,)}.get(grille, (0.0, math.pi / 2))
    open_ = np.float32(1.0)
    for turn in turns:
        across = math.cos(angle + turn) * x + math.sin(angle + turn) * y  # distance across the bars
        to_bar = np.abs((across / period) % 1.0 - 0.5) * period
        open_ = open_ * (1 - _render._coverage((period / 4 if len(turns) == 1 else period / 6) - to_bar))
    return 1 - open_


def shared_audio(rng: np.random.Generator, rate: int, num_samples: int, machine: int) -> tuple[np.ndarray, Event]:
    """Machine hum plus machine ``machine``'s 0.25-0.4 s sound, `SNR_DB` above it: its form's kind, its size's band.

    The tone and the pulses sit at the band's centre, the hiss fills half an octave around it, the
    sweep rises from half to twice it. Every draw happens whatever the type. Returns the waveform
    and the sound's event (labelled with its kind, `SHARED_SOUNDS`).

    Example:
        >>> wave, event = shared_audio(np.random.default_rng(0), 16000, 16000, machine=14)
        >>> wave.shape, event.label, 0.1 <= event.onset < event.offset <= 1.0
        ((16000,), 'sweep', True)
    """
    wave, length, onset, snr_db, peak, t = _render._burst_axes(rng, rate, num_samples, (0.25, 0.4), 0.45, SNR_DB)
    centre = BANDS[machine % 4] * rng.uniform(0.95, 1.05)
    n = len(t)
    gate = np.clip(np.sin(t * np.float32(2 * math.pi / rng.uniform(0.06, 0.1))) * np.float32(4), 0.0, 1.0)
    # Hiss: white noise through a half-octave Gaussian band (in log frequency) around the centre.
    size = 1 << (n - 1).bit_length()
    spectrum = np.fft.rfft(rng.standard_normal(size).astype(np.float32))
    octaves = np.log2(np.maximum(np.fft.rfftfreq(size, 1 / rate), 1.0) / centre)
    hiss = np.fft.irfft(spectrum * np.exp(-0.5 * (octaves / 0.25) ** 2), size)[:n].astype(np.float32)
    tone = np.sin(t * np.float32(2 * math.pi * centre))
    sweep = np.float32(2 * math.pi * centre / 2 * length / math.log(4)) * (np.float32(4) ** (t / np.float32(length)))
    burst = (tone, hiss, tone * gate, np.sin(sweep))[machine // 4]
    burst = burst * np.minimum(1.0, np.minimum(t, t[-1] - t) * np.float32(100))  # 10 ms ramps: no click at the ends
    # Level set on the loudest 16 ms, relative to the unit-RMS hum (as the other tasks' sounds).
    start, end = _render._mix(wave, burst, onset, snr_db, peak, rate)
    return wave, Event(SHARED_SOUNDS[machine // 4], round(start / rate, 3), round(end / rate, 3))
