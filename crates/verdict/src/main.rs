//! The `verdict` binary.

use clap::Parser;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc's allocator: a request allocates and frees many small buffers on
/// whichever runtime thread polls it, where glibc's arenas spent about a seventh of the
/// process's CPU (malloc, free and consolidation under `perf`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    init_logging();
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let cli = verdict::cli::Cli::parse();
    match verdict::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr; `VERDICT_LOG` filters (default `info`), `VERDICT_LOG_FORMAT=json`
/// switches to one JSON object per line.
fn init_logging() {
    let filter = EnvFilter::try_from_env("VERDICT_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,tower_http=info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, never in files or collectors.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if std::env::var("VERDICT_LOG_FORMAT").is_ok_and(|f| f == "json") {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init();
    } else {
        builder.init();
    }
}
