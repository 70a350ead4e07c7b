"""``sss fit`` from a notebook: `notebook_fit` runs one or several processes through Accelerate's notebook launcher."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from sss.config import ConfigError, SSSConfig, check_config, load_config, to_yaml

__all__ = ["launch_description", "notebook_fit"]


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
    touches the GPU; it prints which of the two it starts (`launch_description`), and asking for
    more processes than there are GPUs is an error that says how to train on the CPU instead. The
    results come from the main process, through a file, because the launcher returns nothing.

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
    print(f"sss: notebook_fit: {launch_description(num_processes, cfg.trainer.cpu)}", flush=True)
    # notebook_launcher's default port (29500) may be taken by another run on this machine.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    with _without_accelerates_device_line():
        notebook_launcher(_fit_and_report, (cfg, resume, out), num_processes=num_processes, use_port=port)


def launch_description(num_processes: int, cpu: bool = False) -> str:
    """What `notebook_fit` starts for `num_processes`: a gloo group on the CPU, or one GPU each; never initialises CUDA.

    The launched processes train on the CPU when `cpu` (``trainer.cpu``) is set or there is no GPU
    (`sss.trainer.trainer.use_cpu`), else one CUDA device each: fewer GPUs than processes is a
    `ValueError` that says how to train on the CPU instead.

    Example:
        >>> launch_description(2, cpu=True)
        'launching 2 processes on the CPU: one gloo process group (trainer.cpu=true)'
    """
    import torch
    from accelerate.utils import is_cuda_available, patch_environment
    from accelerate.utils.environment import get_current_device_type

    if cpu:
        return f"launching {num_processes} processes on the CPU: one gloo process group (trainer.cpu=true)"
    device, _ = get_current_device_type()  # Accelerate's answer when it finds nothing else is "cuda"
    if device != "cuda":
        return f"launching {num_processes} processes, one {device.upper()} device each"
    if not is_cuda_available():  # NVML's check: CUDA stays uninitialised for the fork
        return f"launching {num_processes} processes on the CPU: one gloo process group (no GPU here)"
    with patch_environment(PYTORCH_NVML_BASED_CUDA_CHECK="1"):
        gpus = torch.cuda.device_count()
    if gpus < num_processes:
        raise ValueError(
            f"notebook_fit(num_processes={num_processes}) needs one GPU per process and this machine has {gpus}: "
            f"use num_processes={gpus} or fewer, or add overrides=['trainer.cpu=true'] to train "
            f"{num_processes} processes on the CPU"
        )
    return f"launching {num_processes} processes, one CUDA GPU each (of {gpus}): one nccl process group"


class _WithoutLine(io.TextIOBase):
    # A stdout that passes every line through except those starting with `prefix`; a line is held
    # until its end is written, and a flush passes on what cannot become such a line.
    def __init__(self, target: TextIO, prefix: str) -> None:
        self.target, self.prefix, self.pending = target, prefix, ""

    def write(self, text: str) -> int:
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            if not line.startswith(self.prefix):
                self.target.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        if self.pending and not (self.pending.startswith(self.prefix) or self.prefix.startswith(self.pending)):
            self.target.write(self.pending)
            self.pending = ""
        self.target.flush()


@contextlib.contextmanager
def _without_accelerates_device_line() -> Iterator[None]:
    # notebook_launcher prints "Launching training on N CUDAs." whatever it launches (its device
    # guess falls back to CUDA on a CPU-only machine); sss printed what it really starts. The kernel's
    # stdout drops that one line while the launch runs; Accelerate's own module is left as it is.
    quieter = _WithoutLine(sys.stdout, "Launching training on ")
    with contextlib.redirect_stdout(quieter):
        yield
    quieter.flush()


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
