#!/usr/bin/env bash
# as_user.sh USER COMMAND [ARG...]: run COMMAND as the ordinary account USER, in the
# environment a login of USER has (its home, a plain PATH with this checkout's virtualenv
# first, as an activated venv puts it), nothing of the caller's (run as root)
set -euo pipefail
user="$1"; shift
repo="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${VENV:-.venv}"
case "$venv" in /*) ;; *) venv="$repo/$venv" ;; esac
home="$(getent passwd "$user" | cut -d: -f6)"
exec runuser -u "$user" -- env -i HOME="$home" USER="$user" LOGNAME="$user" SHELL=/bin/bash \
  PATH="$venv/bin:/usr/local/bin:/usr/bin:/bin" LANG=C.UTF-8 TERM="${TERM:-dumb}" \
  ${CI:+CI="$CI"} "$@"
