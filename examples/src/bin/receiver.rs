//! A minimal verdict callback receiver: verifies each request over its raw bytes, deduplicates
//! it in a SQLite file that outlives verdict's retries, answers 2xx, then handles it once.
//!
//! `VERDICT_WEBHOOK_SECRET=whsec_… cargo run -p verdict-examples --bin receiver`

use std::convert::Infallible;

use verdict_receiver::{Event, Receiver, SqliteDedupStore};
use verdict_webhooks::Secret;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secret = Secret::parse(&std::env::var("VERDICT_WEBHOOK_SECRET")?)?;
    let store = SqliteDedupStore::open("received-callbacks.db").await?;
    let receiver = Receiver::builder(store).secret(secret).build()?;

    let app = verdict_receiver::axum::router(receiver, |event: Event| async move {
        let e = &event.envelope;
        println!(
            "{}: {} for subject {}",
            e.event_id, e.decision, e.subject_hash
        );
        Ok::<_, Infallible>(())
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:9000").await?;
    axum::serve(listener, app).await?;
    Ok(())
}
