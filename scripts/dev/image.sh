#!/usr/bin/env bash
# Builds tickserve's container image from this checkout with no registry: the
# root filesystem holds only the stripped release binary, libonnxruntime, the
# libraries `ldd` names (taken from this Debian), a passwd for uid 1000, the
# image's tickserve.toml and the sample repository at /models; `podman import`
# makes it an OCI image (entry point `tickserve serve`, user 1000, ports 8000
# and 8001, bound to 0.0.0.0), `podman save` writes it out as an OCI archive.
# With --check, starts a container from the image and runs Triton's Python
# clients against it (tests/python/tritonclient_check.py), and prints the
# image's size and the container's start-to-ready time.
#
#   scripts/dev/image.sh [--gpu] [--check]
#
# --gpu: the GPU variant: NVRTC (from the CUDA wheel scripts/setup.sh installs)
# goes in too; CUDA's driver library comes from the host at run time (NVIDIA's
# container toolkit: podman run --device nvidia.com/gpu=all, or the Kubernetes
# device plugin). Needs podman and runc (apt-get install podman runc).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

variant=cpu
check=0
for arg in "$@"; do
  case "$arg" in
    --gpu) variant=gpu ;;
    --check) check=1 ;;
    *) echo "usage: scripts/dev/image.sh [--gpu] [--check]" >&2; exit 2 ;;
  esac
done
command -v podman >/dev/null && command -v runc >/dev/null \
  || { echo "podman and runc are needed: apt-get install podman runc" >&2; exit 1; }

scripts/setup.sh >/dev/null
cargo build --release -p tickserve-server

version=$(target/release/tickserve --version | awk '{print $2}')
tag="localhost/tickserve:$version-$variant"
work=target/image/$variant
rm -rf "$work"
rootfs=$work/rootfs
mkdir -p "$rootfs"/{usr/bin,usr/lib/tickserve,etc/tickserve,tmp}
chmod 1777 "$rootfs/tmp"

install -m 755 target/release/tickserve "$rootfs/usr/bin/tickserve"
strip "$rootfs/usr/bin/tickserve"
install -m 644 .local/lib/libonnxruntime.so.1.31.1 "$rootfs/usr/lib/tickserve/"
libraries=("$rootfs/usr/bin/tickserve" "$rootfs/usr/lib/tickserve/libonnxruntime.so.1.31.1")
if [ "$variant" = gpu ]; then
  for nvrtc in .local/lib/libnvrtc*.so*; do
    install -m 644 "$nvrtc" "$rootfs/usr/lib/tickserve/"
    libraries+=("$rootfs/usr/lib/tickserve/$(basename "$nvrtc")")
  done
fi
# Every library the binaries need, and the loader, from this system.
for library in $(ldd "${libraries[@]}" 2>/dev/null | awk '/=> \//{print $3} /^\t\/lib/{print $1}' | sort -u); do
  cp -L --parents "$library" "$rootfs/"
done

cat > "$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/usr/sbin/nologin
tickserve:x:1000:1000:tickserve:/tmp:/usr/sbin/nologin
EOF
cat > "$rootfs/etc/group" <<'EOF'
root:x:0:
tickserve:x:1000:
EOF
# The server's settings in the image: every interface, the repository at /models.
cat > "$rootfs/etc/tickserve/tickserve.toml" <<'EOF'
# tickserve in a container (scripts/dev/image.sh). Mount a repository over /models,
# or set STORAGE_URI; mount another file over this one to change anything else.
[server]
host = "0.0.0.0"

[runtime]
onnxruntime_library = "/usr/lib/tickserve/libonnxruntime.so.1.31.1"

[repository]
path = "/models"
EOF
if [ "$variant" = gpu ]; then
  printf '\n[model_defaults]\ndevices = ["auto"]   # every GPU the container sees, else the CPU\n' \
    >> "$rootfs/etc/tickserve/tickserve.toml"
fi
cp -r config/models "$rootfs/models"

tar -C "$rootfs" --numeric-owner --owner=0 --group=0 -cf "$work/rootfs.tar" .
podman rmi -f "$tag" >/dev/null 2>&1 || true
podman import \
  --change 'ENTRYPOINT ["/usr/bin/tickserve", "serve"]' \
  --change 'CMD ["--config", "/etc/tickserve/tickserve.toml"]' \
  --change 'USER 1000:1000' \
  --change 'WORKDIR /tmp' \
  --change 'EXPOSE 8000' --change 'EXPOSE 8001' \
  --change 'ENV LD_LIBRARY_PATH=/usr/lib/tickserve' \
  --change 'LABEL org.opencontainers.image.title=tickserve' \
  "$work/rootfs.tar" "$tag" >/dev/null
rm -f "$work/tickserve-$variant.oci.tar"
podman save --format oci-archive -o "$work/tickserve-$variant.oci.tar" "$tag" >/dev/null
size_mib=$(du -m "$work/tickserve-$variant.oci.tar" | cut -f1)
echo "image $tag: $work/tickserve-$variant.oci.tar, ${size_mib} MiB"

[ "$check" = 1 ] || exit 0

# Start a container from the image (host ports picked free) and check it.
ports=$(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))')
read -r http grpc <<<"$ports"
name="tickserve-check-$$"
started=$(date +%s.%N)
# runc rather than Debian's default crun, which refuses these machines' hybrid
# cgroups; the limits are given because podman would raise them (to 1M open
# files) and a container of a container may not.
podman --runtime runc run -d --rm --ulimit "nofile=$(ulimit -Sn):$(ulimit -Hn)" \
  --ulimit nproc=32768:32768 --name "$name" -p "127.0.0.1:$http:8000" -p "127.0.0.1:$grpc:8001" "$tag" >/dev/null
trap 'podman rm -f "$name" >/dev/null 2>&1 || true' EXIT
for _ in $(seq 1 600); do
  if curl -sf "http://127.0.0.1:$http/v2/health/ready" >/dev/null; then break; fi
  if ! podman --runtime runc container exists "$name"; then echo "the container stopped" >&2; exit 1; fi
  sleep 0.1
done
curl -sf "http://127.0.0.1:$http/v2/health/ready" >/dev/null || { podman logs "$name" >&2; exit 1; }
ready=$(python3 -c "print(f'{$(date +%s.%N) - $started:.2f}')")
echo "container $name ready in ${ready} s (podman run to /v2/health/ready)"
user=$(podman top "$name" user | tail -1 | tr -d ' ')
echo "runs as: $user"
[ "$user" != root ] || { echo "the container runs as root" >&2; exit 1; }
.venv/bin/python crates/tickserve-server/tests/python/tritonclient_check.py \
  --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc" --repository config/models
echo "image check passed: $tag (${size_mib} MiB, ready in ${ready} s)"
