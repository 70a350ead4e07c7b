"""Fusion heads: `CrossModalFusion` (bidirectional cross-attention) and `LateFusion` (baseline)."""

from sss.models.fusion.cross_attention import CrossModalFusion
from sss.models.fusion.late import LateFusion

__all__ = ["CrossModalFusion", "LateFusion"]
