//! Compiles `proto/` in pure Rust (protox), so building needs no `protoc`, and writes the file
//! descriptor set that server reflection serves. The binary is linked again when the hot-code
//! list or the linker script that reads it changes (`deploy/link/`, `.cargo/config.toml`).

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for linking in ["deploy/link/hot-first.sh", "deploy/link/hot-code.txt"] {
        println!("cargo:rerun-if-changed={linking}");
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
