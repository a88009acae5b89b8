#!/usr/bin/env bash
# The Jupyter server the UI tests run against (Playwright's webServer starts and ends it):
# JupyterLab and Notebook 7 under a hub user's base URL, bound to 127.0.0.1 only, no
# token, in a fresh temporary notebook directory and job store (JUPYTER_DISTRAIN_ROOT),
# both removed when it exits. Started by root (as `make test` is), the server, its
# kernels and their jobs run as the ordinary account UI_TESTS_USER (default
# distrain-alice, made by tests/users/accounts.sh), as a user of a shared platform's do.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
jupyter="${JUPYTER:-$here/../../.venv/bin/jupyter}"
python="$(dirname "$jupyter")/python"
user="${UI_TESTS_USER:-distrain-alice}"
as_user=()
if [ "$(id -u)" = 0 ]; then
  as_user=("$here/../../tests/users/as_user.sh" "$user")
fi
base="$(mktemp -d /tmp/distrain-ui-XXXXXX)"
mkdir -p "$base/notebooks" "$base/jobs" "$base/workspaces" "$base/settings"
chmod 700 "$base/jobs"
# an admin's overrides.json: the sidebar polls every second (2 s by default);
# settings.spec.ts checks that the sidebar follows it
cat > "$base/settings/overrides.json" <<'JSON'
{ "jupyter-distrain-labextension:plugin": { "pollInterval": 1000 } }
JSON
[ ${#as_user[@]} = 0 ] || chown -R "$user:" "$base"
# what the server needs of this environment (as_user.sh passes nothing of the caller's);
# JUPYTER_DISTRAIN_POOL=0: no warm pools outliving the server
run=("${as_user[@]}" env JUPYTER_DISTRAIN_ROOT="$base/jobs" JUPYTER_DISTRAIN_POOL=0
  UI_TESTS_BASE="$base" UI_TESTS_PORT="${UI_TESTS_PORT:-8917}"
  UI_TESTS_BASE_PATH="${UI_TESTS_BASE_PATH:-/user/alice/}")
# not exec: the trap removes the temporary directory when the server ends
"${run[@]}" "$jupyter" lab --config "$here/jupyter_server_test_config.py" &
server=$!
cleanup() {
  kill -TERM "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  # the jobs run under detached supervisors: stop any a test left, then drop the store
  "${run[@]}" "$python" -c 'from jupyter_distrain.client.job import Job
for job in Job.list():
    job.done or job.stop()' || true
  rm -rf "$base"
}
trap cleanup EXIT
trap 'exit 143' TERM INT
wait "$server"
