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
from ._dataset import (
    FORMAT_VERSION,
    SIZE_BUDGET_BYTES,
    Dataset,
    DatasetFormatError,
    default_path,
    export_dataset,
    import_dataset,
    read_dataset,
)
from ._devices import DeviceProfile, device_profile, spec_for_key, unknown_devices
from ._evaluate import SPLITS, cross_validate, folds
from ._features import FEATURE_VERSION, Sample, featurize, featurize_params, group_name
from ._kinds import MODEL_KINDS, load_model, make_model
from ._metrics import TAU_UNDEFINED, evaluate, expected_random_best
from ._models import CostModel
from ._siblings import affinity
from ._store import (
    KT_DTYPE,
    KT_STATUS,
    evaluate_database,
    import_kernel_tuner,
    model_for,
    samples_from_rows,
    train,
)
from ._update import UPDATE_FROM_ROWS, UPDATE_TREES, update

__all__ = ["FEATURE_VERSION", "FORMAT_VERSION", "KT_DTYPE", "KT_STATUS", "MODEL_KINDS",
           "SIZE_BUDGET_BYTES", "SPLITS", "TAU_UNDEFINED", "CacheFormatError", "CostModel",
           "Dataset", "DatasetFormatError", "DeviceProfile", "KernelTunerSpace", "Sample",
           "affinity", "concat",
           "cross_validate", "default_path", "device_profile", "evaluate", "evaluate_database",
           "expected_random_best", "export_dataset", "featurize", "featurize_params", "folds",
           "group_name", "import_dataset",
           "import_kernel_tuner", "kernel_tuner_samples", "load_model", "make_model",
           "model_for", "read_dataset", "read_kernel_tuner", "samples_from_rows",
           "spec_for_key", "sweep_samples", "train", "unknown_devices", "update",
           "UPDATE_FROM_ROWS", "UPDATE_TREES"]
