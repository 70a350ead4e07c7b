"""``sss predict``: per-sample predictions of a model folder for the rows of a manifest."""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

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

__all__ = ["PredictStopped", "predict"]

INPUT_OVERRIDES = ("data.allow_outside_root", "data.on_error")
"""The ``data.*`` overrides that apply to reading the input manifest; every ``model.*`` one rebuilds the model."""


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
    """Write per-sample predictions with class probabilities for the rows of `manifest` to `output` (CSV).

    The model is built with `sss.load_model`: a folder whose config names code outside sss's
    registered models raises `sss.model_folder.UntrustedCodeError` before anything is imported,
    unless `trust_code` (``sss predict --trust-code``). `overrides` (``key=value``) are merged over
    the folder's ``config.yaml``: ``model.*`` ones rebuild the model with a changed setting (the
    weights must still fit it; the allowlist applies to the result);
    ``data.allow_outside_root=true`` accepts manifest paths that leave the manifest's folder, and
    ``data.on_error=skip`` leaves out rows whose files do not read (no prediction row; they are
    listed in ``<output stem>.skipped.csv``). Any other override changes nothing here and is
    refused, naming it.

    `manifest` is a CSV or JSONL file like a training split (``image`` and/or ``audio`` columns,
    paths relative to its folder; labels optional). Inputs are decoded as in evaluation, with the
    model folder's ``preprocessing.json``. Columns: ``row`` (the manifest line), the input paths,
    ``prediction`` (the top class, or ``;``-joined classes over 0.5 for multi-label) and one
    ``prob_<class>`` per class. The rows go to ``<output>.partial``, which takes the name `output` only
    when complete: a failed or stopped predict (an error, Ctrl-C, SIGTERM, SIGHUP: `PredictStopped`)
    removes it and leaves no `output`; a full or read-only disk names the output folder.

    ``runtime="onnx"`` runs the folder's ``model.onnx`` (``sss export ... --format onnx``) with
    onnxruntime instead of building the PyTorch module (`sss.onnx_export.OnnxRunner`; CUDA when
    `device` is ``cuda`` and onnxruntime-gpu is installed); the same CSV. It takes no ``model.*`` override.
    """
    model_dir, manifest, output = Path(model_dir), Path(manifest), Path(output)
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
    dataset = _dataset(manifest, prep, reading, skip_log)
    classes = prep.get("classes") or dataset.classes
    multilabel = prep.get("task") == "multilabel"
    with _partial_file(output) as f:
        _write_rows(f, module, dataset, batch_size, device, classes, multilabel, manifest.parent)
    if skipped := dataset.skip_log.rows():
        print(f"sss predict: {len(skipped)} row(s) of {manifest} could not be read and have no prediction: {skip_log}")
    return output


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
    root: Path,
) -> None:
    # Each batch's rows are written as they come, so memory stays flat over any number of rows (the
    # torch and the onnx runtime alike: both run predict_step here, not through SSSTrainer.predict).
    from torch.utils.data import DataLoader

    from sss.data.manifest import collate
    from sss.trainer.module import output_logits

    writer, last, names = csv.writer(file), -1, None
    with torch.no_grad():
        for i, batch in enumerate(DataLoader(dataset, batch_size=batch_size, collate_fn=collate)):
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            logits = output_logits(module.predict_step(batch, i))
            if logits is None:
                raise RuntimeError(f"{type(module).__name__}.predict_step returned no class logits to write")
            probs = (logits.sigmoid() if multilabel else logits.softmax(-1)).float().cpu()
            if names is None:
                names = classes or [str(k) for k in range(probs.shape[-1])]
                writer.writerow(["row", "image", "audio", "prediction", *(f"prob_{c}" for c in names)])
            for index, p in zip(batch["index"].tolist(), probs, strict=True):
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
                inputs = [_relative(getattr(dataset, key), index, root) for key in ("images", "audio")]
                writer.writerow([dataset.lines[index], *inputs, top, *(f"{float(q):.6f}" for q in p)])
            file.flush()  # each batch's rows are on disk before the next batch runs
    if names is None:  # no row read: the header, with the classes when the folder names them
        writer.writerow(["row", "image", "audio", "prediction", *(f"prob_{c}" for c in classes or [])])


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
