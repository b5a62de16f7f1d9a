#!/usr/bin/env bash
# Writes throwaway test certificates into DIR (openssl, nothing else):
#   ca.pem/ca.key               the CA the server and client trust
#   server.pem/server.key       signed by ca, SAN 127.0.0.1, ::1, localhost
#   client.pem/client.key       signed by ca, CN=trainer-1 (for mTLS)
#   client2.pem/client2.key     signed by ca, CN=trainer-2
#   other_ca.pem/other_ca.key   an unrelated CA
#   other_client.pem/.key      signed by other_ca, CN=intruder
#   other_server.pem/.key      signed by other_ca, same SAN as server (for
#                               rotation tests)
# Usage: gen_certs.sh DIR
set -euo pipefail
dir="$1"
mkdir -p "$dir"
cd "$dir"
# openssl may want a random seed file under $HOME; keep it here.
export RANDFILE="$dir/.rnd"

ca() {  # NAME CN
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=$2" \
    -keyout "$1.key" -out "$1.pem" 2>/dev/null
}
leaf() {  # NAME CN CA EXTENSIONS
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$2" \
    -keyout "$1.key" -out "$1.csr" 2>/dev/null
  printf '%s\n' "$4" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial \
    -days 2 -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

ca ca "opserver test CA"
ca other_ca "unrelated test CA"
leaf server localhost ca \
  "subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost
extendedKeyUsage=serverAuth"
leaf client trainer-1 ca "extendedKeyUsage=clientAuth"
leaf client2 trainer-2 ca "extendedKeyUsage=clientAuth"
leaf other_client intruder other_ca "extendedKeyUsage=clientAuth"
leaf other_server localhost other_ca \
  "subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost
extendedKeyUsage=serverAuth"
