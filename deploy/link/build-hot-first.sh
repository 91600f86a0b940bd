#!/usr/bin/env bash
# Builds toolgate as the image ships it: `cargo build --profile dist`, linked by hot-first.sh,
# which lays out the code a serving sidecar runs (hot-code.txt) at the start of .text. A step of
# the image's build (deploy/build-image.sh, deploy/Dockerfile) only: every other build links as
# usual. Extra arguments go to cargo (e.g. `--bench load --no-run` with `--profile bench`
# instead: see regenerate.sh).
#
#   deploy/link/build-hot-first.sh                      # target/dist/toolgate
#   deploy/link/build-hot-first.sh --profile bench --bench load --no-run
#
# On another machine than x86_64 Linux it is a plain `cargo build`: the layout is an
# optimisation only.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
args=("$@")
((${#args[@]})) || args=(--profile dist)
if [[ "$(uname -sm)" == "Linux x86_64" ]]; then
  export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER="$PWD/deploy/link/hot-first.sh"
fi
case " ${args[*]} " in
  *" bench "* | *" --bench "*) exec cargo bench --locked "${args[@]}" ;;
  *) exec cargo build --locked "${args[@]}" ;;
esac
