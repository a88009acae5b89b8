"""ps-sync: Cloudera's TF1 ``run(cluster, server, task_index)`` contract with
``SyncReplicasOptimizer`` (each global step averages one batch from every worker); worker 0
reports.

Runs after ``model.py`` (its names: x, y, make_model, LOSS, Clock, the settings)."""


# defined by model.py and the settings before it
# ruff: noqa: F821
def run(cluster, server, task_index):  # Cloudera's TF1 contract: graph mode
    workers = cluster.num_tasks("worker")
    setter = tf.compat.v1.train.replica_device_setter(
        worker_device=f"/job:worker/task:{task_index}", cluster=cluster
    )
    with tf.compat.v1.device(setter):  # the variables on the ps, the compute here
        global_step = tf.compat.v1.train.get_or_create_global_step()
        model = make_model()
        loss = LOSS(tf.constant(y[:BATCH]), model(tf.constant(x[:BATCH]), training=True))
        optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.01),
            replicas_to_aggregate=workers,
            total_num_replicas=workers,
        )
        train_op = optimizer.minimize(loss, global_step, model.trainable_variables)
    chief = task_index == 0
    hooks = [
        optimizer.make_session_run_hook(chief),
        tf.compat.v1.train.StopAtStepHook(last_step=STEPS * EPOCHS),
    ]
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{task_index}"])
    seen = []  # (global step, time) as this worker read them
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target, is_chief=chief, hooks=hooks, config=config, stop_grace_period_secs=2
    ) as session:
        while not session.should_stop():
            seen.append((session.run([train_op, global_step])[1], time.perf_counter()))
    rate = images_per_sec(seen, BATCH * workers)  # each global step: a batch from every worker
    if chief and rate:
        print(f"BENCH images_per_sec={rate:.1f}", flush=True)


def images_per_sec(seen, images_per_step):
    """The rate from the chief's reads of the global step, or None when it read only the end.

    Any worker's gradient counts towards a global step, so the chief can read jumps (say 4
    then 10): timed from its first read past the warm-up epoch, else from its last read
    before the end, to its last read."""
    last = seen[-1]
    earlier = [read for read in seen if read[0] < last[0]]
    first = next((read for read in earlier if read[0] >= STEPS), earlier[-1] if earlier else None)
    if first is None:
        return None
    return images_per_step * (last[0] - first[0]) / (last[1] - first[1])
