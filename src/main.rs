//! The toolgate binary: parse the command line and hand over to `toolgate::cli`.

/// mimalloc instead of glibc's allocator: a call allocates and frees a few hundred small blocks
/// across threads, and glibc's malloc and free were ~13 % of the sidecar's CPU at max rate
/// (perf; docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    toolgate::cli::main()
}
