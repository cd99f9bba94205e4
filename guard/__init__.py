"""spotstop's runtime: scene → member scores → fusion → policy → decision → log.

The public surface is small; everything else lives in private modules. Importing this
package loads no model and imports neither torch nor transformers.
"""

from guard._config import ScoringConfig, load_scoring_config
from guard._errors import (
    BackendUnavailableError,
    ConfigError,
    GuardError,
    ImageError,
    MemberLoadError,
    RequestError,
    ScoringError,
)
from guard._image import DecodedImage, decode_image
from guard._member import Member, MemberInfo, load_member
from guard._prompt import PromptSpec
from guard._types import MemberScore, Scene

__all__ = [
    "BackendUnavailableError",
    "ConfigError",
    "DecodedImage",
    "GuardError",
    "ImageError",
    "Member",
    "MemberInfo",
    "MemberLoadError",
    "MemberScore",
    "PromptSpec",
    "RequestError",
    "Scene",
    "ScoringConfig",
    "ScoringError",
    "decode_image",
    "load_member",
    "load_scoring_config",
]
