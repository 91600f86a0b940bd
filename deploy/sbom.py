#!/usr/bin/env python3
"""Prints the CycloneDX 1.5 SBOM of what the toolgate binary is built from, read from Cargo.lock.

    python3 deploy/sbom.py [--version V] [--revision SHA] > toolgate.cdx.json

`cargo metadata --locked --filter-platform <host>` resolves the dependency graph exactly as the
lock file pins it; the SBOM lists every package linked into the binary: the normal dependencies
reachable from toolgate for this platform, proc macros included (they write part of its code);
build-dependencies and dev-dependencies are not shipped, so they are left out. Each component has its purl
(pkg:cargo/name@version), licence expression and, for crates.io packages, the SHA-256 that
Cargo.lock records. Scanners (Grype, Trivy, OSV-Scanner, Dependency-Track) read it as is.
"""

import argparse
import json
import pathlib
import platform
import subprocess
import sys
import tomllib
import uuid

ROOT = pathlib.Path(__file__).resolve().parent.parent


def host_triple() -> str:
    printed = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout
    for line in printed.splitlines():
        if line.startswith("host: "):
            return line.removeprefix("host: ").strip()
    return f"{platform.machine()}-unknown-linux-gnu"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="")
    parser.add_argument("--revision", default="")
    args = parser.parse_args()

    metadata = json.loads(
        subprocess.run(
            [
                "cargo", "metadata", "--format-version", "1", "--locked",
                "--filter-platform", host_triple(), "--manifest-path", str(ROOT / "Cargo.toml"),
            ],
            capture_output=True, text=True, check=True,
        ).stdout
    )
    packages = {p["id"]: p for p in metadata["packages"]}
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
    root = metadata["resolve"]["root"]
    checksums = {
        (p["name"], p["version"]): p.get("checksum")
        for p in tomllib.loads((ROOT / "Cargo.lock").read_text())["package"]
    }

    # What the binary links: normal (not build, not dev) dependencies, transitively.
    shipped, stack = set(), [root]
    while stack:
        for dep in nodes[stack.pop()]["deps"]:
            if any(kind["kind"] is None for kind in dep["dep_kinds"]) and dep["pkg"] not in shipped:
                shipped.add(dep["pkg"])
                stack.append(dep["pkg"])

    def component(package: dict) -> dict:
        purl = f"pkg:cargo/{package['name']}@{package['version']}"
        entry = {
            "type": "library",
            "bom-ref": purl,
            "name": package["name"],
            "version": package["version"],
            "purl": purl,
        }
        if package.get("license"):
            entry["licenses"] = [{"expression": package["license"]}]
        checksum = checksums.get((package["name"], package["version"]))
        if checksum:
            entry["hashes"] = [{"alg": "SHA-256", "content": checksum}]
        return entry

    toolgate = packages[root]
    ref = lambda package_id: f"pkg:cargo/{packages[package_id]['name']}@{packages[package_id]['version']}"
    dependencies = [
        {
            "ref": ref(package_id),
            "dependsOn": sorted(
                {ref(d["pkg"]) for d in nodes[package_id]["deps"] if d["pkg"] in shipped}
            ),
        }
        for package_id in sorted(shipped | {root})
    ]
    main_component = component(toolgate)
    main_component["type"] = "application"
    if args.version:
        main_component["version"] = args.version
    if args.revision:
        main_component["properties"] = [{"name": "git:revision", "value": args.revision}]
    sbom = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {"component": main_component},
        "components": sorted(
            (component(packages[p]) for p in shipped), key=lambda c: (c["name"], c["version"])
        ),
        "dependencies": dependencies,
    }
    json.dump(sbom, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
