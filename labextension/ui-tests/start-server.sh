#!/usr/bin/env bash
# The Jupyter server the UI tests run against (Playwright's webServer starts and ends it):
# JupyterLab and Notebook 7 under a hub user's base URL, bound to 127.0.0.1 only, no
# token, in a fresh temporary notebook directory and job store (JUPYTER_DISTRAIN_ROOT),
# both removed when it exits.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
jupyter="${JUPYTER:-$here/../../.venv/bin/jupyter}"
base="$(mktemp -d /tmp/distrain-ui-XXXXXX)"
mkdir -p "$base/notebooks" "$base/jobs" "$base/workspaces" "$base/settings"
chmod 700 "$base/jobs"
# an admin's overrides.json: the sidebar polls every second (2 s by default);
# settings.spec.ts checks that the sidebar follows it
cat > "$base/settings/overrides.json" <<'JSON'
{ "jupyter-distrain-labextension:plugin": { "pollInterval": 1000 } }
JSON
export JUPYTER_DISTRAIN_ROOT="$base/jobs"
export JUPYTER_DISTRAIN_POOL=0  # no warm pools outliving the server
export UI_TESTS_BASE="$base"
# not exec: the trap removes the temporary directory when the server ends
"$jupyter" lab --config "$here/jupyter_server_test_config.py" &
server=$!
python="$(dirname "$jupyter")/python"
cleanup() {
  kill -TERM "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  # the jobs run under detached supervisors: stop any a test left, then drop the store
  "$python" -c 'from jupyter_distrain.job import Job
for job in Job.list():
    job.done or job.stop()' || true
  rm -rf "$base"
}
trap cleanup EXIT
trap 'exit 143' TERM INT
wait "$server"
