#!/usr/bin/env bash
# A short soak (8 clients for 10 s, a child killed every 300 ms, SIGTERM
# under 4 clients) against the real opserver binary: every outcome must be
# expected, nothing may leak, and the server must exit 0 after SIGTERM.
set -uo pipefail
soak="$1"
opserver="$2"
"$soak" --opserver="$opserver" --clients=8 --duration=10s \
  --kill_interval=300ms --idle_timeout_s=8 --sigterm_clients=4 \
  --seed="${SOAK_SEED:-0}"
