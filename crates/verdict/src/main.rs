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
    let logs = init_logging();
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let cli = verdict::cli::Cli::parse();
    let result = verdict::cli::run(cli).await;
    // Every log line is written before the final error, and before the process exits.
    drop(logs);
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr; `VERDICT_LOG` filters (default `info`), `VERDICT_LOG_FORMAT=json`
/// switches to one JSON object per line.
///
/// Lines are written by a thread of their own, buffered and flushed whenever it has written
/// every line queued: a request hands its line over instead of taking stderr's lock and making
/// a system call on a runtime thread (about a tenth of a replay's CPU under `perf`). Not lossy: if stderr stops draining, logging waits, as it did before.
/// The guard flushes what is queued when dropped.
fn init_logging() -> tracing_appender::non_blocking::WorkerGuard {
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("verdict-logs")
        .finish(std::io::BufWriter::with_capacity(
            64 * 1024,
            std::io::stderr(),
        ));
    let filter = EnvFilter::try_from_env("VERDICT_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,tower_http=info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
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
    guard
}
