"""``sss predict``: per-sample predictions of a model folder for a manifest, a shards folder or a HF dataset."""

from __future__ import annotations

import contextlib
import csv
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch

from sss._writing import writing_to
from sss.config import ConfigError, instantiate
from sss.errors import SSSError
from sss.model_folder import (
    SETTINGS,
    UntrustedCodeError,
    load_folder_config,
    load_model,
    load_trained_weights,
    read_preprocessing,
    require_complete,
    untrusted_targets,
)

if TYPE_CHECKING:
    from sss.data.manifest import SkipLog
    from sss.data.records import Record, RecordDecoder

__all__ = ["PredictStopped", "predict"]

INPUT_OVERRIDES = ("data.allow_outside_root", "data.on_error")
"""The ``data.*`` overrides that apply to reading the input; every ``model.*`` one rebuilds the model."""
DEFAULT_SPLITS = ("test", "val", "train")
"""The split a shards folder or Hugging Face dataset is predicted on when ``--input`` names none: the first present."""


def predict(
    model_dir: str | Path,
    manifest: str | Path,
    output: str | Path,
    batch_size: int = 32,
    device: str = "cpu",
    trust_code: bool = False,
    overrides: list[str] | tuple[str, ...] = (),
    runtime: str = "torch",
) -> Path:
    """Write per-sample predictions with class probabilities for the samples of `manifest` to `output` (CSV).

    `manifest` (``--input``) is one of
    - a CSV or JSONL file like a training split (``image`` and/or ``audio`` columns, paths relative to its
      folder; labels optional). Columns: ``row`` (the manifest line), the input paths ``image``, ``audio``;
    - a folder written by ``sss data pack`` (it has ``shards.json``), or a Hugging Face dataset: a
      ``save_to_disk`` folder, Parquet in the Hub's layout, or a dataset id in the local cache
      (`sss.data.hf.open_hf`), optionally followed by ``:SPLIT`` (``OUT:val``); without it the first of test,
      val, train present, printed. Labels optional. Columns: ``sample`` (the index in the split), ``file``
      (the shard or Parquet / Arrow file, relative to the folder) and ``key`` (the sample's key).
    Then ``prediction`` (the top class, or ``;``-joined classes over 0.5 for multi-label) and one ``prob_<class>``
    per class. Inputs are decoded as in evaluation, with the model folder's ``preprocessing.json``.

    The model is built with `sss.load_model`: a folder whose config names code outside sss's registered models
    raises `sss.model_folder.UntrustedCodeError` before anything is imported, unless `trust_code`
    (``--trust-code``). `overrides` (``key=value``) are merged over the folder's ``config.yaml``: ``model.*``
    ones rebuild the model with a changed setting (the weights must still fit it; the allowlist applies to the
    result); ``data.allow_outside_root=true`` accepts manifest paths that leave the manifest's folder, and
    ``data.on_error=skip`` leaves out samples (and shard files) that do not read (no prediction row; they are
    listed in ``<output stem>.skipped.csv``). Any other override changes nothing here and is refused, naming it.

    The rows go to ``<output>.partial``, which takes the name `output` only when complete: a failed or stopped
    predict (an error, Ctrl-C, SIGTERM, SIGHUP: `PredictStopped`) removes it and leaves no `output`; a full or
    read-only disk names the output folder. ``runtime="onnx"`` runs the folder's ``model.onnx`` (``sss export
    ... --format onnx``) with onnxruntime instead of building the PyTorch module (`sss.onnx_export.OnnxRunner`;
    CUDA when `device` is ``cuda`` and onnxruntime-gpu is installed); the same CSV. It takes no ``model.*`` override.
    """
    model_dir, output = Path(model_dir), Path(output)
    if output.exists():
        raise FileExistsError(f"{output} already exists; choose another --output or remove it")
    require_complete(model_dir)  # a folder missing its preprocessing would predict with default decoding
    prep = read_preprocessing(model_dir)
    if runtime == "onnx":
        module, reading = _onnx_model(model_dir, list(overrides), device)
    else:
        module, reading = _model(model_dir, list(overrides), device, trust_code)
    skip_log = output.with_name(f"{output.stem}.skipped.csv")
    if reading.get("on_error") == "skip" and skip_log.exists():
        raise FileExistsError(f"{skip_log} already exists (the rows data.on_error=skip leaves out go there); remove it")
    dataset, columns = _input(str(manifest), prep, reading, skip_log)
    classes = prep.get("classes") or dataset.classes
    multilabel = prep.get("task") == "multilabel"
    with _partial_file(output) as f:
        _write_rows(f, module, dataset, batch_size, device, classes, multilabel, columns)
    if skipped := dataset.skip_log.rows():
        unreadable = f"{len(skipped)} {columns.unit} of {manifest} could not be read"
        print(f"sss predict: {unreadable} and have no prediction: {skip_log}")
    return output


@dataclass(frozen=True)
class _Columns:
    """The leading columns of a prediction row: which sample it is."""

    header: list[str]
    cells: Callable[[int, str], list[Any]]
    """(the sample's index in the dataset, its record key) -> the cells under `header`."""
    unit: str = "row(s)"
    """What the skip line counts."""


def _input(text: str, prep: dict[str, Any], reading: dict[str, Any], skip_log: Path) -> tuple[Any, _Columns]:
    # The dataset of --input and how its rows are named: a shards folder or a HF dataset, else a manifest file.
    records = _records(text, prep, reading, skip_log)
    if records is not None:
        return records
    manifest = Path(text)
    dataset = _dataset(manifest, prep, reading, skip_log)

    def cells(index: int, key: str) -> list[Any]:
        inputs = [_relative(getattr(dataset, name), index, manifest.parent) for name in ("images", "audio")]
        return [dataset.lines[index], *inputs]

    return dataset, _Columns(["row", "image", "audio"], cells)


def _records(text: str, prep: dict[str, Any], reading: dict[str, Any], skip_log: Path) -> tuple[Any, _Columns] | None:
    # A shards folder or HF dataset, read as sss fit reads a record split for evaluation; None: a manifest file.
    from sss.data.errors import DataError
    from sss.data.manifest import ImageNorm, SkipLog
    from sss.data.records import RecordDecoder, SourceDataset

    root, split = _split_suffix(text)
    kind = _record_kind(root)
    if kind is None:
        if split is not None:
            what = "a manifest file" if Path(root).is_file() else "not found"
            raise DataError(
                f"{root}: {what}; a split (:{split}) is read from a folder written by sss data pack or a Hugging Face "
                "dataset (a manifest file is its own split: give it without :SPLIT)"
            )
        return None
    on_error = reading.get("on_error", "raise")  # data.allow_outside_root: records name no files to leave a root by
    log = SkipLog(skip_log)
    source = _open_split(kind, root, split, prep.get("classes"), on_error, log)
    settings = {key: prep[key] for key in SETTINGS if key in prep}
    decoder = RecordDecoder.of(source, train=False, image_norm=ImageNorm.of(prep), **settings)
    keyed: Any = _Keyed(decoder)  # the decoder's samples, plus their key
    dataset = SourceDataset(source, keyed, on_error=on_error, skip_log=log)
    files = [_shown(shard.path, Path(root)) for shard in source.shards]

    def cells(index: int, key: str) -> list[Any]:
        return [index, files[dataset.locate(index)[0]], key]

    return dataset, _Columns(["sample", "file", "key"], cells, "sample(s) or file(s)")


def _split_suffix(text: str) -> tuple[str, str | None]:
    """``IN:SPLIT`` as (IN, SPLIT); an existing path (a ``:`` in its name) or a Windows drive is left whole.

    Example:
        >>> _split_suffix("OUT:val"), _split_suffix("owner/name"), _split_suffix(r"C:\\data\\test.csv")
        (('OUT', 'val'), ('owner/name', None), ('C:\\\\data\\\\test.csv', None))
    """
    from sss.data.errors import DataError
    from sss.data.layouts import SPLITS

    head, colon, tail = text.rpartition(":")
    if not colon or not re.fullmatch(r"\w+", tail) or Path(text).exists():
        return text, None
    if tail not in SPLITS:
        raise DataError(f"{text}: unknown split {tail!r}; name one of {', '.join(SPLITS)} (IN:test)")
    return head, tail


def _record_kind(root: str) -> str | None:
    """``"shards"`` (a folder with ``shards.json``), ``"hf"`` (a Hugging Face dataset) or None (a manifest file)."""
    from sss.data.errors import DataError
    from sss.data.hf import locate  # its own locating: folder layouts, a dataset id in the local Hub cache

    path = Path(root)
    if (path / "shards.json").is_file():
        return "shards"
    if path.is_file() or path.suffix.lower() in (".csv", ".jsonl", ".json"):
        return None
    try:
        locate(root)  # reads no data; never downloads
    except DataError as err:
        if path.is_dir():
            raise DataError(
                f"{err}; nor shards.json (sss data pack); or give a manifest file ({root}/test.csv)"
            ) from None
        if path.parent.is_dir():
            return None  # a manifest named by its stem (data/test for data/test.csv), as before
        raise
    return "hf"


def _open_split(kind: str, root: str, split: str | None, classes: Any, on_error: str, log: SkipLog) -> Any:
    """The `split` of a record dataset (None: the first of `DEFAULT_SPLITS` present), its choice printed."""
    from sss.data.errors import DataError
    from sss.data.hf import open_hf
    from sss.data.layouts import SPLITS
    from sss.data.shards import open_shards

    def opened(name: str, on_error: str, log: SkipLog | None) -> Any:
        if kind == "shards":
            return open_shards(root, name, on_error=on_error, skip_log=log)
        return open_hf(root, name, classes=classes, on_error=on_error, skip_log=log)  # labels: the model's classes

    for name in [split] if split else DEFAULT_SPLITS:
        source = opened(name, on_error, log)
        if source is not None:
            how = "" if split else f"; the first of {', '.join(DEFAULT_SPLITS)} it has: {root}:SPLIT picks one"
            print(f"sss predict: split {name} of {root} ({len(source)} samples{how})", flush=True)
            return source
    present = [name for name in SPLITS if _has_split(opened, name)]
    raise DataError(
        f"{root}: no split {split or ' or '.join(DEFAULT_SPLITS)}; it has "
        f"{', '.join(present) or 'none'}: name one as {root}:SPLIT"
    )


def _has_split(opened: Callable[[str, str, Any], Any], name: str) -> bool:
    from sss.data.errors import DataError

    try:
        return opened(name, "raise", None) is not None
    except DataError:
        return True  # there, but damaged: named when it is the one asked for


class _Keyed:
    """A `RecordDecoder` whose samples also carry their record's key, for the ``key`` column."""

    def __init__(self, decoder: RecordDecoder) -> None:
        self.decoder, self.image_norm = decoder, decoder.image_norm

    def __call__(self, record: Record, index: int) -> dict[str, Any]:
        return {**self.decoder(record, index), "key": record.key}


def _shown(path: str, root: Path) -> str:
    """`path` relative to the dataset folder `root` when inside it (a cached id: the full path)."""
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return path


def _dataset(manifest: Path, prep: dict[str, Any], reading: dict[str, Any], skip_log: Path) -> Any:
    # The manifest's rows, decoded as the model folder's preprocessing.json says (labels optional): sizes and
    # rates, and the image mean/std/filter the weights were bound to (a folder exported before those were
    # recorded has none: ImageNet's, as it was trained with).
    from sss.data.manifest import ImageNorm, ManifestDataset

    settings = {key: prep[key] for key in SETTINGS if key in prep}
    return ManifestDataset(
        manifest.parent,
        manifest.stem,
        classes=prep.get("classes"),
        require_label=False,
        skip_log=skip_log,
        image_norm=ImageNorm.of(prep),
        **settings,
        **reading,
    )


@contextlib.contextmanager
def _partial_file(output: Path) -> Iterator[IO[str]]:
    """Write `output` as ``<output>.partial`` and give it its name when complete; a failure or a stop removes it.

    A SIGTERM or SIGHUP (a scheduler's stop, a closed terminal) ends the block like Ctrl-C does, so the
    partial file goes too; only a SIGKILL leaves it, named ``*.partial``: never a CSV that looks complete.
    A full or read-only disk names the output folder. The folders this call created go as well.
    """
    partial = output.with_name(f"{output.name}.partial")
    created = [p for p in (output.parent, *output.parent.parents) if not p.exists()]  # innermost first
    mine = False
    try:
        with writing_to(output.parent), _signals_stop(), _open_new(partial, output) as f:
            mine = True
            yield f
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        if mine:  # not the .partial of another predict that is writing it
            partial.unlink(missing_ok=True)
        for folder in created:
            with contextlib.suppress(OSError):  # the folder of a predict that wrote into it meanwhile stays
                folder.rmdir()
        raise
    _publish(partial, output)


def _open_new(partial: Path, output: Path) -> IO[str]:
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        return partial.open("x", newline="")  # "x": never another predict's file
    except FileExistsError:
        raise FileExistsError(
            f"{partial} exists: an sss predict writing {output.name} is running, or one was killed; "
            "remove it (or choose another --output)"
        ) from None


def _publish(partial: Path, output: Path) -> None:
    # A hard link never replaces a file (a rename would): an --output that appeared meanwhile is kept.
    try:
        os.link(partial, output)
    except FileExistsError:
        raise FileExistsError(f"{output} appeared during predict; the predictions are in {partial}") from None
    except OSError:  # a file system without hard links (FAT, some network mounts): check, then rename
        if output.exists():
            raise FileExistsError(f"{output} appeared during predict; the predictions are in {partial}") from None
        os.replace(partial, output)
        return
    partial.unlink()


class PredictStopped(SSSError):
    """``sss predict`` got SIGTERM or SIGHUP: it stopped, and wrote no output (exit 128 + the signal number)."""

    def __init__(self, signum: int) -> None:
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        super().__init__(f"sss predict stopped by {name}; no predictions were written (run it again to write them)")


class _Stop(BaseException):
    # A BaseException, as KeyboardInterrupt: the decoders' `except Exception` (a bad file) must not catch it.
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_stop() -> Iterator[None]:
    # Python's default SIGTERM and SIGHUP end the process on the spot, skipping every cleanup.
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise _Stop(signum)

    kinds = [s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    before = {s: signal.signal(s, stop) for s in kinds}
    try:
        yield
    except _Stop as exc:
        raise PredictStopped(exc.signum) from None
    finally:
        for kind, handler in before.items():
            signal.signal(kind, handler)


def _write_rows(
    file: Any,
    module: Any,
    dataset: Any,
    batch_size: int,
    device: str,
    classes: list[str] | None,
    multilabel: bool,
    columns: _Columns,
) -> None:
    # Each batch's rows are written as they come, so memory stays flat over any number of rows (the
    # torch and the onnx runtime alike: both run predict_step here, not through SSSTrainer.predict).
    from torch.utils.data import DataLoader

    from sss.data.manifest import collate
    from sss.trainer.module import output_logits

    writer, last, names = csv.writer(file), -1, None
    with torch.no_grad():
        for i, batch in enumerate(DataLoader(dataset, batch_size=batch_size, collate_fn=collate)):
            keys = batch.pop("key", None) or [""] * len(batch["index"])  # a record's key; not the model's input
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            logits = output_logits(module.predict_step(batch, i))
            if logits is None:
                raise RuntimeError(f"{type(module).__name__}.predict_step returned no class logits to write")
            probs = (logits.sigmoid() if multilabel else logits.softmax(-1)).float().cpu()
            if names is None:
                names = classes or [str(k) for k in range(probs.shape[-1])]
                writer.writerow([*columns.header, "prediction", *(f"prob_{c}" for c in names)])
            for index, key, p in zip(batch["index"].tolist(), keys, probs, strict=True):
                # A skipped row is served as the next good one (wrapping to the first rows at the end),
                # and the loader is in order: an index not above the last one written is such a repeat.
                if index <= last:
                    continue
                last = index
                top = (
                    ";".join(c for c, q in zip(names, p, strict=True) if q > 0.5)
                    if multilabel
                    else names[int(p.argmax())]
                )
                writer.writerow([*columns.cells(index, key), top, *(f"{float(q):.6f}" for q in p)])
            file.flush()  # each batch's rows are on disk before the next batch runs
    if names is None:  # no row read: the header, with the classes when the folder names them
        writer.writerow([*columns.header, "prediction", *(f"prob_{c}" for c in classes or [])])


def _model(model_dir: Path, overrides: list[str], device: str, trust_code: bool) -> tuple[torch.nn.Module, dict]:
    # The module, and the ManifestDataset settings the overrides give. Without overrides, sss.load_model
    # as it stands; the folder's own config never loosens how the input manifest is read.
    if not overrides:
        return load_model(model_dir, device, trust_code=trust_code), {}
    source, sources = model_dir / "config.yaml", {}
    cfg = load_folder_config(model_dir, overrides, sources)  # unknown keys, wrong types: named, with the closest key
    for item in overrides:
        key = item.split("=", 1)[0]
        if key != "model" and not key.startswith("model.") and key not in INPUT_OVERRIDES:
            raise ConfigError(
                f"{source}: override {item!r}: sss predict reads only the --input manifest with this model folder; it "
                "takes model.KEY=VALUE (rebuilds the model), data.allow_outside_root=true and data.on_error=skip"
            )
    given = [key for key in INPUT_OVERRIDES if sources.get(key) == "override"]  # not the folder's own value
    reading = {key.split(".", 1)[1]: cfg.data[key.split(".", 1)[1]] for key in given}
    if not any(item.split("=", 1)[0].split(".")[0] == "model" for item in overrides):
        return load_model(model_dir, device, trust_code=trust_code), reading
    if not trust_code and (found := untrusted_targets(cfg.model)):
        raise UntrustedCodeError(source, found)
    module = instantiate(cfg.model)
    load_trained_weights(
        module, model_dir, "A model.* override must keep the architecture the weights were trained with."
    )
    return module.to(device).eval(), reading


def _onnx_model(model_dir: Path, overrides: list[str], device: str) -> tuple[Any, dict]:
    # The graph runs no code the folder names, so no allowlist; a model.* override cannot change a graph.
    from sss.onnx_export import OnnxRunner

    source, sources = model_dir / "config.yaml", {}
    for item in overrides:
        if item.split("=", 1)[0] not in INPUT_OVERRIDES:
            raise ConfigError(
                f"{source}: override {item!r}: sss predict --runtime onnx runs the exported graph as it is; it takes "
                "data.allow_outside_root=true and data.on_error=skip (model.* overrides: use --runtime torch)"
            )
    runner = OnnxRunner(model_dir, device)
    if not overrides:
        return runner, {}
    cfg = load_folder_config(model_dir, overrides, sources)
    given = [key for key in INPUT_OVERRIDES if sources.get(key) == "override"]
    return runner, {key.split(".", 1)[1]: cfg.data[key.split(".", 1)[1]] for key in given}


def _relative(paths: list[str], index: int, root: Path) -> str:
    if index >= len(paths) or not paths[index]:
        return ""
    try:
        return str(Path(paths[index]).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(paths[index])
