//! The `tickserve` binary: parses flags and runs the command.

fn main() -> std::process::ExitCode {
    tickserve_server::cli::main()
}
