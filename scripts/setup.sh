#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian packages kvbm needs, and only those that are missing.
# Idempotent; runs as root (or through sudo when not root); non-interactive.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config clang libclang-rt-14-dev
  libxxhash-dev libmsgpack-dev libzmq3-dev libnats-dev nats-server
  liburing-dev libucx-dev ucx-utils libhiredis-dev redis-server
  libcmocka-dev zlib1g-dev b3sum libsodium-dev
  python3 python3-zmq python3-msgpack python3-xxhash
  python3-dev python3-pytest python3-numpy python3-torch
  prometheus
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PKGS[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
