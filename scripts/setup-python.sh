#!/usr/bin/env bash
# Creates the development environment in two layers:
# - the dependencies, in ${FUSEBOX_CACHE}/venv-<hash of the lock>: torch alone
#   is 5 GB, so it is paid once per machine, not once per clone;
# - .venv in the checkout, a small virtual environment that sees those
#   dependencies (a .pth file) and holds this checkout's three distributions,
#   installed editable. Every clone gets its own, so a CI clone never
#   re-points another checkout's imports.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${FUSEBOX_CACHE:-$HOME/.cache/fusebox}
python=${PYTHON:-python3}
# Bump when the way the environment is built changes (the lock covers the pins).
recipe=1
key=$( { echo "recipe $recipe"; "$python" --version; cat "$root/requirements-dev.lock"; } | sha256sum | cut -c1-16)
shared="$cache/venv-$key"
# shellcheck source=lib/cache-lock.sh
. "$root/scripts/lib/cache-lock.sh"
cache_lock "$cache" python

if [ ! -f "$shared/.complete" ]; then
  start=$SECONDS
  echo "python: creating $shared (torch and transformers: about 4 minutes cold)"
  rm -rf "$shared"
  "$python" -m venv "$shared"
  "$shared/bin/pip" install --quiet --disable-pip-version-check --upgrade pip setuptools wheel
  # --require-hashes: each archive must be the one `make lock` resolved (its sha256).
  "$shared/bin/pip" install --quiet --disable-pip-version-check --require-hashes \
    -r "$root/requirements-dev.lock"
  touch "$shared/.complete"
  echo "python: dependencies installed in $((SECONDS - start)) s"
else
  echo "python: dependencies up to date in $shared"
fi

venv="$root/.venv"
if [ -L "$venv" ]; then
  rm "$venv"  # an older setup linked .venv straight to the cache
fi
if [ "$(cat "$venv/.fusebox-shared" 2>/dev/null)" != "$shared" ]; then
  rm -rf "$venv"
  "$python" -m venv --without-pip "$venv"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  shared_site=$("$shared/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  echo "import site; site.addsitedir('$shared_site')" > "$site/_fusebox_shared.pth"
  # The tools' entry points (pytest, ruff, mypy, ...) run with this
  # environment's interpreter, so they see the editable packages too.
  for tool in "$shared"/bin/*; do
    name=$(basename "$tool")
    case "$name" in python*|activate*|Activate*) continue ;; esac
    if head -c 2 "$tool" | grep -q '^#!'; then
      { echo "#!$venv/bin/python"; tail -n +2 "$tool"; } > "$venv/bin/$name"
      chmod +x "$venv/bin/$name"
    else
      ln -s "$tool" "$venv/bin/$name"
    fi
  done
  echo "$shared" > "$venv/.fusebox-shared"
fi
# The editable installs follow code changes by themselves; only a change to a
# distribution's metadata (its pyproject.toml) needs a reinstall.
editable=$(cat "$root/contract/pyproject.toml" "$root/operator/pyproject.toml" "$root/inference_image/pyproject.toml" | sha256sum)
if [ "$(cat "$venv/.fusebox-editable" 2>/dev/null)" != "$editable" ]; then
  # setuptools warns on stderr about editable installs; keep it for failures only.
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --no-build-isolation -e "$root/contract" -e "$root/operator" -e "$root/inference_image" 2>"$venv/editable.log"; then
    cat "$venv/editable.log" >&2
    exit 1
  fi
  echo "$editable" > "$venv/.fusebox-editable"
fi
