#!/bin/sh
# The linker the image's build runs (build-hot-first.sh sets it for its cargo build; no other
# build uses it): `cc` with rustc's arguments, unchanged, except for an optimized build of the
# toolgate binary, whose code is laid out hot first. The functions a
# serving sidecar runs (deploy/link/hot-code.txt, recorded by deploy/link/record-hot-code.sh)
# are placed together at the start of .text, so the pages a call touches are few and adjacent
# instead of spread over 20 MiB of code: the kernel maps code around each page a fault touches,
# and scattered hot code kept ~70 % of the binary resident in an idle sidecar
# (docs/performance.md, "What each optimisation that stays buys").
#
# Symbol names differ between builds (crate hashes, ThinLTO's .llvm.N suffixes), so the list
# holds names with those parts taken out, and this script links twice: once to learn this build's
# names, then with lld's --symbol-ordering-file naming them. Anything it cannot do (another
# linker than lld, no nm, a response file) is a plain link: the layout is an optimisation only.
set -eu

out=""
previous=""
for arg in "$@"; do
  [ "$previous" = "-o" ] && out="$arg"
  previous="$arg"
done

list="$(dirname "$0")/hot-code.txt"
case "$out" in
  */debug/deps/toolgate-* | */debug/toolgate) exec cc "$@" ;;
  */deps/toolgate-*) ;;
  *) exec cc "$@" ;;
esac
case " $* " in
  *" -fuse-ld=lld "*) ;;
  *) exec cc "$@" ;;
esac
if [ ! -f "$list" ] || ! command -v nm >/dev/null 2>&1; then
  exec cc "$@"
fi

cc "$@"
order="$out.hot-order"
# A listed name is looked for as it is (without ThinLTO's .llvm.N suffix, which every build
# numbers anew), so a list recorded from a build like this one places exactly what ran. A name
# this build does not have, nor any other of the same key, is looked for by its key, without the legacy mangling's hash
# (17h...E), v0's crate disambiguators (Cs..._) and back-references (B..._): another profile or
# dependency version renames everything, and then every instance of a generic function that ran
# is placed. A name no build has is skipped.
nm --defined-only "$out" | awk -v list="$list" '
  function exact(name) {
    sub(/\.llvm\.[0-9]+$/, "", name)
    return name
  }
  function loose(name) {
    name = exact(name)
    gsub(/17h[0-9a-f]+E/, "E", name)
    gsub(/Cs[0-9A-Za-z]*_/, "Cs_", name)
    gsub(/B[0-9A-Za-z]*_/, "B_", name)
    return name
  }
  $2 ~ /^[tTwW]$/ {
    e = exact($3)
    by_exact[e] = (e in by_exact) ? by_exact[e] SUBSEP $3 : $3
    l = loose($3)
    by_loose[l] = (l in by_loose) ? by_loose[l] SUBSEP $3 : $3
  }
  END {
    while ((getline line < list) > 0) {
      if (line == "" || line ~ /^#/) continue
      listed[++n] = line
      # A key one of whose listed names this build has is placed by name only (the list holds
      # the names of more than one build: each finds its own).
      if (exact(line) in by_exact) named[loose(line)] = 1
    }
    for (i = 1; i <= n; i++) {
      e = exact(listed[i])
      l = loose(listed[i])
      names = (e in by_exact) ? by_exact[e] : ((l in named) ? "" : by_loose[l])
      if (names == "") continue
      m = split(names, each, SUBSEP)
      for (j = 1; j <= m; j++) if (!(each[j] in placed)) { placed[each[j]] = 1; print each[j] }
    }
  }
' > "$order"
exec cc "$@" -Wl,--symbol-ordering-file="$order" -Wl,--no-warn-symbol-ordering
