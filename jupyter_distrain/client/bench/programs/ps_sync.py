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
    first = None  # (global step, time) when the first epoch (the warm-up) is over
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target, is_chief=chief, hooks=hooks, config=config, stop_grace_period_secs=2
    ) as session:
        while not session.should_stop():
            step = session.run([train_op, global_step])[1]
            if first is None and step >= STEPS:
                first = (step, time.perf_counter())
            last = (step, time.perf_counter())
    if chief:  # each global step is one batch from every worker
        rate = BATCH * workers * (last[0] - first[0]) / (last[1] - first[1])
        print(f"BENCH images_per_sec={rate:.1f}", flush=True)
