#!/usr/bin/env bash
# scripts/venv.sh DIR REQUIREMENT...: a private Python virtual environment at DIR with these
# pinned requirements (`name==version`), made or remade only when the pins changed, so a
# tool's verdict cannot drift with its releases. Installs python3-venv on Debian when the
# system's python3 cannot make one.
set -euo pipefail
dir=$1
shift
pins="$*"
if [ "$(cat "$dir/.pins" 2>/dev/null || true)" = "$pins" ]; then
  exit 0
fi
# Debian's python3 makes virtual environments only with python3-venv installed.
if ! python3 -c 'import ensurepip' 2>/dev/null; then
  if [ "$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null
fi
rm -rf "$dir"
python3 -m venv "$dir"
"$dir/bin/pip" install --quiet --disable-pip-version-check "$@"
echo "$pins" >"$dir/.pins"
