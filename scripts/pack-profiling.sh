#!/usr/bin/env bash
# Makes a pack from ../shared/tools/pack-release.sh able to profile on the borrowed machine
# (`bench --profile-dir`, run by scripts/bench-device.sh): the gateway and worker keep their
# symbol tables (debug info still stripped), and perf comes along with every library it loads
# beyond glibc's own, behind a wrapper that finds them.
#
#   ../shared/tools/pack-release.sh .pack && scripts/pack-profiling.sh .pack
#
# Run it after pack-release.sh, which builds the release binaries this one takes again from
# the target directory. Without perf here the pack still gets the symbols, and the device's
# profiled run then has nats-server's Go profiles alone.
set -euo pipefail
top=$(git rev-parse --show-toplevel)
cd "$top"
dir=${1:-.pack}
if [ ! -f "$dir/pack.tar.xz" ]; then
  echo "no $dir/pack.tar.xz: run ../shared/tools/pack-release.sh $dir first" >&2
  exit 1
fi
target=${CARGO_TARGET_DIR:-target}/release
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
tar -C "$stage" -xJf "$dir/pack.tar.xz"
for b in gateway worker; do strip --strip-debug -o "$stage/bin/$b" "$target/$b"; done
if perf=$(command -v perf) && "$perf" --version > /dev/null 2>&1; then
  mkdir -p "$stage/lib/perf"
  cp "$perf" "$stage/bin/perf.real"
  ldd "$perf" | awk '/=> \//{print $3}' \
    | grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' \
    | while read -r lib; do cp -L "$lib" "$stage/lib/perf/"; done
  cat > "$stage/bin/perf" <<'SH'
#!/bin/sh
here=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$here/../lib/perf" exec "$here/perf.real" "$@"
SH
  chmod +x "$stage/bin/perf"
else
  echo "pack-profiling: no working perf here; the pack profiles nats-server alone" >&2
fi
tar -C "$stage" -cJf "$dir/pack.tar.xz" bin lib
# unpack.sh unpacks once, when bin/gateway is missing: drop the previous unpacked copy.
rm -rf "${dir:?}/bin" "${dir:?}/lib"
ls -la "$dir"
