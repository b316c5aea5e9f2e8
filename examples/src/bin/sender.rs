//! A minimal signal sender: one random idempotency key per signal, the same bytes on every
//! retry, and a clear error if a key is ever reused with another body.
//!
//! `VERDICT_API_KEY=vk_… VERDICT_SIGNING_SECRET=whsec_… cargo run -p verdict-examples --bin sender`

use verdict_client::Client;
use verdict_webhooks::Secret;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("VERDICT_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let client = Client::builder(url, std::env::var("VERDICT_API_KEY")?)
        .signing_secret(Secret::parse(&std::env::var("VERDICT_SIGNING_SECRET")?)?)
        .build()?;

    let observed_at =
        time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339)?;
    let signal = serde_json::json!({
        "type": "sim_swap",
        "subject": { "phone": "+447700900123" },
        "observed_at": observed_at,
        "metadata": { "ticket": "T-1" },
    });
    let outcome = client.send_signal(&signal).await?;
    println!("{}", outcome.body);
    Ok(())
}
