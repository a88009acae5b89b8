"""What the kernel, the supervisor and the workers agree on: the job's description
(:mod:`.spec`), process identity, environment names and control requests
(:mod:`.process`), what state.json says (:mod:`.status`), the job directory on disk and
finding jobs (:mod:`.store`), files only this user may touch (:mod:`.private`), the
control and metrics channels (:mod:`.control`, :mod:`.metrics`), reading files that
grow (:mod:`.tail`) and the checks on a cell body that the client and the backends
share (:mod:`.cellcheck`)."""
