#!/usr/bin/env bash
# The HAProxy check (deploy/haproxy/check.py): three tickserve replicas behind HAProxy
# (Debian package `haproxy`, installed here if missing) with deploy/haproxy/haproxy.cfg,
# sequences over HTTP and gRPC each kept on one replica. Run by scripts/test.sh; about
# half a minute.
#
#   deploy/haproxy/check.sh [path/to/tickserve]      # default: target/debug/tickserve
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-target/debug/tickserve}"
[ -x "$bin" ] || cargo build --locked -p tickserve-server
scripts/setup.sh
scripts/apt_install.sh haproxy haproxy
exec .venv/bin/python deploy/haproxy/check.py "$bin"
