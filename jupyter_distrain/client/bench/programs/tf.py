"""tf: Keras under MultiWorkerMirroredStrategy; task 0 reports.

Runs after ``model.py`` (its names: x, y, make_model, LOSS, Clock, the settings)."""

# defined by model.py and the settings before it
# ruff: noqa: F821
import jupyter_distrain

strategy = jupyter_distrain.strategy()
with strategy.scope():
    model = make_model()
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss=LOSS)
global_batch = BATCH * strategy.num_replicas_in_sync
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch)
model.fit(
    data,
    steps_per_epoch=STEPS,
    epochs=EPOCHS,
    verbose=0,
    callbacks=[Clock(global_batch, strategy.cluster_resolver.task_id == 0)],
)
