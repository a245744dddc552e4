#!/usr/bin/env bash
# The scale-out check (scripts/scaleout/scaleout_check.py): three tickserve replicas of
# one fleet on etcd behind HAProxy (Debian packages `etcd-server`, `etcd-client` and
# `haproxy`, installed here if missing), one drained and restarted, one killed, every
# answer against one server's.
# Run by scripts/test.sh.
#
#   scripts/scaleout/scaleout_check.sh [path/to/tickserve] [--sequences N] [--ticks N]
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-target/debug/tickserve}"
shift || true
[ -x "$bin" ] || cargo build --locked -p tickserve-server
scripts/setup.sh
scripts/apt_install.sh haproxy haproxy
scripts/apt_install.sh etcd etcd-server
scripts/apt_install.sh etcdctl etcd-client
exec .venv/bin/python scripts/scaleout/scaleout_check.py "$bin" "$@"
