#!/usr/bin/env bash
# Installs Debian packages when what needs them is missing (as root, or through sudo):
#   scripts/apt_install.sh WHAT PACKAGE [PACKAGE ...]
# WHAT is a command (installed when it is not on PATH) or a file's absolute path
# (installed when the file is not there). Used by scripts/setup.sh, scripts/test.sh,
# deploy/*/check.sh and scripts/scaleout/scaleout_check.sh.
set -euo pipefail
what=$1
shift
case "$what" in
  /*) [ -e "$what" ] && exit 0 ;;
  *) command -v "$what" >/dev/null && exit 0 ;;
esac
echo "check: installing $* (Debian packages)" >&2
sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
$sudo apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
