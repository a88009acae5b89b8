"""submit.py JSON: as the account running it, submit the job ``JSON`` describes (JobSpec's
fields, and ``detach``), follow it to its end, and print its outcome as one JSON line: id, state, error,
warnings, notes, each process's log, and the network namespace this program ran in."""

from __future__ import annotations

import json
import os
import sys

from jupyter_distrain import JobFailed, JobSpec, submit

fields = json.loads(sys.argv[1])
detach = fields.pop("detach", False)  # print the job's id and directory, and leave it running
job = submit(JobSpec(**{"pool": False, **fields}))
if detach:
    print(json.dumps({"id": job.id, "dir": str(job.dir.path)}))
    sys.exit(0)
try:
    job.wait(timeout=fields.get("timeout", 120) + 30)
except JobFailed:
    pass
finally:
    if not job.done:
        job.stop()
status = job.status()
outcome = {
    "id": job.id,
    "dir": str(job.dir.path),
    "state": status.state,
    "error": status.error,
    "warnings": status.warnings,
    "notes": job.notes,
    "logs": {str(pid): path.read_text() for pid, path in job.dir.log_files().items()},
    "netns": os.stat("/proc/self/ns/net").st_ino,
}
print(json.dumps(outcome))
