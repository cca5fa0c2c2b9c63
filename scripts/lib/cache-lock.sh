# Sourced by the scripts that fill ${FUSEBOX_CACHE}: a build into the cache
# holds an exclusive lock for its name, so two checkouts (or `make demo` and
# `make test` side by side) building the same thing take turns instead of
# sharing one half-written directory. The second finds the first's result
# complete and builds nothing. The lock is released when the script exits.

# cache_lock DIR NAME: hold DIR/.NAME.lock until this shell exits (file descriptor 9).
cache_lock() {
  local lock="$1/.$2.lock"
  mkdir -p "$1"
  exec 9>"$lock"
  if ! flock --nonblock 9; then
    echo "$2: another build holds $lock; waiting for it to finish" >&2
    flock 9
  fi
}
