"""Rules for a config sss did not get from you: a model folder's ``config.yaml``, a checkpoint's stored config.

Such a config is data (a Hub download, a folder someone sent), so it is read with none of OmegaConf's
interpolation (``${oc.env:HF_TOKEN}`` would put your token into its model name, hence into
messages, cards and paths), and its model spec may not name files: the weights come from the
folder's ``model.safetensors``, so a pretrained-weight setting is dropped before the model is built
and any other file, directory or URL a model argument names is refused (timm would open it).
``trust_code=True`` lifts neither rule: it concerns the code a folder names, not its values.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

from sss.config.errors import ConfigError

__all__ = ["refuse_interpolations", "without_outside_files"]

_FILE_WORDS = {"path", "file", "filename", "dir", "url", "uri"}
"""The last word of a key (``checkpoint_path``, ``pretrained_file``, ``cache_dir``) that names a file."""
_FILE_KEYS = {"hf_hub_id", "repo_id", "state_dict", "pretrained_cfg", "pretrained_cfg_overlay"}
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def refuse_interpolations(data: Any, where: str, key: str = "") -> None:
    """Raise `ConfigError` naming the first key whose value (or name) holds ``${``: never resolved, never echoed.

    Example:
        >>> refuse_interpolations({"model": {"name": "hunter_tiny"}}, "m/config.yaml")
        >>> refuse_interpolations({"model": {"name": "${oc.env:HF_TOKEN}"}}, "m/config.yaml")
        Traceback (most recent call last):
        ...
        sss.config.errors.ConfigError: m/config.yaml: model.name: holds an interpolation (${...}); ...
    """
    # Recursive: the data was read within sss.config._yaml's depth and size limits.
    if isinstance(data, dict):
        for k, v in data.items():
            if isinstance(k, str) and "${" in k:
                _refuse_interpolation(where, key or "(top level)")
            refuse_interpolations(v, where, f"{key}.{k}" if key else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            refuse_interpolations(v, where, f"{key}[{i}]")
    elif isinstance(data, str) and "${" in data:
        _refuse_interpolation(where, key)


def _refuse_interpolation(where: str, key: str) -> None:
    raise ConfigError(
        f"{where}: {key}: holds an interpolation (${{...}}); a config from a model folder or checkpoint is data, so "
        "sss resolves none (it could read your environment variables or files): write the value itself, or give "
        "your own config (sss COMMAND CONFIG --ckpt PATH)"
    )


def without_outside_files(spec: dict[str, Any], where: str, key: str = "model") -> dict[str, Any]:
    """`spec` (a ``model:`` section) without its pretrained-weight settings; `ConfigError` for any other file it names.

    A key ending in ``pretrained`` (``image_pretrained``, ``pretrained``) is left out at any depth, and so is
    ``model.init_from``:
    the model's weights are loaded from the folder's ``model.safetensors`` over whatever it was
    built with, so these never change the result, and timm must not open the file or download.
    A key that names a file, directory or URL (``checkpoint_path``, ``pretrained_file``,
    ``pretrained_cfg_overlay``, ``cache_dir``, ...) with a value, and any value that is an absolute,
    ``~`` or ``..`` path or a URL, is refused naming the key and the value.

    Example:
        >>> without_outside_files({"name": "hunter_tiny", "image_pretrained": "/home/me/w.safetensors"}, "c.yaml")
        {'name': 'hunter_tiny'}
        >>> without_outside_files({"image_kwargs": {"checkpoint_path": "/tmp/evil.pth"}}, "c.yaml")
        Traceback (most recent call last):
        ...
        sss.config.errors.ConfigError: c.yaml: model.image_kwargs.checkpoint_path names a file ('/tmp/evil.pth'); ...
    """

    def clean(value: Any, at: str) -> Any:
        if isinstance(value, dict):
            kept = {}
            for k, v in value.items():
                inner = f"{at}.{k}"
                if str(k).endswith("pretrained") or inner == f"{key}.init_from":  # the folder's weights hold them
                    continue
                if _names_file_key(str(k)) and isinstance(v, (str, dict, list)) and v:
                    _refuse_file(where, inner, v)
                kept[k] = clean(v, inner)
            return kept
        if isinstance(value, list):
            return [clean(v, f"{at}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, str) and _looks_outside(value):
            _refuse_file(where, at, value)
        return value

    return clean(spec, key)


def _names_file_key(name: str) -> bool:
    return name in _FILE_KEYS or "pretrained" in name or name.rsplit("_", 1)[-1].lower() in _FILE_WORDS


def _looks_outside(text: str) -> bool:
    if text.startswith("~") or _URL.match(text):
        return True
    if PurePosixPath(text).is_absolute() or PureWindowsPath(text).is_absolute():
        return True
    return ".." in PurePosixPath(text.replace("\\", "/")).parts


def _refuse_file(where: str, key: str, value: Any) -> None:
    shown = repr(value) if isinstance(value, str) else f"a {type(value).__name__} of settings"
    raise ConfigError(
        f"{where}: {key} names a file ({shown}); a config from a model folder or checkpoint may not name files "
        "outside its folder (the weights come from its model.safetensors): remove the key"
    )
