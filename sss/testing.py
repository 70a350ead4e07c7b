"""Test helpers: a tiny `BoringModule`, its data, `EventRecorder`, `count_host_syncs`, `subprocess_env`."""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from sss.callbacks.base import Callback, Event
from sss.data.datamodule import DataModule
from sss.trainer.module import LitModule

if TYPE_CHECKING:
    from sss.trainer.trainer import SSSTrainer

aten = torch.ops.aten

__all__ = [
    "BoringDataModule",
    "BoringDataset",
    "BoringModule",
    "EventRecorder",
    "HostSync",
    "HostSyncs",
    "RandomClips",
    "boring_loader",
    "count_host_syncs",
    "hub_parquet",
    "subprocess_env",
]


class _Add(nn.Module):
    """Fusion of the boring model: pooled image + audio features -> logits."""

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(dim, num_classes)

    def forward(self, image: Tensor | None, audio: Tensor | None) -> Tensor:
        parts = [t for t in (image, audio) if t is not None]
        return self.head(torch.stack(parts).sum(0))


class BoringModule(LitModule):
    """A tiny two-modality classifier (4x4 images, 16-sample audio) for tests.

    Example:
        >>> batch = next(iter(boring_loader(n=4, batch_size=4)))
        >>> BoringModule()(batch).shape
        torch.Size([4, 2])
    """

    def __init__(self, dim: int = 8, num_classes: int = 2) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.image_encoder = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, dim))
        self.audio_encoder = nn.Sequential(nn.Flatten(), nn.Linear(16, dim))
        self.fusion_head = _Add(dim, num_classes)

    def compute_loss(self, outputs: Tensor, batch: dict[str, Any]) -> Tensor:
        return F.cross_entropy(outputs, batch["label"])


class BoringDataset(torch.utils.data.Dataset):
    """`n` deterministic samples in the batch format of `sss` (image [3,4,4], audio [1,16], label).

    Example:
        >>> sorted(BoringDataset(2)[0])
        ['audio', 'image', 'index', 'label']
    """

    def __init__(self, n: int = 64, seed: int = 0, num_classes: int = 2) -> None:
        g = torch.Generator().manual_seed(seed)
        self.image = torch.randn(n, 3, 4, 4, generator=g)
        self.audio = torch.randn(n, 1, 16, generator=g)
        # a learnable label: the sign of a fixed direction in the inputs
        self.label = ((self.image.flatten(1)[:, 0] + self.audio.flatten(1)[:, 0]) > 0).long() % num_classes

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": self.image[i], "audio": self.audio[i], "label": self.label[i], "index": i}


class RandomClips(torch.utils.data.Dataset):
    """`n` random clips at the hunter models' input sizes: 64x64 images, 16 kHz audio, one of 4 labels.

    Example:
        >>> {key: tuple(value.shape) for key, value in RandomClips(2, samples=8000)[0].items()}
        {'image': (3, 64, 64), 'audio': (1, 8000), 'label': ()}
    """

    def __init__(self, n: int, samples: int = 8000) -> None:
        g = torch.Generator().manual_seed(0)
        self.image, self.audio = torch.randn(n, 3, 64, 64, generator=g), torch.randn(n, 1, samples, generator=g) * 0.1
        self.label = torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": self.image[i], "audio": self.audio[i], "label": self.label[i]}


def boring_loader(
    n: int = 64, batch_size: int = 8, shuffle: bool = False, seed: int = 0
) -> torch.utils.data.DataLoader:
    """A DataLoader over `BoringDataset`.

    Example:
        >>> len(boring_loader(n=10, batch_size=4))
        3
    """
    return torch.utils.data.DataLoader(BoringDataset(n, seed), batch_size=batch_size, shuffle=shuffle)


class BoringDataModule(DataModule):
    """`BoringDataset` train and validation splits as a `DataModule` (classes ``a``, ``b``), for run-layer tests.

    Example:
        >>> dm = BoringDataModule(n_train=16, batch_size=8)
        >>> dm.setup("fit"); len(dm.train_dataloader()), dm.classes
        (2, ['a', 'b'])
    """

    def __init__(self, n_train: int = 64, n_val: int = 16, batch_size: int = 8, seed: int = 0) -> None:
        super().__init__()
        self.classes = ["a", "b"]
        self.n_train, self.n_val, self.batch_size, self.seed = n_train, n_val, batch_size, seed

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return boring_loader(self.n_train, self.batch_size, shuffle=True, seed=self.seed)

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return boring_loader(self.n_val, self.batch_size, seed=self.seed + 1)


class EventRecorder(Callback):
    """Records every event fired, in order, as ``Event`` members in `events`.

    Example:
        >>> rec = EventRecorder()
        >>> rec.on_fit_start(None, None); rec.events
        [<Event.FIT_START: 'on_fit_start'>]
    """

    def __init__(self) -> None:
        self.events: list[Event] = []

    def _record(self, event: Event) -> None:
        self.events.append(event)


def _recorder(event: Event) -> Any:
    def method(self: EventRecorder, trainer: SSSTrainer, module: LitModule) -> None:
        self._record(event)

    method.__name__ = event.value
    return method


for _event in Event:  # one recording method per event, so a new event is recorded without edits here
    setattr(EventRecorder, _event.value, _recorder(_event))


# ---------------------------------------------------------------------- host syncs
_TORCH_DIR = str(Path(torch.__file__).parent)
_THIS_FILE = __file__
_LIBRARIES = tuple({_TORCH_DIR, sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], "<frozen "})
"""Frames a sync is not blamed on: torch, Accelerate and the standard library; the culprit is the caller."""

_TO_HOST = ("tolist", "cpu", "numpy")
"""Tensor methods that copy a tensor to the host; on a CPU they reach no operator the dispatcher sees."""


@dataclass(frozen=True)
class HostSync:
    """One point where the host waits for the device: what did it, from where.

    Example:
        >>> HostSync("item", "sss/callbacks/progress.py:230 in _info", ("_train_step", "_info"), None).where
        'sss/callbacks/progress.py:230 in _info'
    """

    kind: str
    """``item`` (``.item()``, ``float(t)``, ``int(t)``, ``bool(t)``, a format), ``nonzero`` (a data-dependent
    shape), ``copy`` (a device-to-CPU copy), or on a CPU device the method called: ``tolist``, ``cpu``, ``numpy``."""
    where: str
    """``file:line in function`` of the innermost frame outside torch, Accelerate and the standard library."""
    functions: tuple[str, ...]
    """The names (``co_qualname``) of the functions on the stack, outermost first (what `HostSyncs.inside` reads)."""
    label: Any
    """`HostSyncs.label` when the sync happened (e.g. the optimizer step a benchmark is in)."""


class HostSyncs:
    """What `count_host_syncs` saw: the syncs in order, with filters and a report that names the culprits.

    Example:
        >>> with count_host_syncs() as syncs:
        ...     _ = float(torch.ones(()))
        >>> len(syncs), syncs.records[0].kind
        (1, 'item')
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.records: list[HostSync] = []
        self.label: Any = None
        """Stamped on each sync from now on; a callback can set it to the step being run."""
        self.counting = True
        """While False, syncs are not recorded (to leave out a part of what runs inside the probe)."""

    def __len__(self) -> int:
        return len(self.records)

    def inside(self, function: str, *, outside: tuple[str, ...] = ()) -> list[HostSync]:
        """The syncs made while `function` ran (a ``co_qualname`` or its last part), and none of `outside` did.

        Example:
            >>> def step():
            ...     return torch.ones(2).tolist()
            >>> with count_host_syncs() as syncs:
            ...     _, _ = step(), torch.ones(()).item()
            >>> len(syncs.inside("step")), len(syncs.inside("step", outside=("step",)))
            (1, 0)
        """

        def runs(record: HostSync, name: str) -> bool:
            return any(f == name or f.endswith("." + name) for f in record.functions)

        return [r for r in self.records if runs(r, function) and not any(runs(r, o) for o in outside)]

    def report(self, records: list[HostSync] | None = None) -> str:
        """One line per culprit, most syncs first: ``3 x item at sss/callbacks/progress.py:230 in _info``.

        Example:
            >>> with count_host_syncs() as syncs:
            ...     for _ in range(3):
            ...         _ = bool(torch.ones(()))
            >>> print(syncs.report())  # doctest: +ELLIPSIS
            3 x item at <doctest ...>:3 in <module>
        """
        counts = Counter((r.kind, r.where) for r in (self.records if records is None else records))
        return "\n".join(f"{n} x {kind} at {where}" for (kind, where), n in counts.most_common()) or "no host syncs"

    def _add(self, kind: str) -> None:
        if not self.counting:
            return
        frames = []
        frame = sys._getframe(2)
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
        code = [f.f_code for f in frames]
        if self.device.type == "cpu" and any(c.co_filename.startswith(f"{_TORCH_DIR}/optim/") for c in code):
            # torch.optim reads its step counters with .item(); they stay on the CPU when the
            # parameters are on CUDA (capturable=False), so on a GPU that read waits for nothing.
            return
        culprit = next((f for f in frames if not f.f_code.co_filename.startswith(_LIBRARIES)), frames[0])
        where = f"{_short(culprit.f_code.co_filename)}:{culprit.f_lineno} in {culprit.f_code.co_name}"
        names = tuple(getattr(c, "co_qualname", c.co_name) for c in reversed(code))
        self.records.append(HostSync(kind, where, names, self.label))


def _short(filename: str) -> str:
    # sss/... or tests/... relative to the project, else the file's name as Python knows it
    parts = Path(filename).parts
    for root in ("sss", "tests", "benchmarks"):
        if root in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(root) - 1 :])
    return filename


class _SyncMode(TorchDispatchMode):
    """Sees every aten operator; reports those that make the host wait for `syncs.device`."""

    def __init__(self, syncs: HostSyncs) -> None:
        super().__init__()
        self.syncs = syncs
        self.on_cpu = syncs.device.type == "cpu"

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        packet = func.overloadpacket
        source = args[0] if args and isinstance(args[0], Tensor) else None
        on_device = source is not None and (self.on_cpu or source.device.type == self.syncs.device.type)
        if packet is aten._local_scalar_dense and on_device:
            self.syncs._add("item")
        elif packet in _DATA_DEPENDENT and on_device:
            self.syncs._add("nonzero")
        elif not self.on_cpu and source is not None and _to_cpu(packet, args, kwargs):
            self.syncs._add("copy")
        return func(*args, **kwargs)


_DATA_DEPENDENT = (aten.nonzero, aten.masked_select, aten._unique2, aten.unique_consecutive, aten.unique_dim)


def _to_cpu(packet: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether an operator copies a device tensor to the CPU: ``_to_copy(src, device=cpu)``, ``copy_(cpu_dst, src)``."""
    if packet is aten._to_copy:
        target = kwargs.get("device")
        return args[0].device.type != "cpu" and target is not None and torch.device(target).type == "cpu"
    if packet is aten.copy_ and len(args) > 1 and isinstance(args[1], Tensor):
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    return False


@contextlib.contextmanager
def count_host_syncs(device: str | torch.device | None = None) -> Iterator[HostSyncs]:
    """Record each point where the host waits for `device` (the one the model runs on), with its culprit.

    A host sync is a read of a device value by Python: ``.item()``, ``float(t)``, ``int(t)``,
    ``bool(t)`` (an ``if`` on a tensor), formatting a tensor (all reach ``aten._local_scalar_dense``),
    an operator whose output size depends on the data (``nonzero``, ``masked_select``, ``unique``), and a
    copy of a device tensor to the CPU (``aten._to_copy``/``copy_`` from the device to the CPU: what
    ``.cpu()``, ``.tolist()`` and ``.numpy()`` do). On a GPU each one drains the queue the host had
    built up. Each `HostSync` names the innermost frame outside torch, Accelerate and the standard
    library, and keeps the names of the functions on the stack, so a test can count the syncs of a
    part of the loop (`HostSyncs.inside`) and a failure names the line that caused them
    (`HostSyncs.report`).

    On a CPU (`device` None or ``cpu``) every tensor lives on the host, so the probe counts what
    *would* wait on a GPU: every ``_local_scalar_dense`` and data-dependent shape, and each call of
    ``Tensor.tolist``, ``.cpu`` and ``.numpy`` (also ``numpy.asarray(t)``), which on a CPU reach no
    operator. Left out: ``torch.optim``'s reads of its step counters, which stay on the CPU when
    the parameters are on CUDA. The CPU figure is an upper bound of the GPU one: ``t.cpu().tolist()``
    counts 2 here and 1 on a GPU, and a tensor the code itself made on the CPU counts here only.
    Syncs in other threads than the one that entered are not counted (autograd's are), nor those
    inside the DataLoader's worker processes.

    Example:
        >>> t = torch.arange(3.0)
        >>> with count_host_syncs() as syncs:
        ...     _ = t.sum().item(), float(t[0]), bool(t.any()), t.tolist(), t * 2
        >>> len(syncs), [r.kind for r in syncs.records]
        (4, ['item', 'item', 'item', 'tolist'])
    """
    syncs = HostSyncs(torch.device(device) if device is not None else torch.device("cpu"))
    originals: dict[str, Any] = {}
    if syncs.device.type == "cpu":
        owner = threading.get_ident()

        def counted(name: str, original: Any) -> Any:
            def method(self: Tensor, *args: Any, **kwargs: Any) -> Any:
                if threading.get_ident() == owner and self.device.type == "cpu":
                    syncs._add(name)
                return original(self, *args, **kwargs)

            return method

        for name in _TO_HOST:
            originals[name] = getattr(Tensor, name)
            setattr(Tensor, name, counted(name, originals[name]))
    try:
        with _SyncMode(syncs):
            yield syncs
    finally:
        for name, original in originals.items():
            setattr(Tensor, name, original)


SOURCE_ROOT = str(Path(__file__).resolve().parents[1])
"""The folder holding the `sss` package this process imported (a checkout, or site-packages)."""


def subprocess_env(*paths: str | os.PathLike[str], **overrides: str) -> dict[str, str]:
    """The environment of a test's child process: this one's, with this process's `sss` first on ``PYTHONPATH``.

    `paths` (e.g. ``tests/scripts``) come next, then the ``PYTHONPATH`` this process had; `overrides`
    are set last. A child given ``PYTHONPATH=tests/scripts`` alone imports whichever `sss` is
    installed, so a test of a checkout would run another copy's code and could not fail.

    Example:
        >>> env = subprocess_env("/scripts", OMP_NUM_THREADS="1")
        >>> env["PYTHONPATH"].split(os.pathsep)[:2] == [SOURCE_ROOT, "/scripts"]
        True
        >>> env["OMP_NUM_THREADS"]
        '1'
    """
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    entries = [SOURCE_ROOT, *(os.fspath(p) for p in paths), *inherited]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(entries)), **overrides}


def _cell(path: str) -> dict[str, Any] | None:
    """An embedded file cell; None (an empty cell, as the Hub stores one) for "": a row without that modality."""
    return {"bytes": Path(path).read_bytes(), "path": os.path.basename(path)} if path else None


def hub_parquet(
    src: str | os.PathLike[str], out: str | os.PathLike[str], *, files: int = 2, row_group: int = 8
) -> Path:
    """Write a manifest folder's splits as a Hugging Face dataset in the Hub's Parquet layout (for tests, benchmarks).

    ``OUT/data/{train,validation,test}-0000K-of-0000N.parquet`` with the file bytes embedded, as the Hub stores
    them: ``image`` an ``Image()`` feature, ``audio`` an ``Audio()`` one (its {bytes, path} struct: written
    without encoding, which needs torchcodec), ``label`` a ``ClassLabel`` named by the folder's classes;
    `files` files per split, row groups of `row_group` rows. Needs ``datasets`` (the ``datasets`` extra).

    Example:
        >>> import tempfile
        >>> from sss.data.synthetic import make_industrial
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     src = make_industrial(f"{tmp}/ind", n_train=6, n_val=2, n_test=0, image_size=32)
        ...     out = hub_parquet(src, f"{tmp}/hub", files=2, row_group=2)
        ...     sorted(p.name for p in (out / "data").iterdir())
        ['train-00000-of-00002.parquet', 'train-00001-of-00002.parquet',
         'validation-00000-of-00002.parquet', 'validation-00001-of-00002.parquet']
    """
    import datasets

    from sss.data.manifest import ManifestDataset

    out = Path(out)
    (out / "data").mkdir(parents=True)
    struct = {"bytes": datasets.Value("binary"), "path": datasets.Value("string")}
    for split, name in (("train", "train"), ("val", "validation"), ("test", "test")):
        try:
            rows = ManifestDataset(src, split)
        except FileNotFoundError:
            continue
        cells = lambda paths: [_cell(p) for p in paths]  # noqa: E731
        features = datasets.Features(
            {"image": datasets.Image(), "audio": struct, "label": datasets.ClassLabel(names=rows.classes)}
        )
        table = datasets.Dataset.from_dict(
            {"image": cells(rows.images), "audio": cells(rows.audio), "label": list(rows.targets)}, features=features
        ).cast_column("audio", datasets.Audio(decode=False))
        quiet = not datasets.utils.are_progress_bars_disabled()
        datasets.utils.disable_progress_bars()  # to_parquet's bar per file; the caller's setting is given back below
        try:
            for k in range(files):
                part = table.shard(files, k, contiguous=True)
                part.to_parquet(str(out / "data" / f"{name}-{k:05d}-of-{files:05d}.parquet"), batch_size=row_group)
        finally:
            if quiet:
                datasets.utils.enable_progress_bars()
    return out
