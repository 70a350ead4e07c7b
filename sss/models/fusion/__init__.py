"""Fusion heads: `CrossModalFusion` (cross-attention), `BottleneckFusion` (MBT) and `LateFusion` (baseline).

Every fusion head has the same three calls: ``fuse(image, audio)`` returns the updated token
streams, ``classify(image, audio)`` the clip logits, and ``forward = classify(*fuse(...))``.
"""

from sss.models.fusion.bottleneck import BottleneckFusion
from sss.models.fusion.cross_attention import CrossModalFusion
from sss.models.fusion.late import LateFusion

__all__ = ["BottleneckFusion", "CrossModalFusion", "LateFusion"]
