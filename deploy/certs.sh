#!/usr/bin/env bash
# deploy/certs.sh OUT_DIR: the certificates a zonegate cluster needs, made
# with openssl, step by step as docs/src/certificates.md explains them:
#
#   ca.crt, ca.key               the cluster CA: [cluster.tls] client_ca, and
#                                [admin.tls] client_ca when ctl must present one
#   node-N.crt, node-N.key       member N ([cluster.tls] cert/key): DNS SAN
#                                node-N.zonegate, serverAuth and clientAuth
#   admin.crt, admin.key         the admin listener ([admin.tls]): ADMIN_SANS
#   ctl.pem                      ctl's client certificate and key (ZONEGATE_CLIENT_CERT)
#   backend-ca.crt, backend.*    a CA for https:// backends and one backend's
#   backend-ca-bundle.pem        certificate; the bundle is backends[].tls.ca
#
# Environment: MEMBERS (node ids, default "1 2 3"), ADMIN_SANS and
# BACKEND_SANS (default "DNS:localhost,IP:127.0.0.1"), DAYS (leaf validity,
# default 365). Keys are P-256, written with umask 077. Needs OpenSSL 1.1.1+.
set -euo pipefail

out=${1:?usage: deploy/certs.sh OUT_DIR}
MEMBERS=${MEMBERS:-"1 2 3"}
ADMIN_SANS=${ADMIN_SANS:-"DNS:localhost,IP:127.0.0.1"}
BACKEND_SANS=${BACKEND_SANS:-"DNS:localhost,IP:127.0.0.1"}
DAYS=${DAYS:-365}
mkdir -p "$out"
cd "$out"
umask 077

key() {
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"
}

# ca NAME SUBJECT: a self-signed CA certificate valid ten years.
ca() {
    key "$1.key"
    openssl req -x509 -new -key "$1.key" -subj "/CN=$2" -days 3650 -out "$1.crt" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}

# leaf NAME SUBJECT SANS EKU CA: a certificate signed by CA.
leaf() {
    key "$1.key"
    openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=%s\nsubjectAltName=%s\n' "$4" "$3" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$5.crt" -CAkey "$5.key" -CAcreateserial -days "$DAYS" -extfile "$1.ext" -out "$1.crt"
    rm "$1.csr" "$1.ext"
}

# 1. The cluster CA.
ca ca "zonegate cluster CA"

# 2. One certificate per member: its name, and both usages (members are
#    each other's servers and clients).
for id in $MEMBERS; do
    leaf "node-$id" "node-$id.zonegate" "DNS:node-$id.zonegate" serverAuth,clientAuth ca
done

# 3. The admin listener: every name and address ctl and browsers use.
leaf admin "zonegate admin" "$ADMIN_SANS" serverAuth ca

# 4. ctl's client certificate, for an admin API with client_ca.
leaf ctl "zonegate ctl" "DNS:zonegate-ctl" clientAuth ca
cat ctl.crt ctl.key >ctl.pem

# 5. https:// backends: their CA, one backend's certificate, and the bundle
#    zonegate trusts for them (append other backend CAs to it).
ca backend-ca "inference backends CA"
leaf backend "inference backend" "$BACKEND_SANS" serverAuth backend-ca
cat backend-ca.crt >backend-ca-bundle.pem

echo "certificates in $PWD: $(ls | tr '\n' ' ')"
