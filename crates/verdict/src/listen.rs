//! `verdict listen`: a callback receiver built on the receiver library, for trying verdict out
//! and for scripts. Prints each verified, deduplicated callback once, as one JSON line on
//! stdout; duplicates and refused requests print nothing.

use std::io::Write;
use std::net::SocketAddr;

use anyhow::Context;
use verdict_receiver::{
    DedupStore, Event, MemoryDedupStore, PostgresDedupStore, Receiver, SqliteDedupStore,
};
use verdict_webhooks::Secret;

/// Runs the receiver until interrupted.
pub async fn run(secret: &str, listen: SocketAddr, db: Option<&str>) -> anyhow::Result<()> {
    let secret = Secret::parse(secret).context("--secret must be a whsec_… webhook secret")?;
    let receiver = match db {
        None => build(MemoryDedupStore::new(), secret)?,
        Some(url) if url.starts_with("sqlite:") => build(
            SqliteDedupStore::connect(url)
                .await
                .context("opening the dedup store")?,
            secret,
        )?,
        Some(url) if url.starts_with("postgres") => build(
            PostgresDedupStore::connect(url)
                .await
                .context("opening the dedup store")?,
            secret,
        )?,
        Some(_) => anyhow::bail!("--db must be sqlite://PATH or postgres://…"),
    };
    let handler = |event: Event| async move {
        let mut out = std::io::stdout().lock();
        out.write_all(&event.body)?;
        out.write_all(b"\n")?;
        out.flush()
    };
    let app = axum::Router::new()
        .route(
            "/",
            verdict_receiver::axum::endpoint(receiver.clone(), handler),
        )
        .route(
            "/{*path}",
            verdict_receiver::axum::endpoint(receiver, handler),
        );
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    tracing::info!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

fn build(store: impl DedupStore, secret: Secret) -> anyhow::Result<Receiver> {
    Ok(Receiver::builder(store).secret(secret).build()?)
}
