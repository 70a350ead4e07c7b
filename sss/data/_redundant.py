"""Renderers of the synthetic generator's ``task="redundant"``: both modalities carry the label, each corrupted alone.

Four machines (`REDUNDANT_CLASSES`) stand under a lamp. Each signals itself twice: by the striped
shadow of its grille, whose slats lie at its own angle (0, 45, 90 or 135 degrees,
`REDUNDANT_SHADOWS`), and by its own sound (a steady tone, a hiss, a pulsed tone or a rising sweep,
`REDUNDANT_SOUNDS`). The two share the latent class: the sound's source is the machine in view.
Each modality is corrupted independently in a fraction `CORRUPTION` of the samples of a split (the
camera's view in 5%, the microphone, drowned by the shop floor, in 30%): the grille's shadow becomes an
orientation-free blotch (``noise``), the sound a crackle of clicks (``noise``), both drawn the same way
whatever the class. So each modality alone reaches about ``1 - q(K-1)/K`` (it guesses when its own
signal is noise: 96% from the image, 78% from the audio), a fusion about ``1 - q_image q_audio (K-1)/K``
(99%).

The rates differ on purpose: with one reliable and one unreliable sensor, a fusion trained without
modality dropout leans on the reliable one and leaves the other encoder under-trained, which is what
``benchmarks/missing.py`` measures. With both at 25%, every corrupted sample already taught a plain
fusion to fall back on the other modality, and it lost no more than a dropout-trained one without
either (benchmarks/RESULTS.md, "Missing modalities").

Like the binding task's, the cues are textures (an orientation, a spectro-temporal pattern) that an
untrained pooled CNN already separates, so hunter_tiny learns them within a few hundred steps. Every
random draw happens whatever the class and the corruption, so only the cue itself depends on them.
"""

from __future__ import annotations

import math

import numpy as np

from sss.data import _render
from sss.data._render import Event

__all__ = [
    "CORRUPTION",
    "REDUNDANT_CLASSES",
    "REDUNDANT_SHADOWS",
    "REDUNDANT_SOUNDS",
    "REDUNDANT_VERSION",
    "corrupted",
    "redundant_audio",
    "redundant_image",
]

REDUNDANT_CLASSES = ("pump", "fan", "press", "drill")
"""Classes of ``task="redundant"``: the machine in view and in earshot."""

REDUNDANT_SHADOWS = ("slats_0", "slats_45", "slats_90", "slats_135")
"""Each class's grille shadow, in class order (slat angle in degrees); a corrupted image shows ``noise``."""

REDUNDANT_SOUNDS = ("tone", "hiss", "pulses", "sweep")
"""Each class's sound, in class order; a corrupted clip plays ``noise`` (a crackle of clicks)."""

NOISE = "noise"
"""The shadow or sound a corrupted modality shows instead of its class's."""

CORRUPTION = {"image": 0.05, "audio": 0.3}
"""Fraction of each split whose image, and (drawn independently) whose audio, is corrupted."""

REDUNDANT_VERSION = 1
"""Bump when this task's rendering changes (its stamp records it)."""


def corrupted(seed: int, split_id: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Which samples of a split have their image, and which their audio, corrupted: bool ``[count]`` each.

    Exactly ``round(CORRUPTION[modality] * count)`` of each, drawn independently of each other and of the labels.

    Example:
        >>> image, audio = corrupted(0, 0, 400)
        >>> int(image.sum()), int(audio.sum()), int((image & audio).sum()) < 20
        (20, 120, True)
    """
    draws = [np.random.default_rng([seed, split_id, 0x5EED, stream]).permutation(count) for stream in (0, 1)]
    return draws[0] < round(CORRUPTION["image"] * count), draws[1] < round(CORRUPTION["audio"] * count)


def redundant_image(rng: np.random.Generator, size: int, label: int, noise: bool) -> tuple[np.ndarray, np.ndarray]:
    """A floor under a lamp and a grille's shadow: slats at ``45 * label`` degrees (+-7), or a blotch when ``noise``.

    The binding task's grille (a 0.35-radius disc of slats half their 6-8 px pitch wide at 64 px), at
    four angles; the blotch is smooth random texture thresholded at zero, about as dark and as much of
    the disc, with no orientation. Returns ``(rgb uint8 [H, W, 3], mask uint8 [H, W])``.

    Example:
        >>> image, mask = redundant_image(np.random.default_rng(0), 64, label=1, noise=False)
        >>> image.shape, bool(0.15 < (mask > 127).mean() < 0.25)
        ((64, 64, 3), True)
    """
    albedo = _render._floor(rng, size)
    _, irradiance, direct, ambient = _render._light(rng, size)
    cx, cy, radius = rng.uniform(0.35, 0.65) * size, rng.uniform(0.35, 0.65) * size, 0.35 * size
    angle = label * math.pi / 4 + rng.uniform(-0.12, 0.12)
    period, exposure = rng.uniform(3 / 32, 1 / 8) * size, rng.uniform(0.75, 0.95)
    basis = _render._smooth_basis(size, max(4, size // 3))  # blobs about as wide as a slat
    blotch = basis @ rng.standard_normal((basis.shape[1],) * 2, dtype=np.float32) @ basis.T
    xs, ys = _render._grid(size)
    disc = _render._coverage(radius - np.sqrt((xs - cx) ** 2 + (ys - cy) ** 2))
    if noise:
        cover = disc * _render._coverage(blotch * np.float32(3 / max(float(blotch.std()), 1e-6)))
    else:
        across = math.cos(angle) * (xs - cx) + math.sin(angle) * (ys - cy)  # distance across the slats
        to_slat = np.abs((across / period) % 1.0 - 0.5) * period
        cover = disc * _render._coverage(period / 4 - to_slat)
    rgb = albedo * (ambient + direct * (irradiance * (1 - cover)))
    rgb *= exposure / max(float(rgb.max()), 1e-3)
    image = (np.clip(rgb, 0.0, 1.0) * 255 + 0.5).astype(np.uint8).transpose(1, 2, 0)
    return np.ascontiguousarray(image), (cover * 255 + 0.5).astype(np.uint8)


def redundant_audio(
    rng: np.random.Generator, rate: int, num_samples: int, label: int, noise: bool
) -> tuple[np.ndarray, Event | None]:
    """Machine hum plus one 0.25-0.4 s sound 15-25 dB above it: ``REDUNDANT_SOUNDS[label]``, or a crackle.

    Returns the waveform and the sound's event (None for the crackle: no class sound in the clip).

    Example:
        >>> wave, event = redundant_audio(np.random.default_rng(0), 16000, 16000, label=3, noise=False)
        >>> wave.shape, event.label, 0.1 <= event.onset < event.offset <= 1.0
        ((16000,), 'sweep', True)
    """
    wave, length, onset, snr_db, peak, t = _render._burst_axes(rng, rate, num_samples, (0.25, 0.4), 0.45, (15, 25))
    n = len(t)
    tone = rng.uniform(500, 2500)
    # Pulses: on for half of each 60-100 ms period, with soft edges (hard ones would click like the crackle).
    gate = np.clip(np.sin(t * np.float32(2 * math.pi / rng.uniform(0.06, 0.1))) * np.float32(4), 0.0, 1.0)
    sweep = np.float32(2 * math.pi * 300 / math.log(16)) * (np.float32(16) ** (t / np.float32(length)) - 1)
    white = rng.standard_normal(n, dtype=np.float32)
    clicks = white * (rng.random(n, dtype=np.float32) < np.float32(40 / rate)) * np.float32(math.sqrt(rate / 40))
    burst = [
        np.sin(t * np.float32(2 * math.pi * tone)),  # tone
        white,  # hiss
        np.sin(t * np.float32(2 * math.pi * tone)) * gate,  # pulses
        np.sin(sweep),  # sweep: 300 Hz to 4.8 kHz, exponential
    ][label]
    burst = np.convolve(clicks, np.ones(16, dtype=np.float32) / 4, mode="same") if noise else burst
    burst = burst * np.minimum(1.0, np.minimum(t, t[-1] - t) * np.float32(100))  # 10 ms ramps: no click at the ends
    # Level set on the loudest 16 ms, relative to the unit-RMS hum (as the binding task's signals).
    start, end = _render._mix(wave, burst, onset, snr_db, peak, rate)
    return wave, None if noise else Event(REDUNDANT_SOUNDS[label], round(start / rate, 3), round(end / rate, 3))
