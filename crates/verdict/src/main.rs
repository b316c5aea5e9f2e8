//! The `verdict` binary.

use clap::Parser;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

/// mimalloc instead of glibc's allocator: a request allocates and frees many small buffers on
/// whichever runtime thread polls it, where glibc's arenas spent about a seventh of the
/// process's CPU (malloc, free and consolidation under `perf`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = verdict::cli::Cli::parse();
    let logs = init_logging(matches!(cli.command, verdict::cli::Command::Serve(_)));
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let result = verdict::cli::run(cli).await;
    // Every line queued is written before the final error, and before the process exits.
    drop(logs);
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Lines queued for the log thread before a request waits for it to catch up.
const QUEUED_LOG_LINES: usize = 8 * 1024;

/// Logs go to stderr; `VERDICT_LOG` filters (default `info`), `VERDICT_LOG_FORMAT=json`
/// switches to one JSON object per line.
///
/// `serve` hands its lines to a thread of their own, which writes them buffered and flushes
/// whenever it has written every line queued: a request no longer takes stderr's lock and makes
/// a system call on a runtime thread (about a tenth of a replay's CPU under `perf`). At most
/// [`QUEUED_LOG_LINES`] wait (each line's request path is capped, so a few MiB); past that,
/// logging waits for stderr, as it always did, rather than dropping lines. Dropping the guard
/// writes what is queued. The other commands, short-lived and some printing JSON on stdout,
/// write to stderr directly.
fn init_logging(serving: bool) -> Option<tracing_appender::non_blocking::WorkerGuard> {
    let (writer, guard) = if serving {
        let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
            .lossy(false)
            .buffered_lines_limit(QUEUED_LOG_LINES)
            .thread_name("verdict-logs")
            .finish(std::io::BufWriter::with_capacity(
                64 * 1024,
                std::io::stderr(),
            ));
        (BoxMakeWriter::new(writer), Some(guard))
    } else {
        (BoxMakeWriter::new(std::io::stderr), None)
    };
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
