"""Model families of `sss`: encoders (image, audio), fusion heads and the registered `HunterModule` variants.

The imports below register every family's entrypoints with `sss.models.registry`; the registry
imports this package lazily, so ``create_model("hunter_small")`` works without importing it first.

Example:
    >>> from sss.models import create_model, list_models
    >>> list_models("hunter_*")
    ['hunter_base', 'hunter_small', 'hunter_tiny']
"""

from sss.models.audio.ast import AudioSpectrogramTransformer
from sss.models.audio.cnn import AudioCNN
from sss.models.audio.frontend import LogMelFrontend
from sss.models.audio.hf import HFAudioEncoder
from sss.models.audio.panns import PannsEncoder
from sss.models.base import TokenEncoder
from sss.models.contrastive import ContrastiveModule, contrastive_base, contrastive_small, contrastive_tiny
from sss.models.fusion.bottleneck import BottleneckFusion
from sss.models.fusion.cross_attention import CrossModalFusion
from sss.models.fusion.late import LateFusion
from sss.models.heads import EventHead, MaskHead, resample_events, resize_mask
from sss.models.hunter import HunterModule, hunter_base, hunter_small, hunter_tiny
from sss.models.image.timm_encoder import TimmImageEncoder
from sss.models.loading import LoadReport
from sss.models.registry import (
    create_model,
    list_encoders,
    list_fusions,
    list_models,
    model_class,
    register_encoder,
    register_fusion,
    register_model,
)

__all__ = [
    "AudioCNN",
    "AudioSpectrogramTransformer",
    "BottleneckFusion",
    "ContrastiveModule",
    "CrossModalFusion",
    "EventHead",
    "HFAudioEncoder",
    "HunterModule",
    "LateFusion",
    "LoadReport",
    "LogMelFrontend",
    "MaskHead",
    "PannsEncoder",
    "TimmImageEncoder",
    "TokenEncoder",
    "contrastive_base",
    "contrastive_small",
    "contrastive_tiny",
    "create_model",
    "hunter_base",
    "hunter_small",
    "hunter_tiny",
    "list_encoders",
    "list_fusions",
    "list_models",
    "model_class",
    "register_encoder",
    "register_fusion",
    "register_model",
    "resample_events",
    "resize_mask",
]
