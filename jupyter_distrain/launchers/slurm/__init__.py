"""The Slurm launcher (``--launcher slurm``): :mod:`.launcher` (SlurmLauncher),
:mod:`.cluster` (Slurm's commands: the request, the pre-flight, the allocation),
:mod:`.step` (the srun step and its process handles), :mod:`.task` (what each task runs
on its node; it imports nothing of the launcher's side)."""
