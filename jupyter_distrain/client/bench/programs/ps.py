"""ps: Keras under ParameterServerStrategy (asynchronous: each step is one worker's batch);
the chief reports.

Runs after ``model.py`` (its names: x, y, make_model, LOSS, Clock, the settings)."""

# defined by model.py and the settings before it
# ruff: noqa: F821
import jupyter_distrain

strategy = jupyter_distrain.strategy()
with strategy.scope():
    model = make_model()
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss=LOSS)


def dataset_fn(input_context):
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)


model.fit(
    tf.keras.utils.experimental.DatasetCreator(dataset_fn),
    steps_per_epoch=STEPS,
    epochs=EPOCHS,
    verbose=0,
    callbacks=[Clock(BATCH, True)],
)
