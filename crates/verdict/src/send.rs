//! `verdict send`: sends one signal with the client library (one random key, the same bytes on
//! every retry) and prints the server's decision as JSON.

use std::io::Read;
use std::path::Path;

use anyhow::Context;
use verdict_client::{Client, ClientError};
use verdict_webhooks::Secret;

/// Reads a signal from `file` (`-` for stdin), sends it under `key` (a fresh UUIDv4 if none),
/// prints the decision.
pub async fn run(
    file: &Path,
    url: &str,
    api_key: &str,
    signing_secret: Option<&str>,
    key: Option<&str>,
) -> anyhow::Result<()> {
    let mut body = Vec::new();
    if file.as_os_str() == "-" {
        std::io::stdin().read_to_end(&mut body)?;
    } else {
        body = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    }
    // Validate locally so a typo is reported before anything is sent; the exact bytes are
    // what goes out, so a signature made elsewhere over them would still match.
    serde_json::from_slice::<serde_json::Value>(&body).context("the signal is not valid JSON")?;
    let mut builder = Client::builder(url, api_key);
    if let Some(secret) = signing_secret {
        builder = builder.signing_secret(
            Secret::parse(secret).context("--signing-secret must be a whsec_… secret")?,
        );
    }
    let client = builder.build()?;
    let key = key.map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_owned);
    let outcome = match client.resend_signal_bytes(&body, &key).await {
        Ok(outcome) => outcome,
        // Whether the signal got through is unknown: the same key and bytes find out.
        Err(err @ (ClientError::Unavailable { .. } | ClientError::Network { .. })) => {
            return Err(anyhow::Error::new(err).context(format!(
                "the signal may or may not have been processed: send the same file again with \
                 --idempotency-key {key}"
            )));
        }
        Err(err) => return Err(err.into()),
    };
    println!("{}", outcome.body);
    tracing::info!(
        attempts = outcome.attempts,
        replayed = outcome.replayed,
        "signal sent"
    );
    Ok(())
}
