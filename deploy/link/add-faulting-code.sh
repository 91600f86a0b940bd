#!/usr/bin/env bash
# Adds to deploy/link/hot-code.txt the functions of a hot-first build that still fault code pages
# in once the sidecar serves: what callgrind (record-hot-code.sh) cannot see, because it runs
# only natively (SHA-NI's compression, chosen at run time) or runs at another moment under
# valgrind's slowness (a thread started by a timer right after start-up). Each such fault maps
# 128 KiB or more of code around it.
#
#   deploy/link/add-faulting-code.sh [BINARY]     # default target/release/toolgate, which must
#                                                 # be a hot-first build (regenerate.sh does both)
#
# The binary serves the bench catalog under `perf record -e minor-faults` and serves 2,000 calls;
# every fault after start-up's pages were let go, at an instruction of BINARY in a function the
# list does not have, adds that function. Rebuild afterwards. Needs perf (Debian linux-perf).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT="$PWD"
LIST="$ROOT/deploy/link/hot-code.txt"
BINARY="$(realpath "${1:-target/release/toolgate}")"
GRPC=127.0.0.1:47321

command -v perf >/dev/null 2>&1 || { echo "needs perf (apt-get install linux-perf)" >&2; exit 1; }
work="$(mktemp -d)"
perf_pid=""
trap '[[ -n "$perf_pid" ]] && kill "$perf_pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"' EXIT
# A copy: the harness is built below, and a build must not replace the binary being measured. The
# harness is built as BINARY was (hot-first), so its build reuses BINARY's instead of rebuilding
# everything for another linker.
cp "$BINARY" "$work/toolgate"
BINARY="$work/toolgate"
load() { deploy/link/build-hot-first.sh --quiet --bench load -- "$@"; }
load write-catalog "$work" >/dev/null

TOOLGATE_BENCH_JWT_SECRET=toolgate-bench-hs256-secret-0123456789abcdef OTEL_SDK_DISABLED=true \
  perf record -q -e minor-faults -c 1 -o "$work/faults.data" -- \
  "$BINARY" serve --config "$work/bench.yaml" --listen "$GRPC" --admin-listen 127.0.0.1:0 \
  --log-format json >"$work/serve.log" 2>&1 &
perf_pid=$!
for _ in $(seq 1 100); do
  grep -q '"catalog loaded; SERVING"' "$work/serve.log" && break
  sleep 0.1
done
sleep 6 # past the catalog's first poll (5 s): a blocking thread starts for it
load send-only "$GRPC" --calls 2000 --connections 1 --concurrency 1
load send-only "$GRPC" --calls 2000 --connections 2 --concurrency 8
# The sidecar is perf's child: stopped by its PID, perf ends with it.
server_pid="$(pgrep -P "$perf_pid" | head -n1)"
[[ -n "$server_pid" ]] && kill -INT "$server_pid"
wait "$perf_pid" 2>/dev/null || true
perf_pid=""

perf script --no-demangle -i "$work/faults.data" -F ip,sym,dso 2>/dev/null \
  | awk -v exe="($BINARY)" '
      /start_up_pages.*release/ { released = 1; next }
      released && $NF == exe { sub(/\+0x[0-9a-f]+$/, "", $2); print $2 }' \
  | awk '!seen[$0]++' >"$work/faulting"
grep -v '^#' "$LIST" | sed -E 's/\.llvm\.[0-9]+$//' >"$work/listed"
sed -E 's/\.llvm\.[0-9]+$//' "$work/faulting" | grep -vxF -f "$work/listed" >"$work/new" || true
cat "$work/new" >>"$LIST"
echo "$(wc -l <"$work/faulting") functions faulted code in after start-up; $(wc -l <"$work/new") added to $LIST"
