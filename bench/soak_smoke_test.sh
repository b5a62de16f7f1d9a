#!/usr/bin/env bash
# Two short soaks (8 clients for 10 s, a child killed every 300 ms, SIGTERM
# under 4 clients) against the real opserver binary, one per mode: plain
# (raw RPCs, client-library clients on the data path, a data-port flood)
# and secure (TLS, tokens, three tenants, one hostile). In each, every
# outcome must be expected, nothing may leak, and the server must exit 0
# after SIGTERM.
set -uo pipefail
soak="$1"
opserver="$2"
outputs="${TEST_UNDECLARED_OUTPUTS_DIR:-$(mktemp -d)}"
status=0
for mode in plain secure; do
  mkdir -p "$outputs/$mode"
  start=$SECONDS
  "$soak" --opserver="$opserver" --mode="$mode" --clients=8 --duration=10s \
    --kill_interval=300ms --idle_timeout_s=8 --sigterm_clients=4 \
    --log_dir="$outputs/$mode" --seed="${SOAK_SEED:-0}" || status=1
  echo "soak_smoke_test: --mode=$mode took $((SECONDS - start)) s" >&2
done
exit "$status"
