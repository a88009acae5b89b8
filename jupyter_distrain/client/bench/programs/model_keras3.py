"""What the jax bench program starts with: the same synthetic data and the same small
ResNet as ``model.py``, as a Keras 3 model on the JAX backend.

The bench runner puts the settings before it: IMAGE, WIDTH, BLOCKS, BATCH, STEPS and
EPOCHS (see ``BenchSettings.program``); ``jax.py`` follows it."""

# the settings are defined by the lines the runner puts first
# ruff: noqa: F821
import os

os.environ.setdefault("KERAS_BACKEND", "jax")
import time

import keras
import numpy as np

x = np.random.default_rng(0).random((BATCH * 4, IMAGE, IMAGE, 3), dtype=np.float32)
y = np.random.default_rng(1).integers(0, 10, BATCH * 4)


def make_model():
    inputs = keras.Input((IMAGE, IMAGE, 3))
    h = keras.layers.Conv2D(WIDTH, 3, padding="same", activation="relu")(inputs)
    for _ in range(BLOCKS):
        r = keras.layers.Conv2D(WIDTH, 3, padding="same", activation="relu")(h)
        r = keras.layers.Conv2D(WIDTH, 3, padding="same")(r)
        h = keras.layers.ReLU()(keras.layers.Add()([h, r]))
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, keras.layers.Dense(10)(h))


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class Clock(keras.callbacks.Callback):
    def __init__(self, images_per_step, report):
        super().__init__()
        self.images_per_step, self.report = images_per_step, report

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:  # the first epoch warms up (tracing, connections)
            self.start = time.perf_counter()

    def on_train_end(self, logs=None):
        rate = self.images_per_step * STEPS * (EPOCHS - 1) / (time.perf_counter() - self.start)
        if self.report:
            print(f"BENCH images_per_sec={rate:.1f}", flush=True)
