//! The toolgate binary: parse the command line and hand over to `toolgate::cli`.

fn main() -> std::process::ExitCode {
    toolgate::cli::main()
}
