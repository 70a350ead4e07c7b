"""Image encoders: `TimmImageEncoder` (any timm backbone as a token encoder)."""

from sss.models.image.timm_encoder import TimmImageEncoder

__all__ = ["TimmImageEncoder"]
