//! `verdict send`: sends one signal with the client library (one random key, the same bytes on
//! every retry) and prints the server's decision as JSON.

use std::io::Read;
use std::path::Path;

use anyhow::Context;
use verdict_client::Client;
use verdict_webhooks::Secret;

/// Reads a signal from `file` (`-` for stdin), sends it, prints the decision.
pub async fn run(
    file: &Path,
    url: &str,
    api_key: &str,
    signing_secret: Option<&str>,
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
    let outcome = builder.build()?.send_signal_bytes(&body).await?;
    println!("{}", outcome.body);
    tracing::info!(
        attempts = outcome.attempts,
        replayed = outcome.replayed,
        "signal sent"
    );
    Ok(())
}
