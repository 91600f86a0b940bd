#!/usr/bin/env bash
# Records hot-code.txt afresh, in one command: the functions a serving sidecar runs, under
# callgrind (record-hot-code.sh), then those that still fault code in natively in a hot-first
# build (add-faulting-code.sh). Run it after changes to the call path or to the dependencies
# (--fresh then), before building an image whose idle memory matters; the load harness's "idle
# RSS after calls", measured on a hot-first build, says when it is due. Needs valgrind and perf.
#
#   deploy/link/regenerate.sh [--fresh]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
deploy/link/record-hot-code.sh "$@"
deploy/link/build-hot-first.sh --profile bench --bench load --no-run
deploy/link/add-faulting-code.sh target/release/toolgate
