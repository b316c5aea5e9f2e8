//! The `verdict` binary.

use clap::Parser;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, filter::filter_fn};
use verdict::telemetry::Tracing;

/// mimalloc instead of glibc's allocator: a request allocates and frees many small buffers on
/// whichever runtime thread polls it, where glibc's arenas spent about a seventh of the
/// process's CPU (malloc, free and consolidation under `perf`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = verdict::cli::Cli::parse();
    let serving = matches!(cli.command, verdict::cli::Command::Serve(_));
    // Only the long-running commands trace; the others are one-off and some print JSON.
    let traced = serving || matches!(cli.command, verdict::cli::Command::Worker { .. });
    let traces = match traced.then(Tracing::from_env).transpose() {
        Ok(traces) => traces.flatten(),
        Err(err) => {
            eprintln!("error: {:#}", anyhow::Error::from(err));
            return std::process::ExitCode::FAILURE;
        }
    };
    let logs = init_logging(serving, traces.as_ref());
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let result = verdict::cli::run(cli).await;
    // The spans still queued are exported before the process exits, and before the logs'
    // last lines (a failure to flush is one of them).
    if let Some(traces) = traces
        && let Err(err) = traces.shutdown().await
    {
        tracing::warn!(error = ?err, "traces still queued were lost");
    }
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
///
/// With `traces`, verdict's spans are also exported as OpenTelemetry traces
/// ([`verdict::telemetry`]).
fn init_logging(
    serving: bool,
    traces: Option<&Tracing>,
) -> Option<tracing_appender::non_blocking::WorkerGuard> {
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
    // Colour codes only for a person at a terminal, never in files or collectors.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let json = std::env::var("VERDICT_LOG_FORMAT").is_ok_and(|f| f == "json");
    match traces {
        None => init_logs_only(writer, filter, ansi, json),
        Some(traces) => init_logs_and_traces(traces, writer, filter, ansi, json),
    }
    guard
}

/// Logs alone, `filter` deciding for the whole subscriber: with traces off nothing of
/// OpenTelemetry is installed, and a request costs what it always has.
fn init_logs_only(writer: BoxMakeWriter, filter: EnvFilter, ansi: bool, json: bool) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi);
    if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init();
    } else {
        builder.init();
    }
}

/// Logs and traces side by side under `VERDICT_LOG`'s filter; the logs leave out the spans
/// only traces need, so a log line reads the same with traces on.
fn init_logs_and_traces(
    traces: &Tracing,
    writer: BoxMakeWriter,
    filter: EnvFilter,
    ansi: bool,
    json: bool,
) {
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi);
    let logs = if json {
        logs.json()
            .flatten_event(true)
            .with_current_span(true)
            .boxed()
    } else {
        logs.boxed()
    };
    let not_trace_only = filter_fn(|meta| meta.target() != verdict::telemetry::TARGET);
    tracing_subscriber::registry()
        .with(filter)
        .with(logs.with_filter(not_trace_only))
        .with(traces.layer())
        .init();
}
