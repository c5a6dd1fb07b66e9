"""The learned cost model (seed 001): kernels as graphs, models that rank their configs.

Data comes from our own measurements and from Kernel Tuner caches of real GPUs; the models
(the roofline estimate, gradient-boosted trees, GraphSAGE) share one interface, are scored with
the same splits and metrics, and travel through the database as bytes.  docs/costmodel.md.
"""

from ._data import (
    CacheFormatError,
    KernelTunerSpace,
    concat,
    kernel_tuner_samples,
    read_kernel_tuner,
    sweep_samples,
)
from ._evaluate import SPLITS, cross_validate, folds
from ._features import FEATURE_VERSION, Sample, featurize, featurize_params
from ._metrics import evaluate
from ._models import MODEL_KINDS, CostModel, load_model, make_model

__all__ = ["FEATURE_VERSION", "MODEL_KINDS", "SPLITS", "CacheFormatError", "CostModel",
           "KernelTunerSpace", "Sample", "concat", "cross_validate", "evaluate", "featurize",
           "featurize_params", "folds", "kernel_tuner_samples", "load_model", "make_model",
           "read_kernel_tuner", "sweep_samples"]
