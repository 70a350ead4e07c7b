"""ONNX export of a trained module, and an onnxruntime runner that ``sss predict --runtime onnx`` uses.

The whole model goes into one graph, the log-mel front end included: the dynamo exporter
(``torch.onnx.export(..., dynamo=True)``, onnxscript) translates the STFT to ONNX's ``STFT`` op
(opset >= 17), so an edge box needs onnxruntime and numpy, not torch. The batch axis is dynamic;
the image side and the clip length are the ones the model folder's ``preprocessing.json`` records.

Needs the ``onnx`` extra (``pip install 'shadow-sound-hunter[onnx]'``); without it every entry
point raises `OnnxUnavailableError`, one line naming the extra.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from sss._writing import writing_to
from sss.errors import SSSError

__all__ = [
    "CHECK_BATCHES",
    "ONNX",
    "OPSET",
    "OnnxExportError",
    "OnnxRunner",
    "OnnxUnavailableError",
    "example_inputs",
    "write_onnx",
]

ONNX = "model.onnx"
OPSET = 18
"""ONNX opset of the graph: STFT needs 17; 18 is the oldest the dynamo exporter's ops are written for."""
CHECK_BATCHES = (1, 7, 2, 5)
"""Batch sizes of the random batches on which export compares onnxruntime with PyTorch."""
TOLERANCE = 1e-3
"""Largest max |difference| of the logits that export accepts; above it the graph is refused, not written."""
EXTRA = "pip install 'shadow-sound-hunter[onnx]'"
PREPROCESSING_FILE = "preprocessing.json"


class OnnxUnavailableError(SSSError):
    """A package of the ``onnx`` extra is not installed; ``sss`` prints one line naming the extra."""

    exit_code = 1


class OnnxExportError(SSSError):
    """The module did not export to ONNX, or its graph does not compute what PyTorch does; nothing was kept."""

    exit_code = 1


def require(*names: str) -> None:
    """Import the packages `names` of the ``onnx`` extra, or raise `OnnxUnavailableError` naming the first missing.

    Example:
        >>> require("onnx")
    """
    for name in names:
        try:
            __import__(name)
        except ImportError as exc:
            raise OnnxUnavailableError(
                f"ONNX export and sss predict --runtime onnx need the onnx extra ({name} is not installed): {EXTRA}"
            ) from exc


def input_keys(module: nn.Module) -> tuple[str, ...]:
    """The batch keys the graph takes, in order: the module's modalities (``image``, ``audio``) as its batch names them.

    Example:
        >>> from sss.models import create_model
        >>> input_keys(create_model("hunter_tiny", modalities=["audio"], fusion="late"))
        ('audio',)
    """
    names = dict(getattr(module, "modality_keys", {"image": "image", "audio": "audio"}))
    modalities = getattr(module, "modalities", None) or tuple(names)
    return tuple(names[m] for m in ("image", "audio") if m in modalities and m in names)


def example_inputs(module: nn.Module, prep: Mapping[str, Any], batch: int = 2, seed: int = 0) -> dict[str, Tensor]:
    """Random inputs of the shapes the module was trained on: image ``[B, 3, S, S]``, audio ``[B, 1, rate * clip]``.

    `prep` is the model folder's ``preprocessing.json`` (``image_size``, ``sample_rate``, ``clip_seconds``).

    Example:
        >>> from sss.models import create_model
        >>> prep = {"image_size": 32, "sample_rate": 8000, "clip_seconds": 1.0}
        >>> shapes = example_inputs(create_model("hunter_tiny"), prep, batch=3)
        >>> {key: tuple(value.shape) for key, value in shapes.items()}
        {'image': (3, 3, 32, 32), 'audio': (3, 1, 8000)}
    """
    names = dict(getattr(module, "modality_keys", {"image": "image", "audio": "audio"}))
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Tensor] = {}
    for key in input_keys(module):
        needed = ("image_size",) if key == names.get("image") else ("sample_rate", "clip_seconds")
        if missing := [k for k in needed if not prep.get(k)]:
            raise OnnxExportError(
                f"{PREPROCESSING_FILE} records no {', '.join(missing)}: the ONNX graph's {key!r} input needs its "
                "shape; export from a checkpoint whose data module sets it, or add it to the folder's "
                f"{PREPROCESSING_FILE}"
            )
        if key == names.get("image"):
            side = prep["image_size"]
            h, w = (side, side) if isinstance(side, int) else tuple(side)
            out[key] = _example_image(prep, (batch, 3, h, w), gen)
        else:
            samples = round(float(prep["sample_rate"]) * float(prep["clip_seconds"]))
            out[key] = torch.randn(batch, 1, samples, generator=gen) * 0.1
    return out


def _example_image(prep: Mapping[str, Any], shape: tuple[int, ...], gen: torch.Generator) -> Tensor:
    # Weights bound to their own mean/std (a pretrained encoder's, recorded in preprocessing.json): random
    # pixels normalised with those, as sss predict decodes; otherwise a standard normal, as before.
    if prep.get("image_mean") is None and prep.get("image_std") is None:
        return torch.randn(*shape, generator=gen)
    from sss.data.manifest import ImageNorm

    return ImageNorm.of(prep).normalise(torch.randint(0, 256, shape, generator=gen).float())


class _Graph(nn.Module):
    # Positional tensors in, logits out: what the exporter traces. predict_step as sss predict calls it.
    def __init__(self, module: nn.Module, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.module, self.keys = module, keys

    def forward(self, *inputs: Tensor) -> Tensor:
        from sss.trainer.module import output_logits

        batch = dict(zip(self.keys, inputs, strict=True))
        step = getattr(self.module, "predict_step", None)
        logits = output_logits(step(batch, 0) if step is not None else self.module(batch))
        if logits is None:
            raise OnnxExportError(f"{type(self.module).__name__} returned no class logits to export")
        return logits


def write_onnx(module: nn.Module, folder: str | Path, prep: Mapping[str, Any], opset: int = OPSET) -> dict[str, Any]:
    """Export `module` (eval, on CPU) to ``folder/model.onnx`` and check it against PyTorch; returns what was found.

    The batch axis is dynamic. The graph is run with onnxruntime on random batches of the sizes in
    `CHECK_BATCHES`; its logits must match PyTorch's within `TOLERANCE`, or `OnnxExportError` is
    raised and no ``model.onnx`` is left. The returned dict (opset, inputs with shapes, onnxruntime
    version, max difference) is what the model card records.

    Example:
        >>> import tempfile
        >>> from sss.models import create_model
        >>> write_onnx(create_model("hunter_tiny"), tempfile.mkdtemp(), {"image_size": 32})  # no audio shape
        Traceback (most recent call last):
        ...
        sss.onnx_export.OnnxExportError: preprocessing.json records no sample_rate, clip_seconds: ...
    """
    require("onnx", "onnxscript", "onnxruntime")
    import onnxruntime as ort

    folder = Path(folder)
    module = module.cpu().eval()
    keys = input_keys(module)
    graph = _Graph(module, keys).eval()
    example = example_inputs(module, prep, batch=2)  # 2, not 1: the exporter specialises a size-1 axis
    batch = torch.export.Dim("batch", min=1, max=4096)
    path = folder / ONNX
    try:
        with torch.no_grad():
            program = torch.export.export(
                graph, tuple(example.values()), dynamic_shapes={"inputs": tuple({0: batch} for _ in keys)}, strict=False
            )
            onnx_program = torch.onnx.export(
                program, input_names=list(keys), output_names=["logits"], opset_version=opset, dynamo=True
            )
    except OnnxExportError:
        raise
    except Exception as exc:  # the exporters raise many types; each becomes one line naming the op or module
        raise OnnxExportError(_explain(module, exc)) from exc
    _save(onnx_program, path, module)
    diff = _max_difference(path, graph, module, prep)
    if not diff <= TOLERANCE:
        path.unlink(missing_ok=True)
        raise OnnxExportError(
            f"{path}: the ONNX graph of {type(module).__name__} differs from PyTorch by {diff:.2e} on random "
            f"batches (more than {TOLERANCE}); it was not kept. Export with --format safetensors and predict "
            "with --runtime torch (docs/deploy.md)"
        )
    shapes = {k: ["batch", *v.shape[1:]] for k, v in example.items()}
    return {
        "opset": opset,
        "inputs": shapes,
        "onnxruntime": ort.__version__,
        "max_abs_diff": diff,
        "batches": list(CHECK_BATCHES),
    }


def _max_difference(path: Path, graph: nn.Module, module: nn.Module, prep: Mapping[str, Any]) -> float:
    # The largest difference between the ONNX graph (onnxruntime) and PyTorch over random batches of CHECK_BATCHES.
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    diff = 0.0
    with torch.no_grad():
        for i, size in enumerate(CHECK_BATCHES):
            inputs = example_inputs(module, prep, batch=size, seed=i + 1)
            got = session.run(None, {k: v.numpy() for k, v in inputs.items()})[0]
            diff = max(diff, float((torch.from_numpy(got) - graph(*inputs.values())).abs().max()))
    return diff


def _save(onnx_program: Any, path: Path, module: nn.Module) -> None:
    try:
        with writing_to(path.parent):  # a full disk is not the model's fault: it names the folder, not an op
            onnx_program.save(str(path))
    except Exception as exc:
        path.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise
        raise OnnxExportError(_explain(module, exc)) from exc


def model_card_section(found: Mapping[str, Any]) -> str:
    """The ONNX part of the model card, from what `write_onnx` returned.

    Example:
        >>> print(model_card_section({"opset": 18, "inputs": {"audio": ["batch", 1, 16000]},
        ...                           "onnxruntime": "1.32.0", "max_abs_diff": 3e-07, "batches": [1, 7]}))
        <BLANKLINE>
        ## ONNX
        ...
        - inputs: `audio` float32 [batch, 1, 16000] (the batch axis is dynamic); output: `logits` [batch, classes]
        ...
    """
    inputs = ", ".join(f"`{k}` float32 [{', '.join(map(str, v))}]" for k, v in found["inputs"].items())
    sizes = ", ".join(map(str, found["batches"]))
    return (
        f"\n## ONNX\n\n`{ONNX}`: the whole model in one graph, the log-mel front end (STFT) included.\n\n"
        f"- opset {found['opset']}\n"
        f"- inputs: {inputs} (the batch axis is dynamic); output: `logits` [batch, classes]\n"
        f"- checked with onnxruntime {found['onnxruntime']} (CPUExecutionProvider): max |difference| of the logits "
        f"vs PyTorch {found['max_abs_diff']:.2e} on random batches of sizes {sizes}\n\n"
        f"Predict with `sss predict FOLDER --input manifest.csv --output preds.csv --runtime onnx`.\n"
    )


def _explain(module: nn.Module, exc: BaseException) -> str:
    # The op (aten::stft, say) when the exporter names one, else the innermost module the trace was in.
    text = str(exc)
    op = re.search(r"aten[.:]{1,2}[A-Za-z_][\w.]*", text)
    where = f"op {op.group(0)}" if op else f"module {_failing_module(exc) or type(module).__name__}"
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return (
        f"{type(module).__name__} did not export to ONNX: {where} ({type(exc).__name__}: {first[:200]}). "
        "Export with --format safetensors and predict with --runtime torch, or see the known-unsupported "
        "list in docs/deploy.md"
    )


def _failing_module(exc: BaseException) -> str | None:
    tb, found = exc.__traceback__, None
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and not type(owner).__module__.startswith("torch"):
            found = type(owner).__name__
        tb = tb.tb_next
    return found


class OnnxRunner:
    """A model folder's ``model.onnx`` in onnxruntime, called like a module's ``predict_step``.

    Args:
        folder: The model folder (``sss export ... --format onnx``).
        device: ``"cuda..."`` uses CUDAExecutionProvider when onnxruntime has it (onnxruntime-gpu), else CPU.

    Example:
        >>> OnnxRunner("no/such/folder")
        Traceback (most recent call last):
        ...
        FileNotFoundError: no/such/folder holds no model.onnx: write one with sss export ... --format onnx
    """

    def __init__(self, folder: str | Path, device: str = "cpu") -> None:
        path = Path(folder) / ONNX
        if not path.is_file():
            raise FileNotFoundError(f"{folder} holds no {ONNX}: write one with sss export ... --format onnx")
        require("onnxruntime")
        import onnxruntime as ort

        providers = ["CPUExecutionProvider"]
        if str(device).startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        self.path = path
        self.session = ort.InferenceSession(str(path), providers=providers)
        self.inputs = [i.name for i in self.session.get_inputs()]

    def predict_step(self, batch: Mapping[str, Any], batch_idx: int = 0) -> dict[str, Tensor]:
        """``{"logits": [B, classes]}`` of the graph for the batch's input tensors."""
        missing = [k for k in self.inputs if not isinstance(batch.get(k), Tensor)]
        if missing:
            raise ValueError(
                f"{self.path} takes inputs {', '.join(self.inputs)}; the batch has no {', '.join(missing)} "
                "(a manifest column missing?): predict with --runtime torch, which accepts a missing modality"
            )
        for flag in ("image_present", "audio_present"):
            # The graph has no presence input: it would read an absent modality's zero placeholder as a real input.
            if isinstance(batch.get(flag), Tensor) and not bool(batch[flag].all()):
                raise ValueError(
                    f"{self.path} takes no {flag} input, and {int((~batch[flag].bool()).sum())} sample(s) of this "
                    f"batch have no {flag.split('_')[0]}: predict rows with an empty cell with --runtime torch"
                )
        feed = {k: batch[k].detach().float().cpu().numpy() for k in self.inputs}
        return {"logits": torch.from_numpy(self.session.run(None, feed)[0])}
