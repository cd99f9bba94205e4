"""spotstop's runtime: scene → member scores → fusion → policy → decision → log.

The public surface is small; everything else lives in private modules. Importing this
package loads no model and imports neither torch nor transformers.
"""

from spotstop.guard._bundle import Bundle, BundleError, BundleMember, load_bundle
from spotstop.guard._config import ScoringConfig, load_scoring_config, spotstop_home
from spotstop.guard._errors import (
    BackendUnavailableError,
    ConfigError,
    GuardError,
    ImageError,
    MemberLoadError,
    RequestError,
    ScoringError,
)
from spotstop.guard._fusion import Avg2Fusion, FusionError, MemberStats
from spotstop.guard._guard import Guard
from spotstop.guard._image import DecodedImage, ImageRefused, decode_image
from spotstop.guard._labels import LabelsFileError, apply_labels_file
from spotstop.guard._log import DecisionLog, LogError
from spotstop.guard._log_pending import PendingAnswers
from spotstop.guard._log_read import LogArrays
from spotstop.guard._log_schema import PolicyRow
from spotstop.guard._member import Member, MemberInfo, load_bundle_member, load_member
from spotstop.guard._prompt import PromptSpec
from spotstop.guard._record import Decision, DecisionRecord
from spotstop.guard._reviewed import (
    BundleShare,
    CountedDecisions,
    Reviewed,
    bundles_of,
    decisions_that_count,
    of_bundle,
    pending_of_bundle,
    read_reviewed,
)
from spotstop.guard._types import MemberScore, Scene
from spotstop.guard.policies import PolicyConfig, PolicyError, load_policy

__all__ = [
    "Avg2Fusion",
    "BackendUnavailableError",
    "Bundle",
    "BundleError",
    "BundleMember",
    "BundleShare",
    "ConfigError",
    "CountedDecisions",
    "Decision",
    "DecisionLog",
    "DecisionRecord",
    "DecodedImage",
    "FusionError",
    "Guard",
    "GuardError",
    "ImageError",
    "ImageRefused",
    "LabelsFileError",
    "LogArrays",
    "LogError",
    "Member",
    "MemberInfo",
    "MemberLoadError",
    "MemberScore",
    "MemberStats",
    "PendingAnswers",
    "PolicyConfig",
    "PolicyError",
    "PolicyRow",
    "PromptSpec",
    "RequestError",
    "Reviewed",
    "Scene",
    "ScoringConfig",
    "ScoringError",
    "apply_labels_file",
    "bundles_of",
    "decisions_that_count",
    "decode_image",
    "load_bundle",
    "load_bundle_member",
    "load_member",
    "load_policy",
    "load_scoring_config",
    "of_bundle",
    "pending_of_bundle",
    "read_reviewed",
    "spotstop_home",
]
