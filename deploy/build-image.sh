#!/usr/bin/env bash
# Builds the toolgate image FROM scratch out of what this checkout builds — no base image is
# pulled, so it works on machines that reach no container registry:
#
#   deploy/build-image.sh                       # the dist build, hot code first, then the image
#   deploy/build-image.sh --binary PATH         # an already built binary instead (CI passes its own)
#   deploy/build-image.sh --tag NAME:TAG        # default toolgate:<version from Cargo.toml>
#   deploy/build-image.sh --binary PATH --stage-only DIR
#                                               # only lay out the image's files in DIR (rootfs/,
#                                               # owned-by-user/): what deploy/Dockerfile copies
#
# The image holds exactly: the binary (stripped) at /usr/local/bin/toolgate, the shared libraries
# it links (read from the binary with ldd, so a new dependency cannot be forgotten) and their
# loader, the CA bundle for the HTTPS executors, /etc/passwd and /etc/group entries for the
# non-root user 65532, and the SBOM (CycloneDX, from Cargo.lock) at
# /usr/share/doc/toolgate/sbom.cdx.json. No shell, no package manager. It runs as 65532 with the
# entrypoint `toolgate serve`; OCI labels give version, revision, source and licence. The SBOM is
# also written beside the image, to target/image/, for scanners.
#
# Needs podman (Debian: apt-get install podman) and, for the SBOM, python3 and cargo. Prints the
# image's name and size. TOOLGATE_REVISION overrides the revision read from git (a build context
# without .git, as deploy/Dockerfile's, passes it in).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"

binary=""
tag=""
stage_only=""
while (($#)); do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --stage-only) stage_only="$2"; shift 2 ;;
    -h | --help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
licence="$(sed -n 's/^license = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
# Where the source is: Cargo.toml's repository, else the checkout's origin, else only the revision.
source_url="$(sed -n 's/^repository = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
source_url="${source_url:-$(git -C "$ROOT" remote get-url origin 2>/dev/null || echo "local checkout")}"
revision="${TOOLGATE_REVISION:-$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)}"
tag="${tag:-toolgate:$version}"

if [[ -z "$binary" ]]; then
  # The code a serving sidecar runs laid out first (deploy/link/README.md): a step of the
  # image's build only, never of anyone's `cargo build`.
  "$ROOT/deploy/link/build-hot-first.sh"
  binary="${CARGO_TARGET_DIR:-$ROOT/target}/dist/toolgate"
fi
[[ -x "$binary" ]] || { echo "not an executable: $binary" >&2; exit 1; }
if [[ -z "$stage_only" ]]; then
  command -v podman >/dev/null || { echo "podman is needed (apt-get install podman)" >&2; exit 1; }
fi

out="${stage_only:-${CARGO_TARGET_DIR:-$ROOT/target}/image}"
rootfs="$out/rootfs"
rm -rf "$rootfs"
# The mount points the manifests use exist, so a read-only root needs no directory made at start.
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs" "$rootfs/usr/share/doc/toolgate" "$rootfs/tmp" \
  "$rootfs/etc/toolgate/keys"
chmod 1777 "$rootfs/tmp"
# The Unix socket's directory belongs to the user (copied in on its own, below), so a volume
# mounted there takes that owner, as podman gives a fresh volume the image directory's, and
# toolgate can create its socket.
owned="$out/owned-by-user"
rm -rf "$owned"
mkdir -p "$owned/run/toolgate"

# The binary, without its debug information (a debug build is ~350 MB with it).
cp "$binary" "$rootfs/usr/local/bin/toolgate"
strip --strip-debug "$rootfs/usr/local/bin/toolgate"

# Every shared library the binary links, at the path the loader looks for it, and the loader.
ldd "$binary" | awk '/=> \// { print $3 } /^\t\// { print $1 }' | while read -r lib; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done

ca_bundle=/etc/ssl/certs/ca-certificates.crt
[[ -r "$ca_bundle" ]] || { echo "no CA bundle at $ca_bundle (apt-get install ca-certificates)" >&2; exit 1; }
cp -L "$ca_bundle" "$rootfs/etc/ssl/certs/ca-certificates.crt"

printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"

sbom="$out/toolgate-$version.cdx.json"
python3 deploy/sbom.py --version "$version" --revision "$revision" >"$sbom"
cp "$sbom" "$rootfs/usr/share/doc/toolgate/sbom.cdx.json"

if [[ -n "$stage_only" ]]; then
  echo "laid out the image's files in $out (rootfs/, owned-by-user/)"
  exit 0
fi

cat >"$out/Containerfile" <<EOF
FROM scratch
COPY rootfs/ /
COPY --chown=65532:65532 owned-by-user/ /
USER 65532:65532
EXPOSE 50051
ENTRYPOINT ["/usr/local/bin/toolgate", "serve"]
LABEL org.opencontainers.image.title="toolgate" \\
      org.opencontainers.image.version="$version" \\
      org.opencontainers.image.revision="$revision" \\
      org.opencontainers.image.source="$source_url" \\
      org.opencontainers.image.licenses="$licence"
EOF
podman build --quiet --file "$out/Containerfile" --tag "$tag" "$out" >/dev/null

size="$(podman image inspect --format '{{.Size}}' "$tag")"
echo "built $tag: $((size / 1024 / 1024)) MiB ($size bytes); SBOM $sbom"
