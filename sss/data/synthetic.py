"""A synthetic "industrial" dataset whose label needs both the image and the audio.

A camera watches a factory floor lit by a lamp while a microphone listens to the machines.
Four classes, the product of two independent binary factors, one per modality:

============  ==========================  ==========================
class         image: moving shadow?       audio: transient?
============  ==========================  ==========================
``idle``      no                          no
``fault``     no                          yes (knock/friction/collision)
``passerby``  yes (motion-blurred)        no
``collision`` yes                         yes
============  ==========================  ==========================

Each modality alone therefore tells two pairs of classes apart and no more: an image-only or
audio-only model tops out near 50%, a fused one near 100%. Everything else (lighting, floor,
fixed objects with sharp static shadows, hum, noise, which transient) is random and shared by
all classes. See ``docs/data.md`` for the full description.

``task="binding"`` renders other scenes, in which fusion must *bind* the two streams: a machine
signals its state twice, by the striped shadow of a slatted grille under the lamp (slats at 0 or
90 degrees, `BINDING_SHADOWS`) and by a sound (a beep or a hiss, `BINDING_SOUNDS`); the label is
whether the two signals agree (``match``: 0 degrees with the beep, 90 with the hiss) or not
(``mismatch``). Each slat angle and each sound is equally frequent in both classes, so each
modality alone is independent of the label: an image-only or audio-only model sits at 50%. The
factors are textures (an orientation, a spectrum) that an untrained pooled CNN already separates,
so a fusion learns the agreement from the label alone within a few hundred steps.

``task="redundant"``: four machines, each shown by its grille's slat angle and heard by its own sound,
each modality corrupted alone (the image in 5% of the samples, the audio in 30%: `sss.data._redundant`).

``task="shared"``: sixteen machine types, each seen (its grille's pattern and pitch) and heard (its sound's
kind and band) faintly, under independent nuisances per modality; the label groups the types into four classes
that neither factor gives alone (`sss.data._shared`). For contrastive pretraining on image-clip pairs.

``missing=`` (any task) leaves image or audio cells empty, never both in a row (`make_industrial`).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import struct
import time
import uuid
import wave
import zlib
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np

from sss._writing import writing_to
from sss.config.constraints import NonNegativeInt, PositiveFloat, PositiveInt
from sss.data import _redundant, _shared
from sss.data._binding import BINDING_SHADOWS, BINDING_SOUNDS, binding_audio, binding_image
from sss.data._decode import file_lock
from sss.data._redundant import REDUNDANT_CLASSES, REDUNDANT_SHADOWS, REDUNDANT_SOUNDS, REDUNDANT_VERSION
from sss.data._render import EVENT_TYPES, Event, render_audio, render_image
from sss.data._shared import SHARED_CLASSES, SHARED_SHADOWS, SHARED_SOUNDS, SHARED_TYPES, SHARED_VERSION
from sss.data.folder import ManifestDataModule
from sss.data.presence import parse_missing

try:
    import fcntl
except ImportError:  # Windows: no flock; the atomic rename alone still keeps a half dataset invisible
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "BINDING_CLASSES",
    "BINDING_SHADOWS",
    "BINDING_SOUNDS",
    "CLASSES",
    "GENERATOR_VERSION",
    "REDUNDANT_CLASSES",
    "REDUNDANT_SHADOWS",
    "REDUNDANT_SOUNDS",
    "SHARED_CLASSES",
    "SHARED_SHADOWS",
    "SHARED_SOUNDS",
    "SHARED_TYPES",
    "TASKS",
    "IndustrialDataModule",
    "make_industrial",
]

CLASSES = ("idle", "fault", "passerby", "collision")
"""Class order: index = 2 * moving_shadow + transient."""

BINDING_CLASSES = ("mismatch", "match")
"""Classes of ``task="binding"``: index = whether the shadow's slat angle and the sound are partners."""

TASKS = ("default", "binding", "redundant", "shared")
"""The labelling tasks of the generator (see the module docstring)."""

_TASK_CLASSES = {
    "default": CLASSES,
    "binding": BINDING_CLASSES,
    "redundant": REDUNDANT_CLASSES,
    "shared": SHARED_CLASSES,
}

GENERATOR_VERSION = 3
"""Bump when the generator's output changes, so cached datasets are regenerated."""

BINDING_VERSION = 2
"""Bump when the binding task's rendering changes (its stamp records it; the default task's stamp does not)."""

_TASK_VERSIONS = {"binding": BINDING_VERSION, "redundant": REDUNDANT_VERSION, "shared": SHARED_VERSION}
_SPLITS = ("train", "val", "test")
_STAMP = "sss-dataset.json"  # written last, inside the folder that is renamed into place: its presence means complete


def make_industrial(
    out_dir: str | os.PathLike[str],
    *,
    n_train: int = 2000,
    n_val: int = 400,
    n_test: int = 400,
    seed: int = 0,
    image_size: int = 64,
    sample_rate: int = 16000,
    clip_seconds: float = 1.0,
    task: str = "default",
    missing: Mapping[str, float] | None = None,
) -> Path:
    """Generate the synthetic industrial dataset into ``out_dir`` (or reuse it if already there).

    Writes ``images/*.png``, ``audio/*.wav`` (16-bit PCM), ``masks/*.png`` (exact shadow
    coverage), ``{train,val,test}.csv`` (``image,audio,label,mask,events``), ``events.tsv``
    (DCASE style), ``classes.txt`` and ``event_classes.txt``. Classes are balanced within each split. Deterministic:
    the same arguments give byte-identical files. The folder is built under a temporary name and
    renamed into place when complete; when several processes call this at once, one generates
    and the others wait for it and reuse its result.

    Args:
        out_dir: Folder to create. An existing folder is reused if it was generated with the
            same arguments; any other non-empty folder is an error.
        n_train: Training samples.
        n_val: Validation samples (0 writes no ``val.csv``).
        n_test: Test samples (0 writes no ``test.csv``).
        seed: Seed; every sample is a pure function of ``(seed, split, index)``.
        image_size: Image side in pixels.
        sample_rate: Audio samples per second.
        clip_seconds: Clip length.
        task: ``"default"`` (the four classes above) or ``"binding"`` (``match`` when the shadow's slat
            angle and the sound are partners, else ``mismatch``: each modality alone is independent of
            the label; the manifests get ``shadow`` and ``sound`` columns, from `BINDING_SHADOWS` and
            `BINDING_SOUNDS`) or ``"redundant"`` (`REDUNDANT_CLASSES`: image and audio both carry the label,
            each corrupted alone, the image in 5% of the samples and the audio in 30%; ``shadow`` and
            ``sound`` columns, ``noise`` where corrupted) or ``"shared"`` (`SHARED_CLASSES`: sixteen machine types,
            seen and heard, in four classes no single factor tells; ``shadow``, ``sound``, ``machine`` columns).
        missing: ``{"image": 0.3, "audio": 0.2}``: the image cell (and the row's ``mask`` cell) is empty in
            a seeded 30% of the rows of each split, the audio cell (and its ``events`` cell) in another 20%,
            never both in one row; those files are not written, nor their events. Recorded in the stamp.

    Returns:
        ``out_dir`` as a `Path`.

    Raises:
        FileExistsError: ``out_dir`` holds something else (another dataset or other files).
        ValueError: An argument is out of range.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     root = make_industrial(Path(tmp) / "industrial", n_train=8, n_val=4, n_test=0)
        ...     (root / "classes.txt").read_text().split(), sorted(p.name for p in root.glob("*.csv"))
        (['idle', 'fault', 'passerby', 'collision'], ['train.csv', 'val.csv'])
    """
    args = _arguments(n_train, n_val, n_test, seed, image_size, sample_rate, clip_seconds, task, missing)
    _generate_once(Path(out_dir), args)
    return Path(out_dir)


def _arguments(
    n_train: int,
    n_val: int,
    n_test: int,
    seed: int,
    image_size: int,
    sample_rate: int,
    clip_seconds: float,
    task: str = "default",
    missing: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The generator's arguments as a plain dict (what the stamp and the cache key record), checked."""
    if n_train < 1 or n_val < 0 or n_test < 0:
        raise ValueError(f"need n_train >= 1 and n_val, n_test >= 0, got {n_train}, {n_val}, {n_test}")
    if image_size < 16 or sample_rate < 16000 or clip_seconds < 0.5:
        raise ValueError(
            f"need image_size >= 16, sample_rate >= 16000 (the sounds reach 7 kHz) and clip_seconds >= 0.5 "
            f"(room for a transient), got {image_size}, {sample_rate}, {clip_seconds}"
        )
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    missing = _missing_rates(missing)
    return {
        "n_train": int(n_train),
        "n_val": int(n_val),
        "n_test": int(n_test),
        "seed": int(seed),
        "image_size": int(image_size),
        "sample_rate": int(sample_rate),
        "clip_seconds": float(clip_seconds),
        "task": task,
    } | ({"missing": missing} if missing else {})


def _missing_rates(missing: Mapping[str, float] | None) -> dict[str, float]:
    """``missing`` checked: image and audio rates in [0, 1] adding up to at most 1 (never both absent in a row)."""
    rates = {name: rate for name, rate in parse_missing(missing).items() if rate > 0}
    if sum(rates.values()) > 1:
        raise ValueError(
            f"missing rates {rates} add up to more than 1: a row never lacks both modalities, so at most "
            "1 - (image rate) of the rows can lack their audio"
        )
    return {name: rates[name] for name in ("image", "audio") if name in rates}


def _stamp(args: dict[str, Any]) -> dict[str, Any]:
    # The task is part of the stamp (and so of the cache key) except for the default task, whose
    # stamp stays the one written before tasks existed: those datasets and caches are still reused.
    # So is `missing`, recorded only when some cells are empty.
    args = dict(args)
    task, missing = args.pop("task", "default"), args.pop("missing", None)
    stamp = {"generator": "industrial", "version": GENERATOR_VERSION, "args": args}
    stamp |= {} if task == "default" else {"task": task, "task_version": _TASK_VERSIONS[task]}
    return stamp | ({"missing": missing} if missing else {})


def _is_complete(out_dir: Path, args: dict[str, Any]) -> bool:
    """True if ``out_dir`` already holds this dataset; raises if it holds anything else."""
    stamp = out_dir / _STAMP
    if stamp.is_file():
        recorded = json.loads(stamp.read_text())
        if recorded == _stamp(args):
            return True
        raise FileExistsError(
            f"{out_dir} holds a dataset generated with other arguments ({recorded}); "
            f"delete it or choose another folder for {_stamp(args)}"
        )
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise FileExistsError(
            f"{out_dir} exists and is not a generated dataset (no {_STAMP}); choose a new or empty folder"
        )
    return False


def _generate_once(out_dir: Path, args: dict[str, Any]) -> bool:
    """Make sure ``out_dir`` holds the dataset; True if this call generated it, False if it was already there."""
    if _is_complete(out_dir, args):  # fast path, no lock: the stamp only ever appears inside a complete folder
        return False
    # A full or read-only disk names out_dir, not the hidden folder the dataset is built in.
    with writing_to(out_dir):
        return _generate_locked(out_dir, args)


def _generate_locked(out_dir: Path, args: dict[str, Any]) -> bool:
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out_dir.parent / f".{out_dir.name}.lock"):
        if _is_complete(out_dir, args):  # another process finished while we waited for the lock
            return False
        if fcntl is not None:  # we hold the lock, so any temporary folder left is from a crashed run
            for stale in out_dir.parent.glob(f".{out_dir.name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
        # Not tempfile.mkdtemp: its 0700 mode would survive the rename and lock other users out.
        tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            _write_dataset(tmp, args)
            if out_dir.is_dir():
                out_dir.rmdir()  # empty (checked above); rename cannot replace a directory everywhere
            os.rename(tmp, out_dir)  # atomic: readers see no folder or a complete one
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if _is_complete(out_dir, args):  # without flock another process may have won the rename
                return False
            raise
    return True


def _write_dataset(root: Path, args: dict[str, Any]) -> None:
    """Render every sample of every split into ``root``, then the manifests and the stamp."""
    for folder in ("images", "audio", "masks"):
        (root / folder).mkdir()
    events: list[tuple[str, Event]] = []
    # One writer thread: file system calls release the GIL, so writing overlaps rendering the next
    # sample (open/write cost 0.1-0.4 ms per file here, three files per sample). Leaving the
    # `with` waits for every write, so the stamp below is only written over complete files.
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending: list[Future[None]] = []
        _render_splits(root, args, events, lambda files: pending.append(pool.submit(_write_files, files)))
        for done in pending:
            done.result()  # re-raise a failed write (disk full, ...) here, not silently
    _finish(root, args, events)


def _write_files(files: list[tuple[str, bytes]]) -> None:
    for path, data in files:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:  # a disk that fills up mid-file writes part of it without an error; the next write fails
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)


def _render_splits(root: Path, args: dict[str, Any], events: list[tuple[str, Event]], write: Any) -> None:
    task = args["task"]
    header = ["image", "audio", "label", "mask", "events"] + (["shadow", "sound"] if task != "default" else [])
    header += ["machine"] if task == "shared" else []
    for split_id, split in enumerate(_SPLITS):
        count = args[f"n_{split}"]
        if count == 0:
            continue
        # Exactly balanced classes (binding: factor pairs, _PAIRS; shared: machine types) up to n % cycle, in a
        # seeded random order.
        cycle = {"binding": len(_PAIRS), "shared": len(SHARED_TYPES)}.get(task, len(CLASSES))
        labels = np.random.default_rng([args["seed"], split_id]).permutation(np.arange(count) % cycle)
        noisy = _redundant.corrupted(args["seed"], split_id, count) if task == "redundant" else None
        absent = _absent_cells(args, split_id, count)
        rows = []
        for index, label in enumerate(labels.tolist()):
            name = f"{split}_{index:05d}"
            key = (args["seed"], split_id, index)
            row = [f"images/{name}.png", f"audio/{name}.wav", "", f"masks/{name}.png", "events.tsv"]
            sink = _leaving_out(write, absent[index])
            if task == "default":
                event = _write_sample(root, name, label, key, args, sink)
                row[2] = CLASSES[label]
            else:
                corrupt = (bool(noisy[0][index]), bool(noisy[1][index])) if noisy is not None else (False, False)
                columns, draw_image, draw_audio = _task_sample(task, label, corrupt)
                event = _write_rendered(root, name, key, args, sink, draw_image, draw_audio)
                row[2], row[5:] = columns[0], columns[1:]
            for column in _ABSENT_COLUMNS.get(absent[index], ()):
                if column < len(row):
                    row[column] = ""
            rows.append(row)
            if event is not None and absent[index] != "audio":
                events.append((f"{name}.wav", event))
        _write_table(root / f"{split}.csv", header, rows, ",")


def _task_sample(task: str, label: int, corrupt: tuple[bool, bool]) -> tuple[list[str], Any, Any]:
    """A non-default task's row cells from ``label`` on (class, shadow, sound[, machine]) and its two renderers.

    ``label`` is the cycle's draw: a `_PAIRS` index (binding), a class (redundant) or a machine type (shared).
    """
    if task == "binding":
        shadow, sound = _PAIRS[label]
        columns = [BINDING_CLASSES[int(shadow == sound)], BINDING_SHADOWS[shadow], BINDING_SOUNDS[sound]]
        return columns, partial(binding_image, shadow=shadow), partial(binding_audio, sound=sound)
    if task == "shared":
        sound = f"{SHARED_SOUNDS[label // 4]}_{round(_shared.BANDS[label % 4])}hz"
        columns = [SHARED_CLASSES[_shared.shared_class(label)], SHARED_SHADOWS[label], sound, SHARED_TYPES[label]]
        return columns, partial(_shared.shared_image, machine=label), partial(_shared.shared_audio, machine=label)
    columns = [REDUNDANT_CLASSES[label]]
    columns += [_redundant.NOISE if corrupt[0] else REDUNDANT_SHADOWS[label]]
    columns += [_redundant.NOISE if corrupt[1] else REDUNDANT_SOUNDS[label]]
    draw_image = partial(_redundant.redundant_image, label=label, noise=corrupt[0])
    return columns, draw_image, partial(_redundant.redundant_audio, label=label, noise=corrupt[1])


_ABSENT_COLUMNS = {"image": (0, 3, 5), "audio": (1, 4, 6)}
"""The cells a row without that modality leaves empty: its mask needs the image, its events the audio, and the
``shadow`` / ``sound`` columns describe the file that is not there."""


def _absent_cells(args: dict[str, Any], split_id: int, count: int) -> list[str]:
    """Per row of a split: ``"image"``, ``"audio"`` (the modality it lacks) or ``""``; never both.

    Exactly ``round(rate * count)`` rows of each, disjoint, from one seeded permutation of its own
    stream, so the samples themselves (and which class each row is) do not change with ``missing``.

    Example:
        >>> cells = _absent_cells({"seed": 0, "missing": {"image": 0.3, "audio": 0.2}}, 0, 100)
        >>> cells.count("image"), cells.count("audio"), cells.count("")
        (30, 20, 50)
    """
    rates = args.get("missing") or {}
    order = np.random.default_rng([args["seed"], split_id, 0xAB5E]).permutation(count)
    n_image = round(rates.get("image", 0.0) * count)
    n_audio = min(round(rates.get("audio", 0.0) * count), count - n_image)
    return ["image" if k < n_image else "audio" if k < n_image + n_audio else "" for k in order.tolist()]


def _leaving_out(write: Any, modality: str) -> Any:
    """`write` without the files of `modality` (a dead sensor writes none): images and masks, or the clip."""
    if not modality:
        return write
    folders = {"image": ("images", "masks"), "audio": ("audio",)}[modality]
    return lambda files: write([(path, data) for path, data in files if Path(path).parent.name not in folders])


def _finish(root: Path, args: dict[str, Any], events: list[tuple[str, Event]]) -> None:
    rows = [[name, f"{e.onset:.3f}", f"{e.offset:.3f}", e.label] for name, e in events]
    _write_table(root / "events.tsv", ["filename", "onset", "offset", "event_label"], rows, "\t")
    classes = _TASK_CLASSES[args["task"]]
    (root / "classes.txt").write_text("".join(f"{name}\n" for name in classes))
    # Fixed event order, whatever transients a small dataset happens to contain.
    event_types = {"binding": BINDING_SOUNDS, "redundant": REDUNDANT_SOUNDS, "shared": SHARED_SOUNDS}.get(
        args["task"], EVENT_TYPES
    )
    (root / "event_classes.txt").write_text("".join(f"{name}\n" for name in event_types))
    (root / _STAMP).write_text(json.dumps(_stamp(args), indent=2) + "\n")


def _write_sample(
    root: Path, name: str, label: int, key: tuple[int, int, int], args: dict[str, Any], write: Any = _write_files
) -> Event | None:
    """Render one sample's image, mask and clip and hand their bytes to ``write``; returns its transient, if any."""
    # Separate streams per modality, so the image never depends on how many draws the audio made.
    image_rng, audio_rng = (np.random.default_rng([*key, stream]) for stream in (0, 1))
    image, mask = render_image(image_rng, args["image_size"], moving=label >= 2)
    rate = args["sample_rate"]
    samples, event = render_audio(audio_rng, rate, round(rate * args["clip_seconds"]), transient=label % 2 == 1)
    files = [("images", ".png", _png(image)), ("masks", ".png", _png(mask)), ("audio", ".wav", _wav(samples, rate))]
    write([(os.path.join(root, folder, name + suffix), data) for folder, suffix, data in files])
    return event


_PAIRS = ((0, 0), (1, 1), (0, 1), (1, 0))
"""The binding task's ``(shadow, sound)`` cycle: every 4 samples hold 2 matches and 2 mismatches, and each slat
angle and each sound twice, once matching."""


def _write_rendered(
    root: Path, name: str, key: tuple[int, int, int], args: dict[str, Any], write: Any, draw_image: Any, draw_audio: Any
) -> Event | None:
    """`_write_sample` with a task's renderers: ``draw_image(rng, size)`` and ``draw_audio(rng, rate, num_samples)``."""
    image_rng, audio_rng = (np.random.default_rng([*key, stream]) for stream in (0, 1))
    image, mask = draw_image(image_rng, args["image_size"])
    rate = args["sample_rate"]
    samples, event = draw_audio(audio_rng, rate, round(rate * args["clip_seconds"]))
    files = [("images", ".png", _png(image)), ("masks", ".png", _png(mask)), ("audio", ".wav", _wav(samples, rate))]
    write([(os.path.join(root, folder, name + suffix), data) for folder, suffix, data in files])
    return event


def _png(pixels: np.ndarray) -> bytes:
    """Encode a uint8 ``[H, W]`` or ``[H, W, 3]`` array as PNG.

    Written by hand (no row filters, zlib level 1) because Pillow's encoder costs ~0.5 ms for a
    64x64 image, most of the generator's budget; Pillow reads the result like any other PNG.
    """
    height, width = pixels.shape[:2]
    rows = np.zeros((height, 1 + pixels[0].size), dtype=np.uint8)  # each row starts with filter byte 0 (none)
    rows[:, 1:] = pixels.reshape(height, -1)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2 if pixels.ndim == 3 else 0, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + header + chunk(b"IDAT", zlib.compress(rows.tobytes(), 1)) + chunk(b"IEND", b"")


def _wav(samples: np.ndarray, sample_rate: int) -> bytes:
    """Encode a mono float waveform in [-1, 1] as a 16-bit PCM WAV file.

    The stdlib ``wave`` writer rather than ``soundfile``: the same bytes format, but soundfile's
    in-memory encode costs ~0.2 ms per clip through its callbacks, a fifth of the generator's
    budget. Reading (``sss.data.manifest.load_audio``) uses soundfile.
    """
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(sample_rate)
        writer.writeframes(np.rint(samples * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def _write_table(path: Path, header: list[str], rows: list[list[str]], delimiter: str) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter=delimiter, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def _cache_dir(args: dict[str, Any]) -> Path:
    """``$SSS_CACHE`` (else ``~/.cache/sss``) ``/industrial-<hash of the arguments and the generator version>``."""
    base = Path(os.environ["SSS_CACHE"]) if os.environ.get("SSS_CACHE") else Path.home() / ".cache" / "sss"
    key = hashlib.sha256(json.dumps(_stamp(args), sort_keys=True).encode()).hexdigest()[:10]
    task = args.get("task", "default")
    return base / (f"industrial-{key}" if task == "default" else f"industrial-{task}-{key}")


class IndustrialDataModule(ManifestDataModule):
    """`ManifestDataModule` over the synthetic industrial dataset, generated on first use.

    `setup` generates the dataset with `make_industrial` unless it is already there (one
    process generates, the others wait), printing one line with the folder and the time taken.

    Args:
        root: Dataset folder; None means a cache folder keyed by the generator arguments:
            ``$SSS_CACHE/industrial-<hash>``, or ``~/.cache/sss/industrial-<hash>``.
        n_train: Training samples.
        n_val: Validation samples.
        n_test: Test samples.
        seed: Seed of the generator and of the training shuffle.
        batch_size: Samples per batch.
        num_workers: DataLoader worker processes.
        image_size: Image side in pixels.
        sample_rate: Audio samples per second.
        clip_seconds: Clip length.
        pin_memory: Page-locked batches for faster copies to a GPU; ``"auto"``: on when they go to a CUDA device.
        persistent_workers: Keep workers alive between epochs; None: on with workers (see `ManifestDataModule`).
        prefetch_factor: Batches each worker prepares ahead; None: torch's default (only with workers).
        augment: Random-resized-crop and flip in training. Off by default here: resizing a crop
            up softens the sharp static shadows, and soft edges are exactly the moving-shadow cue.
        cache: None or ``"features"`` (see `ManifestDataModule`).
        cache_dir: Parent folder of feature caches.
        n_mels: Mel bins of cached features (the model's ``n_mels``).
        task: ``"default"`` (classes `CLASSES`), ``"binding"`` (classes `BINDING_CLASSES`: the label
            is whether the shadow's slat angle and the sound agree), ``"redundant"`` (classes
            `REDUNDANT_CLASSES`: both modalities carry the label, each corrupted alone) or ``"shared"`` (classes
            `SHARED_CLASSES`: both show one of sixteen machine types; see `make_industrial`).
        missing: ``{"image": 0.3, "audio": 0.2}``: rows without their image / audio (see `make_industrial`).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     dm = IndustrialDataModule(f"{tmp}/ind", n_train=8, n_val=4, n_test=4, batch_size=4)
        ...     dm.setup("fit")  # doctest: +ELLIPSIS
        ...     batch = next(iter(dm.val_dataloader()))
        sss: generated the industrial dataset (16 samples) in ... s at .../ind
        sss: data .../ind (manifest): 4 classes (multiclass), image+audio, mask, events (3 at 100 frames/s), ...
        >>> dm.num_classes, batch["image"].shape, batch["audio"].shape
        (4, torch.Size([4, 3, 64, 64]), torch.Size([4, 1, 16000]))
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        n_train: PositiveInt = 2000,
        n_val: NonNegativeInt = 400,
        n_test: NonNegativeInt = 400,
        seed: NonNegativeInt = 0,
        batch_size: PositiveInt = 32,
        num_workers: NonNegativeInt = 0,
        image_size: PositiveInt = 64,
        sample_rate: PositiveInt = 16000,
        clip_seconds: PositiveFloat = 1.0,
        pin_memory: bool | Literal["auto"] = "auto",
        persistent_workers: bool | None = None,
        prefetch_factor: PositiveInt | None = None,
        augment: bool = False,
        cache: Literal["features"] | None = None,
        cache_dir: str | None = None,
        n_mels: PositiveInt = 64,
        task: Literal["default", "binding", "redundant", "shared"] = "default",
        missing: Mapping[str, float] | None = None,
    ) -> None:
        args = (n_train, n_val, n_test, seed, image_size, sample_rate, clip_seconds, task, missing)
        self.generator_args = _arguments(*args)
        super().__init__(
            str(_cache_dir(self.generator_args) if root is None else root),
            batch_size=batch_size,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor,
            image_size=image_size,
            sample_rate=sample_rate,
            clip_seconds=clip_seconds,
            augment=augment,
            n_mels=n_mels,
            cache=cache,
            cache_dir=cache_dir,
            seed=seed,
        )
        self.classes = list(_TASK_CLASSES[task])

    def setup(self, stage: str) -> None:
        """Generate the dataset if it is not there yet, then read its manifests."""
        start = time.perf_counter()
        assert self.root is not None
        if _generate_once(self.root, self.generator_args):
            total, seconds = sum(self.generator_args[f"n_{split}"] for split in _SPLITS), time.perf_counter() - start
            print(f"sss: generated the industrial dataset ({total} samples) in {seconds:.1f} s at {self.root}")
        super().setup(stage)
