"""``sss fit`` from a notebook: `notebook_fit` runs one or several processes through Accelerate's notebook launcher."""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sss.config import ConfigError, SSSConfig, check_config, load_config, to_yaml

__all__ = ["notebook_fit"]


def notebook_fit(
    config: str | Path | SSSConfig | Mapping[str, Any],
    num_processes: int = 1,
    overrides: Sequence[str] = (),
    *,
    resume: str | None = None,
) -> dict[str, Any]:
    """Train like ``sss fit CONFIG OVERRIDES --num-processes N`` and return the results dict.

    `config` is a YAML path, an `SSSConfig`, or a mapping shaped like the YAML; `overrides` are the
    CLI's ``key=value`` strings. With ``num_processes > 1`` Accelerate's ``notebook_launcher`` forks
    the processes (a gloo group on the CPU, one GPU each otherwise), so call it before any cell
    touches the GPU. The results come from the main process, through a file, because the launcher
    returns nothing.

    Example:
        >>> notebook_fit({"model": {"_target_": "sss.testing.BoringModule"}}, overrides=["trainer.max_steps=1"])
        Traceback (most recent call last):
        ...
        sss.config.errors.ConfigError: notebook config: data: missing; add a data: section with a _target_
    """
    cfg = _load(config, overrides)
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    with tempfile.TemporaryDirectory(prefix="sss-notebook-") as tmp:
        out = Path(tmp) / "results.json"
        if num_processes == 1:
            try:
                _fit_and_report(cfg, resume, str(out))
            finally:
                _reset_accelerate_state()  # a later notebook_fit(num_processes=N) forks from this kernel
        else:
            _launch(cfg, resume, str(out), num_processes)
        if not out.is_file():
            raise RuntimeError("sss: the main process ended without results; see the output above")
        return json.loads(out.read_text())


def _load(config: str | Path | SSSConfig | Mapping[str, Any], overrides: Sequence[str]) -> SSSConfig:
    # Everything goes through load_config, so a notebook gets the checks and messages of `sss fit`.
    from omegaconf import OmegaConf

    if isinstance(config, (str, Path)):
        cfg, where = load_config(config, list(overrides)), str(config)
    else:
        text = to_yaml(config) if isinstance(config, SSSConfig) else OmegaConf.to_yaml(OmegaConf.create(dict(config)))
        name = config.name if isinstance(config, SSSConfig) else str(config.get("name") or "notebook")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{name or 'notebook'}.yaml"
            path.write_text(text)
            try:
                cfg = load_config(path, list(overrides))
            except ConfigError as exc:
                raise ConfigError(str(exc).replace(str(path), "notebook config")) from None
        where = "notebook config"
    errors = check_config(cfg)
    if errors:
        raise ConfigError("\n".join(f"{where}: {error}" for error in errors))
    return cfg


def _launch(cfg: SSSConfig, resume: str | None, out: str, num_processes: int) -> None:
    import torch
    from accelerate import notebook_launcher

    if torch.cuda.is_initialized():  # is_available() could initialise it
        raise RuntimeError(
            f"notebook_fit(num_processes={num_processes}) forks {num_processes} processes, and CUDA is already "
            "initialised in this kernel (a tensor on the GPU, a model moved with .cuda(), an Accelerator, ...); "
            "forked processes cannot use it. Restart the kernel and call notebook_fit before any cell uses the "
            "GPU, or train with num_processes=1."
        )
    # notebook_launcher's default port (29500) may be taken by another run on this machine.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    notebook_launcher(_fit_and_report, (cfg, resume, out), num_processes=num_processes, use_port=port)


def _fit_and_report(cfg: SSSConfig, resume: str | None, out: str) -> None:
    # Runs in every launched process (Accelerate splits the CPU cores among them); run_fit returns
    # the same results on each, and the main one writes them for the kernel.
    from sss.run.fit import run_fit

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _reset_accelerate_state()  # a forked copy of the kernel's one-process state would keep it out of the group
    results = run_fit(cfg, resume=resume)
    if int(os.environ.get("RANK", "0")) == 0:
        Path(out).write_text(json.dumps(results))


def _reset_accelerate_state() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
