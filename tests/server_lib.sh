# Sourced by the shell tests that run the opserver binary (Bazel runs them
# from the workspace root of their runfiles: `source tests/server_lib.sh`).

# start_opserver OUT ERR BINARY [FLAG...]
# Starts BINARY on a free loopback port (--listen=127.0.0.1:0) with stdout
# in OUT and stderr in ERR, and waits for its "listening on" line. Sets
# `pid` and `port`. Returns 1, saying why on stderr, if it exits or prints
# no such line within 30 s (ASan builds on a loaded machine start slowly).
start_opserver() {
  local out=$1 err=$2 binary=$3
  shift 3
  # Emptied here, not only by the redirections below: those run in the
  # child, and until it has run them the loop below could read the
  # "listening on" line a previous server left in OUT and return its port.
  : >"$out"
  : >"$err"
  "$binary" --listen=127.0.0.1:0 "$@" >"$out" 2>"$err" &
  pid=$!
  port=""
  local _
  for _ in $(seq 300); do
    port=$(sed -n 's/^listening on 127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' "$out")
    [[ -n "$port" ]] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "FAIL: opserver did not start: $(cat "$err")" >&2
  return 1
}

# Stops the server start_opserver started, if any, and reaps it. For EXIT
# traps: `trap stop_opserver EXIT`.
stop_opserver() {
  if [[ -n "${pid:-}" ]]; then
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  fi
  return 0
}

# use_buf DIR
# Sets `buf` to the `buf` CLI scripts/install-deps.sh installs (it plays
# grpcurl's part on these machines) and gives it a HOME and a cache of its
# own under DIR, empty at start: buf keeps a cache under $HOME/.cache
# (read-only inside Bazel's sandbox), and a test must pass on a machine
# where buf never ran. Returns 1, saying why, when buf is missing.
use_buf() {
  local dir=$1
  buf="${OPSERVER_TOOLS:-/opt/opserver/tools}/node_modules/.bin/buf"
  if [[ ! -x "$buf" ]]; then
    echo "FAIL: buf not found at $buf; run scripts/install-deps.sh" >&2
    return 1
  fi
  export HOME="$dir/home" XDG_CACHE_HOME="$dir/home/.cache"
  export BUF_CACHE_DIR="$dir/buf-cache"
  rm -rf "$HOME" "$BUF_CACHE_DIR"
  mkdir -p "$HOME" "$BUF_CACHE_DIR"
}
