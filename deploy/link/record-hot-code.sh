#!/usr/bin/env bash
# Records the functions a serving sidecar runs, hottest first, into deploy/link/hot-code.txt, the
# list deploy/link/hot-first.sh lays out first in optimized builds. Run it again when the call
# path changes much (the load harness's "idle RSS after calls" row creeping up says so), and with
# --fresh when toolgate's own dependencies change: that renames every generic instance, the old
# names are then matched loosely, and every instance of each is placed (the build's
# target/release/deps/toolgate-*.hot-order then holds several times the ~2,000 lines it should):
#
#   deploy/link/record-hot-code.sh [--fresh]
#
# How: the release binary serves the load harness's bench catalog (JWT identity, every stage,
# audit to a file, spans to a collector) under callgrind, counted from the moment it lets go of
# start-up's pages (`src/cli/start_up_pages.rs`); it serves 2,000 calls one at a time and over
# 16 concurrent streams, answers a metrics scrape and the probes, and stays idle a few seconds so
# its background threads' work is in too.
# Every function that ran is listed, by the instructions it ran itself. Two builds are recorded:
# `cargo build`'s (what ships) and `cargo bench`'s (what the load harness measures: the
# dev-dependencies' features, e.g. tokio's test-util, rename every function that depends on
# them). Names earlier recordings listed follow, unless --fresh. Needs valgrind (Debian package
# valgrind); talks to 127.0.0.1 only.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT="$PWD"
LIST="$ROOT/deploy/link/hot-code.txt"
GRPC=127.0.0.1:47311
OTLP=127.0.0.1:47312
ADMIN=127.0.0.1:47313

command -v valgrind >/dev/null 2>&1 || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }

work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cargo build --locked --profile bench --bin toolgate
cp target/release/toolgate "$work/toolgate-shipped"
cargo bench --locked --bench load --no-run
cp target/release/toolgate "$work/toolgate-bench"
load() { cargo bench --locked --quiet --bench load -- "$@"; }

load write-catalog "$work" >/dev/null
load serve-collector "$OTLP" >"$work/collector.log" 2>&1 &
pids+=($!)

# Serves the bench catalog with BINARY under callgrind, records what it runs serving calls, and
# writes the functions of BINARY that ran to OUT, hottest first.
record() {
  local binary="$1" out="$2" log="$work/serve.log"
  rm -f "$work"/callgrind.out*
  # Counted from the moment start-up's pages are let go (the dump after `release` holds start-up,
  # the last one everything since): what runs once after that stays resident too.
  TOOLGATE_BENCH_JWT_SECRET=toolgate-bench-hs256-secret-0123456789abcdef \
  OTEL_EXPORTER_OTLP_ENDPOINT="http://$OTLP" \
    valgrind --tool=callgrind --demangle=no --dump-after='*start_up_pages7release*' \
    --callgrind-out-file="$work/callgrind.out" \
    "$binary" serve --config "$work/bench.yaml" --listen "$GRPC" \
    --admin-listen "$ADMIN" --log-format json >"$log" 2>&1 &
  local server=$!
  for _ in $(seq 1 600); do
    grep -q '"catalog loaded; SERVING"' "$log" && break
    sleep 0.2
  done
  grep -q '"catalog loaded; SERVING"' "$log" || { cat "$log" >&2; exit 1; }
  load send-only "$GRPC" --calls 500 --connections 1 --concurrency 1
  load send-only "$GRPC" --calls 1500 --connections 2 --concurrency 8
  # What a pod's probes and metrics scrapes run.
  curl -fsS "http://$ADMIN/metrics" "http://$ADMIN/readyz" "http://$ADMIN/healthz" >/dev/null
  sleep 3 # the audit writer's and the span exporter's batches after the last calls
  callgrind_control --dump=serving >/dev/null
  kill "$server"
  wait "$server" 2>/dev/null || true
  local serving
  serving="$(grep -l '^desc: Trigger: dump serving' "$work"/callgrind.out*)"
  callgrind_annotate --threshold=100 --inclusive=no "$serving" 2>/dev/null \
    | grep -F "[$binary]" \
    | sed -E 's/^ *[0-9,]+ \([ 0-9.]+%\)  [^:]*:(.*) \[[^]]*\]$/\1/' >"$out"
}

record "$work/toolgate-shipped" "$work/shipped"
record "$work/toolgate-bench" "$work/bench"

# Each build's own names, then what earlier recordings listed that these did not run: builds
# differ in what they inline, and a list is read by builds of other profiles too (a name no build
# has is skipped at link time).
if [[ "${1:-}" == "--fresh" ]]; then : >"$work/earlier"; else grep -v '^#' "$LIST" >"$work/earlier" || true; fi
cat "$work/shipped" "$work/bench" "$work/earlier" | awk '!seen[$0]++' >"$work/merged"
{
  echo "# Functions a serving sidecar runs, hottest first: deploy/link/record-hot-code.sh wrote this"
  echo "# ($(git rev-parse --short HEAD), $(date -u +%Y-%m-%d)); names as the recorded builds had them."
  cat "$work/merged"
} >"$LIST"
echo "$(wc -l <"$work/shipped") and $(wc -l <"$work/bench") functions ran; $(wc -l <"$work/merged") listed in $LIST"
