"""horovod: Keras with Horovod's ring allreduce; rank 0 reports.

Runs after ``model.py`` (its names: x, y, make_model, LOSS, Clock, the settings)."""

# defined by model.py and the settings before it
# ruff: noqa: F821
import horovod.tensorflow.keras as hvd

hvd.init()
model = make_model()
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss=LOSS)
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)
model.fit(
    data,
    steps_per_epoch=STEPS,
    epochs=EPOCHS,
    verbose=0,
    callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        Clock(BATCH * hvd.size(), hvd.rank() == 0),
    ],
)
