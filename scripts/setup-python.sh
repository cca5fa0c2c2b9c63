#!/usr/bin/env bash
# Creates the development environment in ${FUSEBOX_CACHE}/venv-<hash of the
# lock> (torch alone is 5 GB: paid once per machine, not once per clone) and
# links .venv to it. Both distributions are installed editable from this
# checkout every time, so a fresh clone re-points them in a few seconds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${FUSEBOX_CACHE:-$HOME/.cache/fusebox}
python=${PYTHON:-python3}
# Bump when the way the environment is built changes (the lock covers the pins).
recipe=1
key=$( { echo "recipe $recipe"; "$python" --version; cat "$root/requirements-dev.lock"; } | sha256sum | cut -c1-16)
venv="$cache/venv-$key"
mkdir -p "$cache"

if [ ! -f "$venv/.complete" ]; then
  start=$SECONDS
  echo "python: creating $venv (torch and transformers: about 4 minutes cold)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --upgrade pip setuptools wheel
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/requirements-dev.lock"
  touch "$venv/.complete"
  echo "python: environment built in $((SECONDS - start)) s"
else
  echo "python: up to date in $venv"
fi
if [ -e "$root/.venv" ] && [ ! -L "$root/.venv" ]; then
  echo "python: .venv exists and is not a link; remove it to let setup manage it" >&2
  exit 1
fi
ln -sfn "$venv" "$root/.venv"
# setuptools warns on stderr about editable installs; keep it for failures only.
if ! "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
  -e "$root/operator" -e "$root/inference_image" 2>"$venv/editable.log"; then
  cat "$venv/editable.log" >&2
  exit 1
fi
