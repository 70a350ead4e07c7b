"""File decoding shared by every dataset: images, masks, audio clips and DCASE event tables.

Each function raises `DataError` with a plain-language reason ("contains NaN samples", "is
truncated: ...") and no location; the dataset adds the manifest row and the path, so one
message says where, what and what to do.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import math
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import soundfile as sf
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from sss.data.errors import DataError

try:
    import fcntl
except ImportError:  # Windows: no flock; callers' atomic renames alone keep half-written folders invisible
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "IMAGENET",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MIN_IMAGE_SIDE",
    "Crop",
    "EventTable",
    "ImageNorm",
    "event_frames",
    "load_audio",
    "load_image",
    "load_mask",
    "read_event_table",
    "sample_crop",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MIN_IMAGE_SIDE = 8
"""Images whose *longer* side is below this many pixels are refused: a 1x1 or 2x2 file is a
placeholder or a tracking pixel, and resizing it up yields a flat colour that teaches the model
nothing. A thin image (a 5x300 strip from a line-scan camera) has a long side full of content and
is accepted and resized like any other."""

_REDUCING_GAP = 2
"""A large image is box-reduced by an integer factor while its shorter side stays at least this
many times the target side, so the final bilinear resize (and a random crop of half the area)
still shrinks it: the result matches a direct resize to within rounding, at a fraction of the memory."""

_FILTERS = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "nearest": Image.Resampling.NEAREST,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}
"""Resize filters by timm's names (its ``pretrained_cfg["interpolation"]``): timm's PIL transforms use these."""


@functools.lru_cache(maxsize=16)
def _folded(mean: tuple[float, ...], std: tuple[float, ...]) -> tuple[Tensor, Tensor]:
    # (x / 255 - mean) / std folded into one multiply-add per pixel (the same arithmetic for any stats,
    # so the ImageNet defaults give the very tensors they always gave).
    scale = torch.tensor([1 / (255 * s) for s in std]).view(3, 1, 1)
    shift = torch.tensor([-m / s for m, s in zip(mean, std, strict=True)]).view(3, 1, 1)
    return scale, shift


class ImageNorm(NamedTuple):
    """How 8-bit RGB pixels become a model input: per-channel mean and std of [0, 1] values, and the resize filter.

    The default is ImageNet's statistics with bilinear resizing; an image encoder with pretrained
    weights binds its own (`sss.models.TokenEncoder.preprocessing`), and the data decodes with them.

    Example:
        >>> ImageNorm.of({"image_mean": [0.5] * 3, "image_std": [0.5] * 3}).interpolation
        'bilinear'
        >>> ImageNorm.of({}) == IMAGENET
        True
    """

    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    interpolation: str = "bilinear"

    @classmethod
    def of(cls, prep: Any) -> ImageNorm:
        """From a ``preprocessing()`` / ``preprocessing.json`` mapping; keys it lacks keep the defaults.

        Raises:
            ValueError: Not three positive std values, three means, or an interpolation PIL has no filter for.
        """
        mean = tuple(float(v) for v in prep.get("image_mean") or IMAGENET_MEAN)
        std = tuple(float(v) for v in prep.get("image_std") or IMAGENET_STD)
        interpolation = str(prep.get("image_interpolation") or "bilinear")
        if len(mean) != 3 or len(std) != 3 or not all(v > 0 and math.isfinite(v) for v in std):
            raise ValueError(f"image_mean/image_std must be 3 values each (std > 0), got {list(mean)}, {list(std)}")
        if interpolation not in _FILTERS:
            raise ValueError(f"image_interpolation must be one of {', '.join(_FILTERS)}, got {interpolation!r}")
        return cls(mean, std, interpolation)

    def normalise(self, pixels: Tensor) -> Tensor:
        """Float pixels in [0, 255] ``[..., 3, H, W]`` normalised in place (and returned)."""
        scale, shift = _folded(self.mean, self.std)
        return pixels.mul_(scale).add_(shift)


IMAGENET = ImageNorm()
"""The decoding every model without bound weights gets: ImageNet mean/std, bilinear resize."""


class Crop(NamedTuple):
    """A crop box as fractions of the image (so one box fits an image and its mask at any size), plus a flip."""

    left: float = 0.0
    top: float = 0.0
    width: float = 1.0
    height: float = 1.0
    flip: bool = False


def sample_crop(
    aspect: float, scale: tuple[float, float] = (0.5, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3)
) -> Crop:
    """Draw a random-resized-crop box and a horizontal flip (torchvision's ``RandomResizedCrop`` recipe).

    Uses torch's global generator, which DataLoader workers seed per worker from the loader's seed.

    Args:
        aspect: Width / height of the source image.
        scale: Range of the crop's area as a fraction of the image.
        ratio: Range of the crop's aspect ratio.

    Returns:
        The box in fractions of the image, and whether to flip.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> crop = sample_crop(1.0)
        >>> 0.5 <= crop.width * crop.height <= 1.0 and crop.left + crop.width <= 1.0
        True
    """
    flip = bool(torch.rand(()) < 0.5)
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        area = float(torch.empty(()).uniform_(*scale))
        shape = math.exp(float(torch.empty(()).uniform_(*log_ratio))) / aspect  # crop aspect in fraction units
        width, height = math.sqrt(area * shape), math.sqrt(area / shape)
        if width <= 1.0 and height <= 1.0:
            left = float(torch.rand(())) * (1.0 - width)
            top = float(torch.rand(())) * (1.0 - height)
            return Crop(left, top, width, height, flip)
    return Crop(flip=flip)  # rare extreme aspect: whole image


def _open_pixels(path: str | os.PathLike[str] | bytes, size: int) -> Image.Image:
    """Open and fully decode an image (so truncation shows up here), checking its size."""
    try:
        img = Image.open(io.BytesIO(path) if isinstance(path, bytes) else path)  # bytes: a shard member, a Parquet cell
        # JPEG can decode at 1/2, 1/4 or 1/8 scale for free; never below the target size.
        img.draft(img.mode, (size, size))
        img.load()
    except UnidentifiedImageError:
        raise DataError("is not an image Pillow can read (corrupt, or another kind of file)") from None
    except (OSError, SyntaxError, ValueError) as err:  # truncated data, bad chunk CRC, decompression bomb, ...
        raise DataError(f"cannot be decoded ({err}); re-export or replace the file") from None
    if max(img.size) < MIN_IMAGE_SIDE:
        raise DataError(
            f"is only {img.size[0]}x{img.size[1]} pixels (minimum {MIN_IMAGE_SIDE} along its longer side): "
            "a placeholder, not a picture; replace it or remove the row"
        )
    return img


def _shrink(img: Image.Image, size: int) -> tuple[Image.Image, tuple[float, float]]:
    """Box-reduce an image much larger than ``size`` by integer factors, before anything copies it at full size.

    Pillow decodes PNG, TIFF, BMP, ... only at full size (JPEG's ``draft`` already decoded at
    reduced scale); every conversion after that (``convert`` even to the same mode, float
    arrays) would be another full-size copy, about +400 MB each for a 10000x10000 RGB image.

    Returns:
        The image and the extent of the original in its pixels: fractional when a side is not a
        multiple of the factor (reduce's last box is partial), so the resize keeps the exact geometry.
    """
    fx, fy = (max(side // (size * _REDUCING_GAP), 1) for side in img.size)
    if fx == fy == 1:
        return img, img.size
    if img.mode in ("1", "P", "PA"):
        img = img.convert("L" if img.mode == "1" else "RGBA")  # reduce would average palette indices
    elif img.mode.startswith("I;16"):
        img = img.convert("I")  # 16-bit modes cannot be reduced; "I" is scaled to 8 bit like them
    return img.reduce((fx, fy)), (img.size[0] / fx, img.size[1] / fy)


def _to_8bit(img: Image.Image, mode: str) -> Image.Image:
    """Convert to ``mode`` ("RGB" or "L"), scaling 16/32-bit and float images instead of clipping them.

    Pillow's own ``convert`` clips a 16-bit image at 255, which turns most of it white.
    """
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        values = np.asarray(img, dtype=np.float32)
        top = 1.0 if img.mode == "F" else (65535.0 if values.max(initial=0) > 255 else 255.0)
        img = Image.fromarray(np.clip(values * (255.0 / top), 0, 255).astype(np.uint8), "L")
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")  # avoids Pillow's warning on palette images with transparency
    return img.convert(mode)


def _resize(
    img: Image.Image, size: int, crop: Crop | None, extent: tuple[float, float], resample: str = "bilinear"
) -> Image.Image:
    w, h = extent
    box = None if extent == img.size else (0.0, 0.0, w, h)
    if crop is not None and (crop.width, crop.height) != (1.0, 1.0):
        box = (crop.left * w, crop.top * h, (crop.left + crop.width) * w, (crop.top + crop.height) * h)
    if box is not None or img.size != (size, size):
        # resize(box=) crops and resizes in one pass, without materialising the crop.
        img = img.resize((size, size), _FILTERS[resample], box=box)
    if crop is not None and crop.flip:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return img


def _pixels(
    path: str | os.PathLike[str] | bytes, size: int, mode: str, crop: Crop | None, resample: str = "bilinear"
) -> Image.Image:
    """Decode, reduce, convert to 8-bit ``mode``, crop and resize: the steps every image loader shares."""
    with _open_pixels(path, size) as img:
        small, extent = _shrink(img, size)
        return _resize(_to_8bit(small, mode), size, crop, extent, resample)


def load_image(
    path: str | os.PathLike[str] | bytes, size: int, crop: Crop | None = None, norm: ImageNorm = IMAGENET
) -> Tensor:
    """Read an image of any mode and size as a normalised float tensor ``[3, size, size]``.

    Converted to RGB (16-bit and float images are scaled, not clipped), cropped by ``crop`` when
    given, resized (``norm``'s filter: bilinear by default), scaled to [0, 1] and normalised with
    ``norm``'s mean and std (ImageNet's by default; a pretrained encoder's own when bound). Any
    aspect works (a 5x300 line-scan strip is stretched to the square). A large image is decoded
    at reduced scale (JPEG) or box-reduced right after decoding (other formats) before anything
    else copies it, so memory stays near one decoded copy of the file's pixels.

    Args:
        path: Image file (PNG, JPEG, BMP, WebP, TIFF, ...).
        size: Side of the square output.
        crop: Crop box and flip (training augmentation); None keeps the whole image.
        norm: Mean, std and resize filter.

    Returns:
        The image tensor.

    Raises:
        DataError: The file is not a decodable image, or its longer side is below `MIN_IMAGE_SIDE`.

    Example:
        >>> import tempfile
        >>> from PIL import Image
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     Image.new("L", (40, 30), color=255).save(f"{tmp}/white.png")
        ...     image = load_image(f"{tmp}/white.png", 64)
        >>> image.shape, round(image[0, 0, 0].item(), 3)
        (torch.Size([3, 64, 64]), 2.249)
    """
    rgb = _pixels(path, size, "RGB", crop, norm.interpolation)
    pixels = torch.from_numpy(np.asarray(rgb, dtype=np.float32)).permute(2, 0, 1).contiguous()
    return norm.normalise(pixels)


def load_image_u8(path: str | os.PathLike[str] | bytes, size: int, norm: ImageNorm = IMAGENET) -> np.ndarray:
    """The resized RGB image as uint8 ``[3, size, size]`` (what the feature cache stores); ``norm``'s resize filter.

    Example:
        >>> import tempfile
        >>> from PIL import Image
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     Image.new("RGB", (20, 10), (255, 0, 0)).save(f"{tmp}/red.png")
        ...     load_image_u8(f"{tmp}/red.png", 16)[:, 0, 0].tolist()
        [255, 0, 0]
    """
    rgb = _pixels(path, size, "RGB", None, norm.interpolation)
    return np.ascontiguousarray(np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1))


def normalise_u8(pixels: Tensor, norm: ImageNorm = IMAGENET) -> Tensor:
    """uint8 ``[..., 3, H, W]`` to the normalised float image `load_image` returns (``norm``'s mean and std).

    Example:
        >>> import torch
        >>> round(normalise_u8(torch.full((3, 2, 2), 255, dtype=torch.uint8))[0, 0, 0].item(), 3)
        2.249
    """
    return norm.normalise(pixels.float())


def load_mask(path: str | os.PathLike[str] | bytes, size: int, crop: Crop | None = None) -> Tensor:
    """Read a shadow mask as float ``[1, size, size]`` in [0, 1] (255 = shadow), cropped like its image.

    Any mode: colour masks are converted to grey, 16-bit ones scaled. Bilinear resizing keeps
    soft edges soft; binarise at 0.5 for BER.

    Args:
        path: Mask file.
        size: Side of the square output.
        crop: The same crop and flip as the image's, so mask and image stay aligned.

    Returns:
        The mask tensor.

    Example:
        >>> import tempfile
        >>> from PIL import Image
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     Image.new("L", (32, 32), 255).save(f"{tmp}/m.png")
        ...     mask = load_mask(f"{tmp}/m.png", 16)
        >>> mask.shape, mask.max().item()
        (torch.Size([1, 16, 16]), 1.0)
    """
    grey = _pixels(path, size, "L", crop)
    return torch.from_numpy(np.asarray(grey, dtype=np.float32) * (1 / 255))[None]


def load_audio(
    path: str | os.PathLike[str] | bytes, sample_rate: int, num_samples: int, *, train: bool = False
) -> tuple[Tensor, int]:
    """Read a sound file as a mono float waveform ``[1, num_samples]`` at ``sample_rate``.

    Any channel count (averaged to mono) and any rate (resampled with
    `torchaudio.functional.resample`, windowed sinc). Longer clips are cropped (centre crop, or
    a random crop when ``train``), shorter ones are zero-padded at the end. Decoding uses
    ``soundfile`` (libsndfile: WAV, FLAC, OGG, MP3), never FFmpeg.

    Args:
        path: Sound file.
        sample_rate: Output rate in Hz.
        num_samples: Output length.
        train: Random crop instead of centre crop.

    Returns:
        The waveform and the crop's start in output samples (0 when padded), which event
        targets need to move with the crop.

    Raises:
        DataError: Unreadable, truncated, empty, or NaN/infinite samples.

    Example:
        >>> import tempfile
        >>> import numpy as np
        >>> import soundfile as sf
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     sf.write(f"{tmp}/stereo.wav", np.zeros((22050, 2)), 44100)
        ...     wave, start = load_audio(f"{tmp}/stereo.wav", 16000, 16000)
        >>> wave.shape, start
        (torch.Size([1, 16000]), 0)
    """
    data, rate = _read_sound(path)
    if data.shape[0] == 0:
        raise DataError("has no samples (0-length clip); replace it or remove the row")
    if not np.isfinite(data).all():
        raise DataError("contains NaN or infinite samples; the recording or its export is broken, replace it")
    wave = torch.from_numpy(data[:, 0] if data.shape[1] == 1 else data.mean(axis=1))[None]
    if rate != sample_rate:
        wave = _resampler(rate, sample_rate)(wave)
    return fit_length(wave, num_samples, train)


@functools.lru_cache(maxsize=8)
def _resampler(orig: int, new: int) -> Any:
    """A cached ``torchaudio.transforms.Resample``: building the sinc kernel costs more than applying it
    (44.1 -> 16 kHz: ~2 ms to build, ~0.6 ms to apply on one core), and ``functional.resample`` rebuilds it per call."""
    import torchaudio  # imported here: only needed for mismatched rates, and slow to import

    return torchaudio.transforms.Resample(orig, new)


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run torch ops on one thread for the duration (decoding in the main process, cache builds).

    Per-sample ops are tiny; with intra-op threads on a busy machine OpenMP's spinning makes them
    20-80x slower (log-mel of 1 s: 47 ms on 2 threads vs 0.8 ms on 1, measured under load).
    DataLoader workers already run with one thread.
    """
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _read_sound(path: str | os.PathLike[str] | bytes) -> tuple[np.ndarray, int]:
    try:
        with sf.SoundFile(io.BytesIO(path) if isinstance(path, bytes) else path) as handle:
            expected = handle.frames
            data = handle.read(dtype="float32", always_2d=True)  # [frames, channels]
            rate = handle.samplerate
    except sf.LibsndfileError as err:
        raise DataError(f"cannot be decoded as audio ({err.error_string}); re-export it as WAV or FLAC") from None
    except (RuntimeError, OSError, TypeError, ValueError) as err:
        raise DataError(f"cannot be decoded as audio ({err}); re-export it as WAV or FLAC") from None
    declared = _wav_declared_frames(path)
    if declared is not None and declared > data.shape[0]:
        expected = declared
    if 0 < expected != data.shape[0]:
        # libsndfile returns what is there without complaint: a cut-off download would train on a
        # shorter, zero-padded clip without anyone knowing.
        raise DataError(
            f"is truncated: its header announces {expected} frames but only {data.shape[0]} are there; "
            "download or export it again"
        )
    return data, rate


def _wav_declared_frames(path: str | os.PathLike[str] | bytes) -> int | None:
    """Frames a WAV's data chunk header announces, or None (not a WAV, or a streaming size).

    libsndfile sizes a truncated WAV by what is on disk, so the cut is only visible by comparing
    the header's data size with the file's length.
    """
    if isinstance(path, bytes):
        head, size = path[:4096], len(path)
    else:
        with open(path, "rb") as handle:
            head, size = handle.read(4096), os.fstat(handle.fileno()).st_size
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    pos, block_align = 12, 0
    while pos + 8 <= len(head):
        chunk, length = head[pos : pos + 4], int.from_bytes(head[pos + 4 : pos + 8], "little")
        if chunk == b"fmt " and pos + 22 <= len(head):
            block_align = int.from_bytes(head[pos + 20 : pos + 22], "little")
        if chunk == b"data":
            if length in (0, 0xFFFFFFFF) or block_align == 0:
                return None  # streaming writers leave the size open
            available = size - (pos + 8)
            return length // block_align if available < length else None
        pos += 8 + length + (length & 1)
    return None


def fit_length(wave: Tensor, num_samples: int, train: bool) -> tuple[Tensor, int]:
    """Crop ``[C, S]`` to ``num_samples`` (centre, or random when ``train``) or zero-pad at the end.

    Returns the result and the crop's start.

    Example:
        >>> import torch
        >>> wave, start = fit_length(torch.arange(10.0)[None], 4, train=False)
        >>> wave.tolist(), start
        ([[3.0, 4.0, 5.0, 6.0]], 3)
    """
    length = wave.shape[-1]
    if length > num_samples:
        start = int(torch.randint(length - num_samples + 1, ())) if train else (length - num_samples) // 2
        # Cloned so a worker does not ship the whole clip's storage back to the main process.
        return wave[..., start : start + num_samples].clone(), start
    if length < num_samples:
        return torch.nn.functional.pad(wave, (0, num_samples - length)), 0
    return wave, 0


class EventRow(NamedTuple):
    """One strong label: a class index and its extent in seconds."""

    onset: float
    offset: float
    label: str


class EventTable(NamedTuple):
    """A parsed strong-label table: the events by clip, and the clips whose lines do not parse."""

    events: dict[str, list[EventRow]]
    """Events by file name (the base name, as DCASE writes it). Clips without events have no key."""
    bad: dict[str, str]
    """Clip name -> the message of its first malformed line (``event table F, line N: ...``)."""


def read_event_table(path: str | os.PathLike[str]) -> EventTable:
    """Read a DCASE strong-label table (``filename onset offset event_label``, tab separated, with header).

    One table usually holds the events of many clips (DESED, the synthetic dataset), so a
    malformed line is charged to the clip it names, not to the table: the other clips keep their
    events, and the dataset rejects (or skips) only the rows of that clip, naming the line. A row
    with the onset, offset and label all empty is how DCASE lists a clip without events.

    Args:
        path: The TSV file.

    Returns:
        The events and the malformed clips.

    Raises:
        DataError: The table as a whole is unreadable (missing columns, not UTF-8, not a TSV).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     with open(f"{tmp}/ev.tsv", "w") as f:
        ...         _ = f.write("filename\\tonset\\toffset\\tevent_label\\n")
        ...         _ = f.write("a.wav\\t0.5\\t0.75\\tknock\\nb.wav\\tsoon\\t1\\tdog\\n")
        ...     table = read_event_table(f"{tmp}/ev.tsv")
        >>> table.events
        {'a.wav': [EventRow(onset=0.5, offset=0.75, label='knock')]}
        >>> table.bad["b.wav"].split(": ", 1)[1]
        "onset/offset must be numbers, got 'soon', '1'; fix or remove that line"
    """
    events: dict[str, list[EventRow]] = {}
    bad: dict[str, str] = {}
    line = 1
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle, delimiter="\t")
            header = list(reader.fieldnames or [])
            if (twice := repeated(header)) is not None:  # DictReader would keep the last of the two
                raise DataError(f"event table {path}: column {twice!r} appears twice in the header; keep one")
            missing = [c for c in ("filename", "onset", "offset", "event_label") if c not in header]
            if missing:
                raise DataError(
                    f"event table {path}: missing column(s) {', '.join(missing)}; a DCASE strong-label TSV has the "
                    "header filename<TAB>onset<TAB>offset<TAB>event_label"
                )
            for row in reader:
                line = reader.line_num
                name = os.path.basename(row.get("filename") or "")
                fields = (row.get("onset"), row.get("offset"), row.get("event_label"))
                if not any((value or "").strip() for value in fields):
                    continue  # DCASE's way of listing a clip without events
                event = _parse_event(*fields)
                if isinstance(event, str):
                    bad.setdefault(name, f"event table {path}, line {line}: {event}; fix or remove that line")
                else:
                    events.setdefault(name, []).append(event)
    except UnicodeDecodeError as err:
        raise DataError(f"event table {path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except csv.Error as err:  # e.g. a NUL byte: the file is not a text table at all
        raise DataError(f"event table {path}, line {line + 1}: not a tab-separated table ({err})") from None
    return EventTable(events, bad)


def _parse_event(onset: str | None, offset: str | None, label: str | None) -> EventRow | str:
    """One table line as an `EventRow`, or what is wrong with it."""
    try:
        start, end = float(onset), float(offset)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return f"onset/offset must be numbers, got {onset!r}, {offset!r}"
    if not (0 <= start <= end and math.isfinite(end)):
        return "need 0 <= onset <= offset"
    if not (label or "").strip():
        return "event_label is empty"
    return EventRow(start, end, label)  # type: ignore[arg-type]


def event_frames(
    events: tuple[tuple[float, float, int], ...], num_classes: int, num_frames: int, rate: float, start_s: float
) -> Tensor:
    """Frame targets ``[num_frames, num_classes]``: 1 where an event overlaps the frame, else 0.

    Frame ``t`` covers ``[t / rate, (t + 1) / rate)`` seconds of the (cropped) clip; ``start_s``
    is where the crop starts in the original recording, so targets move with a random crop.

    Example:
        >>> event_frames(((0.25, 0.5, 1),), num_classes=2, num_frames=8, rate=8.0, start_s=0.0)[:, 1].tolist()
        [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    """
    target = torch.zeros(num_frames, num_classes)
    for onset, offset, k in events:
        first = max(math.floor((onset - start_s) * rate + 1e-6), 0)
        last = min(math.ceil((offset - start_s) * rate - 1e-6), num_frames)
        if last > first:
            target[first:last, k] = 1.0
    return target


def read_text(path: str | os.PathLike[str]) -> str:
    """A text file as UTF-8 (a spreadsheet's BOM is dropped); non-UTF-8 is a `DataError` that says how to fix it.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     with open(f"{tmp}/a.csv", "wb") as f:
        ...         _ = f.write(b"\\xef\\xbb\\xbfimage,label\\n")
        ...     read_text(f"{tmp}/a.csv")
        'image,label\\n'
    """
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise DataError(
            f"{path}, line {line}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); "
            "save the file as UTF-8 (e.g. in a spreadsheet: 'CSV UTF-8')"
        ) from None


def repeated(names: list[str]) -> str | None:
    """The first column name that appears twice; blank names (never read: trailing commas) may repeat.

    Example:
        >>> repeated(["image", "audio", "", "", "image"]), repeated(["image", "label"])
        ('image', None)
    """
    return next((name for i, name in enumerate(names) if name and name in names[:i]), None)


def describe(value: Any) -> str:
    """A short repr for messages."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (released when the file closes, even if the process dies).

    Example:
        >>> import tempfile
        >>> with file_lock(tempfile.mkdtemp() + "/.lock"):
        ...     pass
    """
    with open(path, "a") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield
