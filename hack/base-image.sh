#!/usr/bin/env bash
# Builds the local stand-in for python:3.11-slim-bookworm (which cannot be pulled without a registry)
# as a root filesystem tarball:
#   hack/base-image.sh OUT.tar
# Debian bookworm (mmdebstrap, variant "essential": no apt, no docs/man pages/locales) with Debian's
# python3.11 in a venv at /usr/local, so /usr/local/bin/python and pip are where the official image
# has them. passwd (groupadd/useradd) and ca-certificates are in it as in the official image.
# hack/image.sh turns the tarball into an image and caches it.
set -euo pipefail

out=${1:?usage: hack/base-image.sh OUT.tar}
SUITE=${BASE_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

command -v mmdebstrap >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap; }

# Fixed file times: the same packages give the same tarball.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1700000000}
# The merged-usr hook sets up the /usr merge itself, so usrmerge (and the perl it pulls in) stays out.
mmdebstrap --quiet --variant=essential --mode=root \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  --include=python3,python3-venv,passwd,ca-certificates \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*' \
  --customize-hook='chroot "$1" python3 -m venv /usr/local' \
  --customize-hook='chroot "$1" /usr/local/bin/python -m pip --version' \
  --customize-hook='rm -rf "$1"/var/cache/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
  --customize-hook='find "$1/usr/local" -name __pycache__ -type d -prune -exec rm -rf {} +' \
  "$SUITE" "$out" "$MIRROR"
