"""Versioned contracts shared by the t5x packages.

The distribution's version is the interface version: a breaking change to any
contract bumps the major version, an addition the minor version. Packages pin
``t5x-interfaces>=X.Y,<X+1``. ``t5x.interfaces.testing`` holds one conformance
check per contract.
"""

from t5x.interfaces._checkpointer import Checkpointer
from t5x.interfaces._contracts import check_contract, contract_members, missing_members
from t5x.interfaces._feature_converter import FeatureConverter
from t5x.interfaces._input_iterator import InputIterator
from t5x.interfaces._metric_writer import MetricWriter
from t5x.interfaces._model import Model
from t5x.interfaces._partitioner import Partitioner
from t5x.interfaces._paths import unflatten
from t5x.interfaces._values import (
    ArraySpec,
    DataLayout,
    JSONValue,
    PyTree,
    RestoredCheckpoint,
    ShardInfo,
)
from t5x.interfaces._vocabulary import Vocabulary

__version__ = "1.1.0"
INTERFACE_VERSION = (1, 1)

__all__ = [
    "INTERFACE_VERSION",
    "ArraySpec",
    "Checkpointer",
    "DataLayout",
    "FeatureConverter",
    "InputIterator",
    "JSONValue",
    "MetricWriter",
    "Model",
    "Partitioner",
    "PyTree",
    "RestoredCheckpoint",
    "ShardInfo",
    "Vocabulary",
    "check_contract",
    "contract_members",
    "missing_members",
    "unflatten",
]
