//! `tickserve journal verify DIR` and `tickserve journal replay DIR`
//! (docs/journal.md).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use tickserve_core::config::ServerConfig;
use tickserve_runtime::Runtime;

/// What to do with a journal.
#[derive(Debug, Subcommand)]
pub enum JournalCommand {
    /// Count each stream's records and report gaps, broken chains and a
    /// truncated tail; exits non-zero on a gap, a broken chain or an
    /// unreadable file.
    Verify(VerifyArgs),
    /// Rerun every record on the model version it names (refusing a version
    /// whose model file differs), in the bucket it ran in, and compare each
    /// output bit for bit; exits non-zero on any mismatch.
    Replay(ReplayArgs),
}

/// `journal verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The journal's directory (`journal.directory`).
    dir: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// `journal replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The journal's directory (`journal.directory`).
    dir: PathBuf,
    /// The server configuration the records were made under (its model
    /// defaults decide buckets and settings).
    #[arg(long, default_value = "config/tickserve.toml")]
    config: PathBuf,
    /// The model repository holding the versions the records name
    /// (overrides repository.path).
    #[arg(long)]
    model_repository: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `command`.
pub fn run(command: JournalCommand) -> anyhow::Result<ExitCode> {
    match command {
        JournalCommand::Verify(args) => verify(args),
        JournalCommand::Replay(args) => replay(args),
    }
}

fn verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let report = tickserve_journal::verify::verify(&args.dir).map_err(anyhow::Error::msg)?;
    print_report(args.json, &report, report.text())?;
    Ok(if report.sound() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn replay(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let mut config = ServerConfig::load(&args.config).map_err(anyhow::Error::msg)?;
    if let Some(repository) = &args.model_repository {
        config.repository.path = repository.clone();
    }
    // Replaying records writes none, and needs no port.
    config.journal.enabled = false;
    config.validate().map_err(anyhow::Error::msg)?;
    crate::observe::install_recorder();
    let runtime = Runtime::load(&config).map_err(anyhow::Error::msg)?;
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let report = tokio
        .block_on(tickserve_journal::replay::replay(&args.dir, &runtime))
        .map_err(anyhow::Error::msg)?;
    runtime.shutdown();
    print_report(args.json, &report, report.text())?;
    Ok(
        if report.mismatches.is_empty() && report.not_replayed.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}

/// Writes `report` to standard output (as JSON, or as `text`); a closed
/// pipe (`| head`) ends the output quietly.
fn print_report(json: bool, report: &impl serde::Serialize, text: String) -> anyhow::Result<()> {
    use std::io::Write;
    let out = if json {
        serde_json::to_string_pretty(report)? + "\n"
    } else {
        text
    };
    match std::io::stdout().write_all(out.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
