//! The command line: `tickserve serve`, `tickserve check` and `tickserve
//! journal` ([`crate::journal_cli`]).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tickserve_core::config::{FrontEnd, ModelControlMode, Restriction, ServerConfig};
use tickserve_runtime::{Runtime, VersionState};

/// tickserve: a low-latency inference server for trading models (KServe v2 over gRPC and HTTP).
#[derive(Debug, Parser)]
#[command(name = "tickserve", version)]
pub struct Cli {
    /// `text` (colours only on a terminal) or `json` (one object per line).
    #[arg(long, value_enum, default_value = "text", global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load every model, then serve HTTP and gRPC until SIGTERM or Ctrl-C.
    Serve(ServeArgs),
    /// Load, compile and warm up every model, print a table, and exit non-zero
    /// naming every model that failed; or, with --cuda-reference, compare the
    /// CUDA engine's import of every model with ONNX Runtime.
    Check(CheckArgs),
    /// Read a prediction journal: verify it, or replay it.
    #[command(subcommand)]
    Journal(crate::journal_cli::JournalCommand),
}

#[derive(Debug, Args)]
struct CommonArgs {
    /// The server configuration file.
    #[arg(long, default_value = "config/tickserve.toml")]
    config: PathBuf,
    /// The model repository (overrides repository.path; without it,
    /// KServe's `STORAGE_URI` is honoured).
    #[arg(long)]
    model_repository: Option<PathBuf>,
    /// The name a single-model repository's model is served under (overrides
    /// repository.model_name; KServe: `--model-name={{.Name}}`).
    #[arg(long)]
    model_name: Option<String>,
}

#[derive(Debug, Args)]
struct CheckArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Instead of loading: import every model (its highest version) with the
    /// CUDA engine's importer, evaluate the plan on the CPU and compare it with
    /// ONNX Runtime on seeded random inputs (1 row, 3 rows, the largest
    /// bucket; a stateful model over several ticks). One line per model:
    /// `MODEL cuda-reference ok|unsupported: REASON|mismatch|error: REASON`;
    /// exits non-zero on a mismatch or an error, not on unsupported. Needs
    /// no GPU.
    #[arg(long)]
    cuda_reference: bool,
    /// The largest relative difference `--cuda-reference` accepts
    /// (`|plan − onnxruntime| / max(|onnxruntime|, 1)`).
    #[arg(long, default_value_t = 1e-5)]
    tolerance: f64,
}

#[derive(Debug, Args)]
struct ServeArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// HTTP port (overrides server.http_port).
    #[arg(long)]
    http_port: Option<u16>,
    /// gRPC port (overrides server.grpc_port).
    #[arg(long)]
    grpc_port: Option<u16>,
    /// `none` (the default: every model loads at start, clients cannot load
    /// or unload), `explicit` (they can) or `poll` (the repository is read
    /// every --repository-poll-secs and what changed loads); overrides
    /// security.model_control_mode.
    #[arg(long, value_parser = ["none", "explicit", "poll"])]
    model_control_mode: Option<String>,
    /// Seconds between two reads of the repository in `poll` mode
    /// (Triton's flag); overrides repository.poll_interval.
    #[arg(long, value_name = "SECONDS")]
    repository_poll_secs: Option<u32>,
    /// Triton's `GROUPS:KEY=VALUE`: the groups answer HTTP requests only with
    /// the header `KEY: VALUE` (or `Authorization: Bearer VALUE`). Write VALUE
    /// as `env:NAME` or `file:PATH`: a literal key is visible in `ps`.
    /// Repeatable; adds to security.restricted.
    #[arg(long, value_name = "GROUPS:KEY=VALUE")]
    http_restricted_api: Vec<String>,
    /// The same for gRPC, where the key travels as the metadata
    /// `triton-grpc-protocol-KEY`.
    #[arg(long, value_name = "GROUPS:KEY=VALUE")]
    grpc_restricted_protocol: Vec<String>,
}

impl CommonArgs {
    fn config(&self) -> anyhow::Result<ServerConfig> {
        let mut config = ServerConfig::load(&self.config).map_err(anyhow::Error::msg)?;
        if let Some(repo) = &self.model_repository {
            config.repository.path = repo.clone();
        } else if let Ok(uri) = std::env::var("STORAGE_URI") {
            config.repository.path = storage_uri_path(&uri);
            tracing::info!(
                storage_uri = %uri,
                repository = %config.repository.path.display(),
                "model repository from STORAGE_URI"
            );
        }
        if let Some(name) = &self.model_name {
            config.repository.model_name = name.clone();
        }
        config.validate().map_err(anyhow::Error::msg)?;
        Ok(config)
    }
}

/// Where KServe's `STORAGE_URI` puts the models: a local path (`file://`
/// or absolute) is used as it is; any other (`gs://`, `s3://`, `pvc://`, …)
/// has been fetched by KServe's storage initializer into `/mnt/models`.
pub fn storage_uri_path(uri: &str) -> PathBuf {
    if let Some(path) = uri.strip_prefix("file://") {
        PathBuf::from(path)
    } else if uri.starts_with('/') {
        PathBuf::from(uri)
    } else {
        PathBuf::from("/mnt/models")
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line of text per event; ANSI colours only when standard error is a
    /// terminal (a log file or a collector gets none).
    Text,
    /// One JSON object per line (timestamp, level, message, fields), for log
    /// collectors.
    Json,
}

/// Logs to standard error, filtered by `RUST_LOG` (default `info`).
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Check(args) if args.cuda_reference => cuda_reference(args),
        Command::Check(args) => check(args.common),
        Command::Journal(command) => crate::journal_cli::run(command),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

#[allow(clippy::disallowed_methods)] // the start's duration, logged, is the machine's time
fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let mut config = args.common.config()?;
    if let Some(p) = args.http_port {
        config.server.http_port = p;
    }
    if let Some(p) = args.grpc_port {
        config.server.grpc_port = p;
    }
    if let Some(mode) = &args.model_control_mode {
        config.security.model_control_mode = ModelControlMode::parse(mode).with_context(|| {
            format!("--model-control-mode {mode}: expected none, explicit or poll")
        })?;
    }
    if let Some(secs) = args.repository_poll_secs {
        config.repository.poll_interval = std::time::Duration::from_secs(u64::from(secs));
    }
    for (texts, front_end, flag) in [
        (
            &args.http_restricted_api,
            FrontEnd::Http,
            "--http-restricted-api",
        ),
        (
            &args.grpc_restricted_protocol,
            FrontEnd::Grpc,
            "--grpc-restricted-protocol",
        ),
    ] {
        for text in texts {
            let restriction = Restriction::parse_triton(text, front_end)
                .map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
            config.security.restricted.push(restriction);
        }
    }
    config.security.validate().map_err(anyhow::Error::msg)?;
    tracing::info!(config = ?config, "effective configuration");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let started = std::time::Instant::now();
        let mut server = crate::server::Server::start(&config).await?;
        log_models(&server.edge().runtime);
        tracing::info!(
            http = %server.http_addr,
            grpc = %server.grpc_addr,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "ready"
        );
        tokio::select! {
            result = server.wait() => result?,
            _ = shutdown_signal() => tracing::info!("shutdown signal received; stopping"),
        }
        server.shutdown().await?;
        tracing::info!("stopped");
        anyhow::Ok(ExitCode::SUCCESS)
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// One log line per model version: loaded (with signature, buckets, device
/// and load time) or failed (with the reason).
fn log_models(runtime: &Runtime) {
    for (name, model) in runtime.models() {
        if let Some(error) = &model.error {
            tracing::error!(model = name, "failed to load: {error}");
        }
        for (version, state) in &model.versions {
            match state {
                VersionState::Ready(h) => tracing::info!(
                    model = name,
                    version,
                    signature = %h.signature.summary(),
                    buckets = ?h.settings.buckets.sizes(),
                    device = %h.device,
                    family = %h.family_key,
                    compile_ms = format!("{:.1}", h.load_time.as_secs_f64() * 1e3),
                    "loaded"
                ),
                VersionState::Failed(reason) => {
                    tracing::error!(model = name, version, "failed to load: {reason}")
                }
            }
        }
    }
}

fn cuda_reference(args: CheckArgs) -> anyhow::Result<ExitCode> {
    use tickserve_runtime::cuda_reference::{Verdict, check_repository};
    let config = args.common.config()?;
    let verdicts = check_repository(&config, args.tolerance).map_err(anyhow::Error::msg)?;
    let mut failed = 0;
    for (name, verdict) in &verdicts {
        println!("{name} {verdict}");
        if let Verdict::Mismatch { at, .. } = verdict {
            eprintln!("{name}: the largest difference: {at}");
        }
        failed += usize::from(matches!(
            verdict,
            Verdict::Mismatch { .. } | Verdict::Error(_)
        ));
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn check(args: CommonArgs) -> anyhow::Result<ExitCode> {
    let config = args.config()?;
    crate::observe::install_recorder();
    let runtime = Runtime::load(&config).map_err(anyhow::Error::msg)?;
    println!(
        "{:<20} {:>7}  {:<6}  {:<6}  {:<13}  {:>9}  {:<16}  {:<28}  SIGNATURE / ERROR",
        "MODEL", "VERSION", "STATUS", "DEVICE", "ENGINE", "LOAD (ms)", "FAMILY", "BUCKETS"
    );
    let mut failures = Vec::new();
    for (name, model) in runtime.models() {
        if let Some(error) = &model.error {
            println!(
                "{name:<20} {:>7}  {:<6}  {:<6}  {:<13}  {:>9}  {:<16}  {:<28}  {error}",
                "-", "FAILED", "-", "-", "-", "-", "-"
            );
            failures.push(format!("{name}: {error}"));
        }
        for (version, state) in &model.versions {
            match state {
                VersionState::Ready(h) => {
                    let mut engines: Vec<&str> = h.placements.iter().map(|p| p.backend).collect();
                    engines.dedup();
                    println!(
                        "{name:<20} {version:>7}  {:<6}  {:<6}  {:<13}  {:>9.1}  {:<16}  {:<28}  {}",
                        "READY",
                        h.device,
                        engines.join(","),
                        h.load_time.as_secs_f64() * 1e3,
                        h.family_key,
                        format!("{:?}", h.settings.buckets.sizes()),
                        h.signature.summary()
                    );
                    if let Some(note) = &h.engine_note {
                        println!("{:<29}not on the compiled CPU engine: it {note}", "");
                    }
                    if let Some(note) = &h.gpu_note {
                        println!("{:<29}gpu_mode: {note}", "");
                    }
                }
                VersionState::Failed(reason) => {
                    let first_line = reason.lines().next().unwrap_or_default();
                    println!(
                        "{name:<20} {version:>7}  {:<6}  {:<6}  {:<13}  {:>9}  {:<16}  {:<28}  {first_line}",
                        "FAILED", "-", "-", "-", "-", "-"
                    );
                    failures.push(format!("{name} version {version}: {reason}"));
                }
            }
        }
    }
    runtime.shutdown();
    if failures.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("\n{} model(s) failed to load:", failures.len());
        for f in &failures {
            eprintln!("  {f}");
        }
        Ok(ExitCode::FAILURE)
    }
}
