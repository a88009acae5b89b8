"""jax: Keras 3 on JAX, ``keras.distribution.DataParallel`` across the processes
(``jax.distributed`` through ``keras.distribution.initialize``); process 0 reports.

Runs after ``model_keras3.py`` (its names: x, y, make_model, LOSS, Clock, the settings)."""

# defined by model_keras3.py and the settings before it
# ruff: noqa: F821
import jax

keras.distribution.initialize()
# each process feeds its own batch of BATCH images (NumPy input is not sharded by Keras)
keras.distribution.set_distribution(keras.distribution.DataParallel(auto_shard_dataset=False))
keras.utils.set_random_seed(0)
model = make_model()
model.compile(optimizer=keras.optimizers.SGD(0.01), loss=LOSS)
repeats = -(-STEPS // (len(x) // BATCH))
model.fit(
    np.concatenate([x] * repeats)[: STEPS * BATCH],
    np.concatenate([y] * repeats)[: STEPS * BATCH],
    batch_size=BATCH,
    epochs=EPOCHS,
    verbose=0,
    callbacks=[Clock(BATCH * jax.process_count(), jax.process_index() == 0)],
)
