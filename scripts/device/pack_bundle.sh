#!/usr/bin/env bash
# Packs a bundle for the device machine: DIR (.gpu or .cores) and the ONNX Runtime library
# into .pack/NAME.tar.xz, and checks what the device tool will carry: the tracked tree
# (7 MiB, most of it fuzz corpora) and the paths named in carry, 64 MiB in all. The bundle
# and the library come to 58 MiB unpacked, too much beside the tree; packed, 22 MiB.
# scripts/gpu_check.sh (gpu) or scripts/device/cores_check.sh (cores) unpacks it there.
# First it writes DIR/BUILD: the commit, when, and the newest glibc the BINARIES need (the
# device machine's must be as new).
# Usage: scripts/device/pack_bundle.sh NAME DIR BINARIES...
set -euo pipefail
cd "$(dirname "$0")/../.."
name=$1 dir=$2
shift 2
glibc=$(for f in "$@"; do
  objdump -T "$f" | grep -o 'GLIBC_[0-9.]*'
done | sort -t. -k1,1 -k2,2n -u | tail -1)
dirty=$(git status --porcelain --untracked-files=no | grep -q . && echo " (with uncommitted changes)" || true)
printf 'commit %s%s\nbuilt %s\nglibc needed %s\n' \
  "$(git rev-parse HEAD)" "$dirty" "$(date -u +%Y-%m-%dT%H:%MZ)" "$glibc" >"$dir/BUILD"
cat "$dir/BUILD"
mkdir -p .pack
tar cf - "$dir" .local/lib/libonnxruntime.so.1.31.1 | xz -T0 -6 >".pack/$name.tar.xz"
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
packed=$(stat -c %s ".pack/$name.tar.xz")
echo "carried: $(((tree + packed) >> 20)) MiB (the tracked tree and .pack/$name.tar.xz)"
if [ $((tree + packed)) -gt $((60 << 20)) ]; then
  echo "over 60 MiB: the device tool carries at most 64 MiB" >&2
  exit 1
fi
