"""``sss convert panns IN.pth OUT.safetensors``: an official PANNs checkpoint (a pickle) to a safetensors file.

PANNs' released checkpoints (Cnn14_mAP=0.431.pth, Cnn10, Cnn6) are ``torch.save`` pickles of a dict whose
``"model"`` holds the state dict; some hold numpy objects beside it (an ``iteration`` counter, a sampler's
arrays). A pickle runs whatever code its globals name, so the file is read with
``torch.load(weights_only=True)`` and only the numpy globals that rebuild arrays and scalars allow-listed:
any other global (``os.system``, a class of the training code) is refused before it is called. The tensors
are written to a safetensors file that ``model.audio_pretrained`` loads (`sss.models.audio.panns`).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sss._writing import writing_to
from sss.config.errors import ConfigError

__all__ = ["convert_panns", "load_numpy_pickle", "numpy_globals", "recognise_panns"]

FRONTEND_KEYS = ("spectrogram_extractor.", "logmel_extractor.")
"""PANNs' front-end tensors (STFT kernels, the mel filterbank ``melW``): constants sss computes itself."""


def numpy_globals() -> list[Any]:
    """The only pickle globals a PANNs checkpoint may name: what rebuilds numpy arrays, dtypes and scalars.

    Each under its numpy 2 name and its numpy 1 name (``numpy.core.multiarray``), so a checkpoint pickled
    under either loads. Nothing here runs code beyond building an array or a scalar.

    Example:
        >>> names = [g[1] if isinstance(g, tuple) else g.__name__ for g in numpy_globals()]
        >>> "numpy.core.multiarray._reconstruct" in names, "system" in names
        (True, False)
    """
    import numpy as np
    from numpy._core import multiarray

    found: list[Any] = [np.ndarray, np.dtype, multiarray._reconstruct, multiarray.scalar]
    found += [(multiarray._reconstruct, "numpy.core.multiarray._reconstruct")]
    found += [(multiarray.scalar, "numpy.core.multiarray.scalar")]
    # The dtype classes numpy 2 pickles a dtype with: booleans, integers and floats only (no object dtype).
    kinds = ("Bool", "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64")
    kinds += ("Float16", "Float32", "Float64", "LongDouble", "Long", "ULong", "LongLong", "ULongLong")
    return found + [getattr(np.dtypes, f"{kind}DType") for kind in kinds if hasattr(np.dtypes, f"{kind}DType")]


def load_numpy_pickle(path: str | os.PathLike[str]) -> Any:
    """``torch.load(path, weights_only=True)`` with only `numpy_globals` allowed; any other global is refused.

    Raises:
        ConfigError: The file names a global outside the list (it is not called), or is no torch pickle.

    Example:
        >>> import tempfile, numpy as np, torch
        >>> path = tempfile.mkdtemp() + "/c.pth"
        >>> torch.save({"model": {"w": torch.ones(1)}, "iteration": np.int64(7)}, path)
        >>> load_numpy_pickle(path)["iteration"]
        np.int64(7)
    """
    try:
        with torch.serialization.safe_globals(numpy_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        name = found.group(1) if found else "an unknown global"
        raise ConfigError(
            f"{path} needs the pickle global {name!r}, which sss never loads (only numpy arrays and scalars): "
            "not an official PANNs checkpoint"
        ) from None
    except (RuntimeError, EOFError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{path} is not a torch checkpoint sss can read ({first})") from None


def recognise_panns(state: dict[str, torch.Tensor]) -> tuple[str, list[int]]:
    """The PANNs architecture (``cnn14``, ``cnn10``, ``cnn6``) of a state dict, from its keys, and its block widths.

    Raises:
        ConfigError: Not a Cnn14 / Cnn10 / Cnn6 state dict.

    Example:
        >>> import torch
        >>> state = {f"conv_block{i}.conv1.weight": torch.zeros(8, 1, 5, 5) for i in range(1, 5)}
        >>> recognise_panns(state)
        ('cnn6', [8, 8, 8, 8])
    """
    blocks = sorted({int(m.group(1)) for k in state if (m := re.match(r"conv_block(\d+)\.", k))})
    kernel = state["conv_block1.conv1.weight"].shape[-1] if "conv_block1.conv1.weight" in state else None
    two_convs = "conv_block1.conv2.weight" in state
    arch = {
        (6, 3, True): "cnn14",
        (4, 3, True): "cnn10",
        (4, 5, False): "cnn6",
    }.get((len(blocks), kernel, two_convs))
    if arch is None or blocks != list(range(1, len(blocks) + 1)):
        raise ConfigError(
            f"not a PANNs Cnn14, Cnn10 or Cnn6 state dict ({len(blocks)} conv blocks, kernel {kernel}): "
            "sss converts those three (32 kHz checkpoints)"
        )
    return arch, [int(state[f"conv_block{i}.conv1.weight"].shape[0]) for i in blocks]


def convert_panns(src: str | os.PathLike[str], out: str | os.PathLike[str], echo: Callable[[str], Any] = print) -> Path:
    """Convert the PANNs checkpoint `src` to the safetensors file `out` (never overwritten); return `out`.

    The state dict is ``obj["model"]`` (or the pickle itself when it is a state dict); a ``module.`` prefix
    (DataParallel) is removed. The front-end tensors are checked against sss's own log-mel (the filterbank
    ``logmel_extractor.melW`` to 1e-4) and left out; ``fc_audioset.*`` is kept (the loader drops it). The
    file is written to a temporary ``.partial`` beside `out` and renamed, so a crash leaves no half file.

    Raises:
        ConfigError: `out` exists or is no .safetensors, `src` is missing or not a PANNs checkpoint.

    Example:
        >>> import tempfile, torch
        >>> from sss.models.audio.panns import PannsEncoder
        >>> model = PannsEncoder("cnn6", dim=4, widths=[2, 2, 2, 2])
        >>> folder = tempfile.mkdtemp()
        >>> torch.save({"model": model.state_dict()}, folder + "/Cnn6.pth")
        >>> path = convert_panns(folder + "/Cnn6.pth", folder + "/cnn6.safetensors", echo=lambda line: None)
        >>> path.name
        'cnn6.safetensors'
    """
    src, out = Path(src), Path(out)
    _check_paths(src, out)
    state = _state_dict(load_numpy_pickle(src), src)
    try:
        arch, widths = recognise_panns(state)
    except ConfigError as exc:
        raise ConfigError(f"{src}: {exc}") from None
    _check_keys(state, arch, src)
    dropped = _drop_frontend(state, src)
    meta = _metadata(src, arch, widths)
    _write(state, out, meta)
    echo(f"{src}: PANNs {arch} (block widths {widths})")
    if dropped:
        echo(f"  left out {dropped} front-end tensors (STFT kernels, mel filterbank: sss computes the same log-mel)")
    echo(f"wrote {out}: {len(state)} tensors; use it with model.audio_encoder={arch} model.audio_pretrained={out}")
    return out


def _check_paths(src: Path, out: Path) -> None:
    if out.suffix != ".safetensors":
        raise ConfigError(f"sss convert panns: OUT {out} must end in .safetensors")
    if out.exists():
        raise ConfigError(f"sss convert panns: OUT {out} exists; sss never overwrites a file: choose another name")
    if not out.parent.is_dir():
        raise ConfigError(f"sss convert panns: OUT {out}: the folder {out.parent} does not exist")
    if not src.is_file():
        raise ConfigError(f"sss convert panns: IN {src}: no such file")


def _state_dict(obj: Any, src: Path) -> dict[str, torch.Tensor]:
    state = obj.get("model", obj) if isinstance(obj, dict) else None
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"{src} holds no state dict under 'model' (as PANNs' checkpoints do): not a PANNs checkpoint")
    return {k.removeprefix("module."): v for k, v in state.items()}


def _check_keys(state: dict[str, torch.Tensor], arch: str, src: Path) -> None:
    # Another PANNs model (Wavegram-Logmel, the 16 kHz one with another front-end) is not a Cnn14 with extras.
    from sss.models.audio.panns import DROPPED, PannsEncoder

    _, widths = recognise_panns(state)
    with torch.device("meta"):
        known = set(PannsEncoder(arch, dim=1, widths=widths).state_dict())
    extra = sorted(k for k in state if k not in known and not k.startswith((*DROPPED, *FRONTEND_KEYS)))
    if extra:
        raise ConfigError(
            f"{src} holds tensors no PANNs {arch} has ({len(extra)}, e.g. {', '.join(extra[:3])}): another PANNs "
            "model (Wavegram-Logmel?), which sss does not convert"
        )


def _drop_frontend(state: dict[str, torch.Tensor], src: Path) -> int:
    from sss.models.audio.panns import PANNS_FRONTEND, panns_filterbank

    melw = state.get("logmel_extractor.melW")
    if melw is not None:
        want = panns_filterbank()
        same = tuple(melw.shape) == tuple(want.shape) and bool((melw.float() - want).abs().max() <= 1e-4 * want.max())
        if not same:
            s = PANNS_FRONTEND
            raise ConfigError(
                f"{src}: its mel filterbank (logmel_extractor.melW, shape {list(melw.shape)}) is not PANNs' "
                f"{s['sample_rate']} Hz, {s['n_fft']}-point, {s['n_mels']}-mel, {s['f_min']:g}-{s['f_max']:g} Hz one: "
                "sss's cnn14/10/6 take the 32 kHz checkpoints (Cnn14_mAP=0.431.pth, Cnn10, Cnn6), not Cnn14_16k"
            )
    keys = [k for k in state if k.startswith(FRONTEND_KEYS)]
    for key in keys:
        del state[key]
    return len(keys)


def _metadata(src: Path, arch: str, widths: list[int]) -> dict[str, str]:
    from sss.models.audio.panns import PANNS_FRONTEND

    digest = hashlib.sha256()
    with src.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    meta = {"format": "pt", "sss_source": "panns", "arch": arch, "widths": ",".join(map(str, widths))}
    meta |= {"source_file": src.name, "source_sha256": digest.hexdigest()}
    return meta | {key: str(value) for key, value in PANNS_FRONTEND.items()}


def _write(state: dict[str, torch.Tensor], out: Path, meta: dict[str, str]) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    with writing_to(out.parent):
        fd, partial = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
        os.close(fd)
        try:
            save_file(tensors, partial, metadata=meta)
            if out.exists():  # written meanwhile by someone else: theirs stays
                raise ConfigError(f"sss convert panns: OUT {out} appeared while converting; sss never overwrites it")
            os.replace(partial, out)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
