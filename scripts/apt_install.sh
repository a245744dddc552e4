#!/usr/bin/env bash
# Installs Debian packages the checks need when their command is missing (as root, or
# through sudo): scripts/apt_install.sh COMMAND PACKAGE. Used by deploy/*/check.sh,
# scripts/scaleout/scaleout_check.sh and scripts/test.sh.
set -euo pipefail
command -v "$1" >/dev/null && exit 0
echo "check: installing $2 (Debian package)" >&2
sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
$sudo apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$2" >/dev/null
