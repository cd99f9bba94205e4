"""spotstop's runtime: scene → member scores → fusion → policy → decision → log.

The public surface is small; everything else lives in private modules. Importing this
package loads no model and imports neither torch nor transformers.
"""

from guard._bundle import Bundle, BundleError, load_bundle
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
from guard._fusion import Avg2Fusion, FusionError
from guard._guard import Decision, Guard
from guard._image import DecodedImage, ImageRefused, decode_image
from guard._log import DecisionLog, DecisionRecord, LogError
from guard._member import Member, MemberInfo, load_member
from guard._policy import PolicyConfig, PolicyError, load_policy
from guard._prompt import PromptSpec
from guard._types import MemberScore, Scene

__all__ = [
    "Avg2Fusion",
    "BackendUnavailableError",
    "Bundle",
    "BundleError",
    "ConfigError",
    "Decision",
    "DecisionLog",
    "DecisionRecord",
    "DecodedImage",
    "FusionError",
    "Guard",
    "GuardError",
    "ImageError",
    "ImageRefused",
    "LogError",
    "Member",
    "MemberInfo",
    "MemberLoadError",
    "MemberScore",
    "PolicyConfig",
    "PolicyError",
    "PromptSpec",
    "RequestError",
    "Scene",
    "ScoringConfig",
    "ScoringError",
    "decode_image",
    "load_bundle",
    "load_member",
    "load_policy",
    "load_scoring_config",
]
