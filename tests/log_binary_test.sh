#!/usr/bin/env bash
# gRPC core's own log lines go through the server's rate limit: 20 failed
# TLS handshakes (a plaintext HTTP request to the TLS port) leave at most
# CallLog::kMaxLines (5) lines from gRPC core and one summary of the rest.
set -uo pipefail
opserver="$1"
gen_certs="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
source tests/server_lib.sh

certs="$tmp/certs"
"$gen_certs" "$certs" || { echo "FAIL: gen_certs.sh" >&2; exit 1; }
trap stop_opserver EXIT
start_opserver "$tmp/out" "$tmp/err" "$opserver" \
  --tls_cert_file="$certs/server.pem" --tls_key_file="$certs/server.key" ||
  exit 1

for _ in $(seq 20); do
  # The server logs the failed handshake before it closes the connection,
  # so once `cat` sees the end, the line is written.
  # (The server may close first: a broken pipe or a reset is an end too.)
  (
    trap '' PIPE
    exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
    printf 'GET / HTTP/1.1\r\nHost: x\r\n\r\n' >&3 2>/dev/null
    timeout 60 cat <&3 >/dev/null 2>&1
    exit 0
  ) || fail "could not connect to 127.0.0.1:$port"
done
# SIGTERM: the server writes the summaries still due before "stopped".
kill "$pid"
wait "$pid"
pid=""

handshake=$(grep -c "Handshake failed" "$tmp/err")
summaries=$(grep -c "opserver: suppressed [0-9]* similar lines (grpc ssl_transport_security" "$tmp/err")
((handshake >= 1 && handshake <= 5)) ||
  fail "expected 1 to 5 handshake lines from gRPC core, got $handshake"
((summaries >= 1)) || fail "no summary of the suppressed handshake lines"
# Each line is the server's own, "<time> opserver: grpc E file:line: ...".
if grep "Handshake failed" "$tmp/err" | grep -v " opserver: grpc E ssl_transport_security.cc:[0-9]*: Handshake failed" >/dev/null; then
  fail "a gRPC core line not in the server's format"
fi
if ((failures > 0)); then
  echo "--- server stderr:" >&2
  cat "$tmp/err" >&2
  exit 1
fi
echo PASS
