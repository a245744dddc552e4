//! The `tickserve` binary: parses flags and runs the command.

/// jemalloc serves every allocation in the process, ONNX Runtime's included:
/// the `unprefixed_malloc_on_supported_platforms` feature exports `malloc`,
/// `free` and the rest, which the dynamically loaded library binds to. Under
/// glibc's allocator the server's resident memory crept under steady load
/// (docs/performance.md, "Soak").
#[cfg(all(target_os = "linux", not(target_env = "musl")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    tickserve_server::cli::main()
}
