"""The notebook side: the magics (:mod:`.magics`) over the API (:mod:`.api`), the job
handle (:mod:`.job`), following a job's output (:mod:`.follow`, :mod:`.output`), the live
view (:mod:`.widget`), the launch flags (:mod:`.flags`), ``bench`` (:mod:`.bench`) and
Cloudera CML's ``launch_workers``/``run_cluster`` (:mod:`.cml`)."""
