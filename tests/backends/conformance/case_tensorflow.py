"""TensorFlow in the conformance suite: the MLP as a Keras model saved as a SavedModel with an
explicit serving signature (input key INPUT0, output key OUTPUT0), and one identity SavedModel
per datatype from a tf.function signature. Everything is built at test time."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from backends.conformance import mlp
from backends.conformance.cases import ALL_DATATYPES, BackendCase

SAVED_MODEL = "model.savedmodel"
_TF_DTYPES = {"BOOL": "bool", "FP16": "float16", "FP32": "float32", "FP64": "float64", "BYTES": "string",
              "BF16": "bfloat16"}


def tensorflow() -> Any:
    from naiad.backends.tensorflow import import_tensorflow

    return import_tensorflow()  # the backend's own quiet import


def keras_mlp() -> Any:
    """The suite's MLP as a Keras model, its weights from mlp.weights()."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # a SavedModel needs Keras on TF
    tensorflow()
    import keras

    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(f"Keras runs on {keras.backend.backend()}; a SavedModel needs KERAS_BACKEND=tensorflow")
    w = mlp.weights()
    model = keras.Sequential([
        keras.Input((mlp.IN,)),
        keras.layers.Dense(mlp.HIDDEN, activation="relu"),
        keras.layers.Dense(mlp.OUT),
    ])
    model.set_weights([w["w1"], w["b1"], w["w2"], w["b2"]])
    return model


def save_mlp(path: Path, input_name: str = "INPUT0", output_name: str = "OUTPUT0",
             signature: str = "serving_default") -> Path:
    """The Keras MLP as a SavedModel whose `signature` maps {input_name} -> {output_name}."""
    tf = tensorflow()
    net = keras_mlp()
    return save_function(path, lambda **kw: {output_name: net(kw[input_name])},
                         {input_name: tf.TensorSpec([None, mlp.IN], tf.float32)}, (signature,), net=net)


def save_function(path: Path, function: Callable[..., dict[str, Any]], specs: dict[str, Any],
                  signatures: tuple[str, ...] = ("serving_default",), net: Any = None) -> Path:
    """A SavedModel of `function(**inputs) -> {output key: tensor}`: `specs` are its signature's
    input keys, the returned dict's keys its output keys; `net` (a Keras model) is saved with it."""
    tf = tensorflow()
    module = tf.Module()
    module.net = net  # tracked, so its variables are saved with the module
    concrete = tf.function(function).get_concrete_function(**specs)
    tf.saved_model.save(module, str(path), signatures=dict.fromkeys(signatures, concrete))
    return path


def save_identity(path: Path, datatype: str, shape: tuple[int | None, ...] = (None, None)) -> Path:
    """OUTPUT0 = INPUT0 for a V2 datatype."""
    tf = tensorflow()
    dtype = tf.as_dtype(_TF_DTYPES.get(datatype, datatype.lower()))
    return save_function(path, lambda INPUT0: {"OUTPUT0": tf.identity(INPUT0)},
                         {"INPUT0": tf.TensorSpec(shape, dtype)})


def _mlp(version: Path) -> None:
    save_mlp(version / SAVED_MODEL)


def _identity(version: Path, datatype: str) -> None:
    save_identity(version / SAVED_MODEL, datatype)


def in_process_tensorflow(version: Path) -> Callable[[np.ndarray], np.ndarray]:
    """The MLP's serving signature called directly on the loaded SavedModel, with TF's default
    (process-wide) thread pools, as naiad's backend runs it unless TF_NUM_*_THREADS are set."""
    tf = tensorflow()
    loaded = tf.saved_model.load(str(version / SAVED_MODEL))
    function = loaded.signatures["serving_default"]

    def run(x: np.ndarray) -> np.ndarray:
        _ = loaded  # the signature's variables live as long as the loaded object
        result: np.ndarray = function(INPUT0=x)["OUTPUT0"].numpy()
        return result

    return run


CASES = [BackendCase("tensorflow", "tensorflow", "tensorflow_savedmodel", _mlp, SAVED_MODEL,
                     write_identity=_identity, datatypes=ALL_DATATYPES, autocomplete=True,
                     requires=("tensorflow", "keras"), in_process=in_process_tensorflow)]
