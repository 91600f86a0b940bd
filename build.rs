//! Compiles `proto/` in pure Rust (protox), so building needs no `protoc`, and writes the file
//! descriptor set that server reflection serves. A build linked hot code first (the image's:
//! `deploy/link/build-hot-first.sh` names the linker) is linked again when the hot-code list or
//! the linker script changes; no other build watches them.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER");
    if env::var_os("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER").is_some() {
        for linking in ["deploy/link/hot-first.sh", "deploy/link/hot-code.txt"] {
            println!("cargo:rerun-if-changed={linking}");
        }
    }
    let protos = ["proto/toolgate/v1/toolgate.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(protos, ["proto"])?;

    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("toolgate_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
