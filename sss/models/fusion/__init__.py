"""Fusion heads: `CrossModalFusion` (cross-attention), `BottleneckFusion` (MBT) and `LateFusion` (baseline).

Every fusion head subclasses `sss.models.fusion.base.FusionHead`, has the same constructor shape
``(dim, num_classes, *, depth, heads, mlp_ratio, dropout, **own)`` and the same three calls:
``fuse(image, audio)`` returns the updated token streams, ``classify(image, audio)`` the clip logits,
and ``forward = classify(*fuse(...))``. Each is registered by name (`sss.models.registry.register_fusion`)
and chosen with ``model.fusion=NAME``.
"""

from sss.models.fusion.bottleneck import BottleneckFusion
from sss.models.fusion.cross_attention import CrossModalFusion
from sss.models.fusion.late import LateFusion

__all__ = ["BottleneckFusion", "CrossModalFusion", "LateFusion"]
