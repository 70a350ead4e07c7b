"""``model.init_from``: start a model's encoders from another run's (a contrastive pretraining, a supervised run).

Every tensor of each encoder the model has is loaded, or nothing is: the source must hold the encoder
under the same names and shapes (pretrain with the Hunter variant and encoder settings you fine-tune).
The rest of the model (fusion, heads) keeps its fresh initial weights, as do the source's own parts
(projection heads, temperature), which are reported as unused. Only safetensors files are read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from sss.models.loading import LoadReport

__all__ = ["ENCODERS", "init_encoders_from", "init_source"]

ENCODERS = ("image_encoder", "audio_encoder")
"""The parts ``model.init_from`` loads, where the model has them."""

_WHAT = "a run folder (OUTPUT_DIR of sss pretrain or sss fit), its model/ folder, or a checkpoint folder (step_N)"


def init_source(path: str | Path) -> Path:
    """The weights file ``model.init_from=PATH`` reads: a run's ``model/``, else its newest verified checkpoint.

    `path` may be a run folder, a model folder or a checkpoint folder (verified against its manifest first).

    Raises:
        FileNotFoundError: `path` is none of these; the message says what it should be.

    Example:
        >>> init_source("/nonexistent")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        FileNotFoundError: model.init_from=/nonexistent: no such folder; give a run folder (OUTPUT_DIR of ...
    """
    from sss.checkpoint import MARKER, DamagedCheckpointError, newest_verified, verify_checkpoint
    from sss.model_folder import WEIGHTS

    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"model.init_from={path}: no such folder; give {_WHAT}")
    if (folder / MARKER).is_file():
        try:
            verify_checkpoint(folder)  # a damaged or half-written checkpoint is named, never half-loaded
        except DamagedCheckpointError as exc:
            raise FileNotFoundError(f"model.init_from={path}: {exc}; give another checkpoint, or {_WHAT}") from None
        if not (folder / WEIGHTS).is_file():  # a sharded (FSDP) checkpoint: its weights are not one file
            raise FileNotFoundError(f"model.init_from={path}: the checkpoint holds no {WEIGHTS}; give {_WHAT}")
        return folder / WEIGHTS
    for candidate in (folder / WEIGHTS, folder / "model" / WEIGHTS):
        if candidate.is_file():
            return candidate
    newest, damaged = newest_verified(folder / "checkpoints")
    if newest is not None and (newest / WEIGHTS).is_file():
        return newest / WEIGHTS
    why = f" (its checkpoints do not verify: {damaged[0]})" if damaged else ""
    raise FileNotFoundError(f"model.init_from={path}: holds no {WEIGHTS}{why}; give {_WHAT}")


def init_encoders_from(module: nn.Module, path: str | Path) -> list[LoadReport]:
    """Load every tensor of `module`'s encoders from the run, model or checkpoint folder `path`; a report each.

    Raises:
        FileNotFoundError: `path` holds no weights (`init_source`).
        ValueError: The source lacks one of the model's encoders, or holds it with other tensor names or
            shapes (the message names them and says to pretrain the variant you fine-tune); nothing is loaded.

    Example:
        >>> import tempfile, torch
        >>> from sss.testing import BoringModule
        >>> from sss.model_folder import WEIGHTS
        >>> from safetensors.torch import save_file
        >>> source, target = BoringModule(), BoringModule()
        >>> folder = Path(tempfile.mkdtemp())
        >>> save_file(source.state_dict(), str(folder / WEIGHTS))
        >>> [r.summary().split(": ")[1] for r in init_encoders_from(target, folder)]
        ['2 tensors loaded, 0 missing, 0 unexpected, 2 unused', '2 tensors loaded, 0 missing, 0 unexpected, 2 unused']
        >>> torch.equal(target.audio_encoder[1].weight, source.audio_encoder[1].weight)
        True
    """
    import torch
    from safetensors.torch import load_file

    file = init_source(path)
    state = {k.removeprefix("module."): v for k, v in load_file(str(file)).items()}  # a checkpoint's wrapper names
    parts = [(name, getattr(module, name)) for name in ENCODERS if isinstance(getattr(module, name, None), nn.Module)]
    if not parts:
        raise ValueError(f"model.init_from={path}: the model ({type(module).__name__}) has no image or audio encoder")
    loads, reports = [], []
    for name, encoder in parts:
        prefix = f"{name}."
        own = {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
        wanted = encoder.state_dict()
        missing = sorted(set(wanted) - set(own))
        unexpected = sorted(set(own) - set(wanted))
        shapes = sorted(k for k in set(wanted) & set(own) if tuple(own[k].shape) != tuple(wanted[k].shape))
        if missing or unexpected or shapes:
            raise ValueError(_mismatch(path, file, name, missing, unexpected, shapes, own, wanted))
        loads.append((encoder, own))
        unused = sorted(k for k in state if not k.startswith(tuple(f"{n}." for n in ENCODERS)))
        label = f"{name.replace('_', ' ')} (model.init_from)"
        reports.append(LoadReport(label, {"file": str(file)}, sorted(own), unused=unused))
    with torch.no_grad():  # every check passed: now load all, so a refusal leaves the model as it was built
        for encoder, own in loads:
            encoder.load_state_dict(own, strict=True)
    return reports


def _mismatch(
    path: Any,
    file: Path,
    name: str,
    missing: list[str],
    unexpected: list[str],
    shapes: list[str],
    own: Any,
    wanted: Any,
) -> str:
    if not own:
        found = sorted({k.split(".", 1)[0] for k in _load_keys(file)})
        return (
            f"model.init_from={path}: {file} holds no {name} (its parts: {', '.join(found) or 'none'}); the model "
            f"needs one: pretrain with both modalities, or drop model.init_from"
        )
    said = [f"{len(missing)} missing ({', '.join(missing[:3])})"] if missing else []
    said += [f"{len(unexpected)} unexpected ({', '.join(unexpected[:3])})"] if unexpected else []
    said += [f"{k}: {tuple(own[k].shape)} in the file, {tuple(wanted[k].shape)} in the model" for k in shapes[:3]]
    return (
        f"model.init_from={path}: the {name} of {file} does not fit this model's: {'; '.join(said)}. Pretrain the "
        "variant you fine-tune with the same encoder settings (contrastive_small for hunter_small; the same dim, "
        "image_encoder, audio_width, n_mels, ...)"
    )


def _load_keys(file: Path) -> list[str]:
    """The tensor names of a safetensors file, read from its header alone."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        return list(f.keys())
