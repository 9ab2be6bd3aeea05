"""Task images: a local OCI image store (buildah), its catalogue of base images (mmdebstrap), and
the build of each task's Dockerfile, cached by digest."""

from __future__ import annotations

from infra.images.bases import CATALOGUE, BaseImage, ensure_catalogue
from infra.images.build import ImageBuilder, TaskImage
from infra.images.resolve import DEFAULT_FALLBACKS, ImagePolicy, Resolved
from infra.images.store import ImageConfig, ImageStore
from infra.images.users import ImageUser, image_user

__all__ = [
    "CATALOGUE",
    "DEFAULT_FALLBACKS",
    "BaseImage",
    "ImageBuilder",
    "ImageConfig",
    "ImagePolicy",
    "ImageStore",
    "ImageUser",
    "Resolved",
    "TaskImage",
    "ensure_catalogue",
    "image_user",
]
