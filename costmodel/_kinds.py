"""The model a kind names, and a stored model read back (``_models`` holds the base classes;
the learned kinds live in modules of their own, which import it)."""

from __future__ import annotations

import io
import pickle
import zlib

from ._features import FEATURE_VERSION
from ._gbdt import GbdtModel
from ._models import CostModel, RooflineModel
from ._sage import SageModel

MODEL_KINDS = ("roofline", "gbdt", "graphsage")
MIN_FIT_ROWS = 2  # the fewest rows a model is fitted on (LightGBM bags 90%: of one, none)

# classes a model stored before they moved out of ``_models`` names by their old path
_MOVED = {("costmodel._models", "GbdtModel"): GbdtModel,
          ("costmodel._models", "SageModel"): SageModel}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        return _MOVED.get((module, name)) or super().find_class(module, name)


def make_model(kind: str, **options) -> CostModel:
    if kind == "roofline":
        return RooflineModel()
    if kind == "gbdt":
        return GbdtModel(**options)
    if kind == "graphsage":
        return SageModel(**options)
    raise ValueError(f"unknown model kind {kind!r}; use one of {', '.join(MODEL_KINDS)}")


def load_model(blob: bytes) -> CostModel:
    """A model from ``to_bytes``; refuses one made for other features.  Models stored before
    ``to_bytes`` compressed are bare pickles and read as they are (a zlib stream at level 1
    starts 0x78 0x01, which no pickle does)."""
    if blob[:2] == b"\x78\x01":
        blob = zlib.decompress(blob)
    model = _Unpickler(io.BytesIO(blob)).load()  # our own database's blobs
    if getattr(model, "feature_version", None) != FEATURE_VERSION:
        raise ValueError(f"the stored model reads features of version {model.feature_version}, "
                         f"this code makes version {FEATURE_VERSION}: train it again")
    return model
