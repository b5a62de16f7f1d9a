#!/usr/bin/env bash
# The opserver binary secured the way docs/network.md says: TLS + mTLS +
# bearer tokens, driven by opctl and `buf curl -H` as people would; tokens
# never reach the log; SIGHUP reloads the token file.
set -uo pipefail
opserver="$1"
opctl="$2"
gen_certs="$3"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
source tests/server_lib.sh
use_buf "$tmp" || exit 1

certs="$tmp/certs"
"$gen_certs" "$certs" || { echo "FAIL: gen_certs.sh" >&2; exit 1; }
alice="alice-token-5f2b8c0e9d7a4136"
bob="bob-token-9a1e7c3b5d2f4860"
carol="carol-token-0c4d6e8f1a3b5c7d"
wrong="wrong-token-1234567890abcdef"
printf '# tenants\nalice %s\n\nbob\t%s  # second tenant\n' "$alice" "$bob" >"$tmp/tokens"
# Readable by others: served, with a warning naming the file.
chmod 644 "$tmp/tokens"
echo "$alice" >"$tmp/alice.token"
echo "$wrong" >"$tmp/wrong.token"
echo "$carol" >"$tmp/carol.token"

trap stop_opserver EXIT
start_opserver "$tmp/out" "$tmp/err" "$opserver" --tls_cert_file="$certs/server.pem" \
  --tls_key_file="$certs/server.key" --tls_client_ca_file="$certs/ca.pem" \
  --auth_token_file="$tmp/tokens" || exit 1

# opctl: TLS flags plus --token_file.
tls=(--tls_ca_file="$certs/ca.pem" --tls_cert_file="$certs/client.pem" --tls_key_file="$certs/client.key")
opctl() { "$opctl" --server="127.0.0.1:$port" --timeout_ms=3000 "${tls[@]}" "$@"; }
opctl --token_file="$tmp/alice.token" info >"$tmp/info" 2>&1 || fail "opctl info with a token: $(cat "$tmp/info")"
grep -q "^health: *SERVING" "$tmp/info" || fail "opctl info: $(cat "$tmp/info")"
opctl --token_file="$tmp/alice.token" run ThresholdBackward --threshold=1 \
  --gradOutput=4.5,4.4,4.3,4.2 --self=0.2,1.2,2.2,3.2 >"$tmp/run" 2>&1 ||
  fail "opctl run with a token: $(cat "$tmp/run")"
grep -q "4.4" "$tmp/run" || fail "opctl run output: $(cat "$tmp/run")"
if opctl info >"$tmp/info" 2>&1; then fail "opctl info without a token succeeded"; fi
grep -q "authorization: Bearer" "$tmp/info" || fail "opctl without a token: $(cat "$tmp/info")"
if opctl --token_file="$tmp/wrong.token" stats >"$tmp/info" 2>&1; then fail "opctl with a wrong token succeeded"; fi
grep -q "unknown bearer token" "$tmp/info" || fail "opctl wrong token: $(cat "$tmp/info")"
# mTLS: no client certificate, or one from another CA, never connects.
if "$opctl" --server="127.0.0.1:$port" --timeout_ms=1000 --tls_ca_file="$certs/ca.pem" \
     --token_file="$tmp/alice.token" info >"$tmp/info" 2>&1; then
  fail "opctl without a client certificate succeeded"
fi
if "$opctl" --server="127.0.0.1:$port" --timeout_ms=1000 --tls_ca_file="$certs/ca.pem" \
     --tls_cert_file="$certs/other_client.pem" --tls_key_file="$certs/other_client.key" \
     --token_file="$tmp/alice.token" info >"$tmp/info" 2>&1; then
  fail "opctl with another CA's client certificate succeeded"
fi

# buf curl (grpcurl's part): -H carries the token, --reflect-header lets
# reflection through too.
url="https://127.0.0.1:$port"
bufcurl() {
  "$buf" curl --protocol grpc --cacert "$certs/ca.pem" --cert "$certs/client.pem" \
    --key "$certs/client.key" "$@"
}
auth="authorization: Bearer $alice"
out=$(bufcurl -H "$auth" --reflect-header '*' -d '{}' "$url/opserver.v1.Runtime/GetDeviceInfo" 2>&1) ||
  fail "buf curl with a token: $out"
grep -q '"kind": "cpu"' <<<"$out" || fail "buf curl device info: $out"
for method in opserver.v1.Runtime/GetDeviceInfo opserver.v1.Runtime/CreateSession \
              opserver.v1.Operators/ListOperators; do
  out=$(bufcurl --reflect-header "$auth" -d '{}' "$url/$method" 2>&1) &&
    fail "buf curl $method without a token succeeded: $out"
  grep -q '"code": "unauthenticated"' <<<"$out" || fail "buf curl $method without a token: $out"
  out=$(bufcurl -H "authorization: Bearer $wrong" --reflect-header "$auth" -d '{}' "$url/$method" 2>&1) &&
    fail "buf curl $method with a wrong token succeeded: $out"
  grep -q '"code": "unauthenticated"' <<<"$out" || fail "buf curl $method with a wrong token: $out"
done
out=$(bufcurl --reflect-header "$auth" -d '{}' "$url/grpc.health.v1.Health/Check" 2>&1) ||
  fail "health without a token: $out"
grep -q '"status": "SERVING"' <<<"$out" || fail "health without a token: $out"
# Reflection itself needs the token.
out=$(bufcurl --list-services "$url" 2>&1) && fail "reflection without a token succeeded: $out"
# The wrong CA: the handshake fails.
out=$("$buf" curl --protocol grpc --cacert "$certs/other_ca.pem" --cert "$certs/client.pem" \
  --key "$certs/client.key" -H "$auth" --reflect-header '*' -d '{}' \
  "$url/opserver.v1.Runtime/GetDeviceInfo" 2>&1) && fail "buf curl trusting another CA succeeded: $out"

# SIGHUP re-reads the token file: carol gets in, the server keeps running.
printf 'carol %s\n' "$carol" >>"$tmp/tokens"
kill -HUP "$pid"
for _ in $(seq 300); do
  grep -q "reloaded 3 tokens" "$tmp/err" && break
  sleep 0.1
done
grep -q "reloaded 3 tokens" "$tmp/err" || fail "no reload log line after SIGHUP: $(cat "$tmp/err")"
opctl --token_file="$tmp/carol.token" stats >"$tmp/info" 2>&1 || fail "carol after SIGHUP: $(cat "$tmp/info")"

kill -TERM "$pid"
wait "$pid" || fail "exit status $? after SIGTERM"
trap - EXIT
# Every secret was sent, rejected ones included: none may be in the log.
for token in "$alice" "$bob" "$carol" "$wrong"; do
  grep -qF -- "$token" "$tmp/err" "$tmp/out" && fail "token $token appears in the server's output"
done
grep -qF "warning: --auth_token_file: $tmp/tokens is readable or writable by group or others (mode 0644)" "$tmp/err" ||
  fail "no warning about the token file's mode: $(cat "$tmp/err")"
# The first rejection is logged on its own, the rest summarized (the last
# summary at shutdown).
grep -q "rejected call to /opserver.v1.Runtime/GetDeviceInfo: missing .*authorization" "$tmp/err" ||
  fail "rejections are not logged: $(cat "$tmp/err")"
grep -q "unauthenticated calls in the last .*to /opserver.v1.Runtime/GetDeviceInfo" "$tmp/err" ||
  fail "rejections are not summarized: $(cat "$tmp/err")"

# A malformed token file: refuses to start, one line naming file and line.
printf 'alice %s\nbob\n' "$alice" >"$tmp/bad_tokens"
"$opserver" --listen=127.0.0.1:0 --auth_token_file="$tmp/bad_tokens" >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 2 ]] || fail "malformed token file: exit status $rc"
[[ $(wc -l <"$tmp/err") -eq 1 ]] || fail "malformed token file: want one line, got: $(cat "$tmp/err")"
grep -qF -- "--auth_token_file: $tmp/bad_tokens:2:" "$tmp/err" || fail "malformed token file: $(cat "$tmp/err")"
grep -qF -- "$alice" "$tmp/err" && fail "the error line shows a token"

if ((failures)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all security checks passed"
