#!/usr/bin/env bash
# The test accounts (run as root, once per machine; idempotent): two ordinary users,
# distrain-alice (runs the user battery) and distrain-bob (her neighbour, who probes
# her jobs), each in a group of its own and with a home of its own. Each may traverse
# the folders above this checkout (an ACL entry for that account alone, where the
# folder is closed to others) and read the checkout and its virtualenvs; neither may
# write them.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
for user in distrain-alice distrain-bob; do
  id "$user" >/dev/null 2>&1 || useradd --create-home --user-group --shell /bin/bash "$user"
  chmod 0700 "/home/$user"
  # no password, and not locked ("!"): sshd (UsePAM no) refuses a locked account even a key
  usermod -p '*' "$user"
  dir="$repo"
  while [ "$dir" != / ]; do
    dir="$(dirname "$dir")"
    if ! runuser -u "$user" -- test -x "$dir"; then
      setfacl -m "u:$user:x" "$dir"
    fi
  done
  runuser -u "$user" -- test -r "$repo/pyproject.toml" || { echo "$user cannot read $repo" >&2; exit 1; }
  if [ -x "$repo/.venv/bin/python" ]; then
    runuser -u "$user" -- "$repo/.venv/bin/python" -c 'import jupyter_distrain' \
      || { echo "$user cannot run $repo/.venv (built on an interpreter $user cannot reach?)" >&2; exit 1; }
  fi
done
