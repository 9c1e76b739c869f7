#!/usr/bin/env bash
# Writes what compose.yaml needs and git must never hold: secrets/ (the
# database password, its pgpass line, a CA and the replicas' TLS
# certificate, one bearer token per principal) and .env (the tokens'
# SHA-256 hashes, which the configuration holds). Needs openssl and
# sha256sum. Refuses to overwrite: delete secrets/ and .env to start over.
set -euo pipefail
cd "$(dirname "$0")"
if [ -e secrets ] || [ -e .env ]; then
  echo "secrets/ or .env exists already; remove both to make new ones" >&2
  exit 1
fi
umask 077
mkdir secrets

password="$(openssl rand -hex 24)"
printf '%s' "$password" > secrets/postgres-password
printf 'postgres:5432:toolsvc:toolsvc:%s\n' "$password" > secrets/pgpass

# A CA for this deployment, and a certificate for both replicas: the names
# clients dial (localhost from the host, the service names in the network).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 825 \
  -subj "/CN=toolsvc compose CA" -keyout secrets/ca.key -out secrets/ca.crt 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -subj "/CN=toolsvc" -keyout secrets/tls.key -out secrets/tls.csr 2>/dev/null
printf 'subjectAltName=DNS:localhost,DNS:toolsvc-1,DNS:toolsvc-2,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > secrets/tls.ext
openssl x509 -req -in secrets/tls.csr -CA secrets/ca.crt -CAkey secrets/ca.key -CAcreateserial \
  -days 825 -extfile secrets/tls.ext -out secrets/tls.crt 2>/dev/null
rm secrets/tls.csr secrets/tls.ext

for who in agent approver operator; do
  token="tsvc_$(openssl rand -base64 32 | tr '+/' '-_' | tr -d '=\n')"
  printf '%s' "$token" > "secrets/$who.token"
  hash="$(printf '%s' "$token" | sha256sum | cut -d' ' -f1)"
  printf '%s_TOKEN_SHA256=%s\n' "$(echo "$who" | tr '[:lower:]' '[:upper:]')" "$hash" >> .env
done
# The files are read inside the containers by uid 65532 (compose sets that
# per secret); on the host they stay yours alone.
echo "wrote secrets/ (tokens: secrets/agent.token, approver.token, operator.token; CA: secrets/ca.crt) and .env"
