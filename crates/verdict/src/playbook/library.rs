//! Playbook versions as stored: uploading one, reading the one in force, and a cache of
//! parsed versions (a version never changes once stored).

use std::sync::{Arc, OnceLock};

use super::{DEFAULT_SOURCE, DEFAULT_VERSION, Format, Playbook, PlaybookError};
use crate::store::ports::PlaybookPort;
use crate::store::{PlaybookStore, StoreError, StoredPlaybook};

/// Why a playbook could not be read or replaced.
#[derive(Debug, thiserror::Error)]
pub enum PlaybookStoreError {
    #[error(transparent)]
    Invalid(#[from] PlaybookError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Validates `source` and stores it as the tenant's next version; the old one stays in force
/// if validation fails.
pub async fn upload(
    store: &dyn PlaybookPort,
    tenant_id: uuid::Uuid,
    source: &str,
    format: Format,
) -> Result<i64, PlaybookStoreError> {
    let playbook = Playbook::parse(source, format)?;
    let connectors = store.connectors(tenant_id).await?;
    playbook.check_bindings(source, &connectors)?;
    let now = crate::clock::now_ms();
    Ok(store
        .put_playbook(tenant_id, format.as_str(), source, now)
        .await?)
}

/// A tenant's current playbook source: its newest upload, or the default.
pub async fn current_source(
    store: &(dyn PlaybookStore + Send + Sync),
    tenant_id: uuid::Uuid,
) -> Result<StoredPlaybook, StoreError> {
    Ok(store
        .current_playbook(tenant_id)
        .await?
        .unwrap_or_else(|| StoredPlaybook {
            version: DEFAULT_VERSION,
            format: Format::Toml.as_str().into(),
            source: DEFAULT_SOURCE.into(),
            created_at: 0,
        }))
}

/// Parsed playbooks by tenant and version, so a decision costs no parse. Versions are
/// immutable, so entries never go stale; the cache is bounded by entries.
pub struct Library {
    parsed: moka::sync::Cache<(uuid::Uuid, i64), Arc<Playbook>>,
}

impl Default for Library {
    fn default() -> Self {
        Self {
            parsed: moka::sync::Cache::new(10_000),
        }
    }
}

impl Library {
    /// The tenant's playbook of `version` (`None`: the built-in default) and its version.
    pub async fn get(
        &self,
        store: &(dyn PlaybookStore + Send + Sync),
        tenant_id: uuid::Uuid,
        version: Option<i64>,
    ) -> Result<(Arc<Playbook>, i64), StoreError> {
        let Some(version) = version else {
            return Ok((default_arc(), DEFAULT_VERSION));
        };
        if let Some(playbook) = self.parsed.get(&(tenant_id, version)) {
            return Ok((playbook, version));
        }
        let stored = store
            .playbook_version(tenant_id, version)
            .await?
            .ok_or_else(|| {
                StoreError::Corrupt(format!("playbook version {version} is gone").into())
            })?;
        let format = Format::from_name(&stored.format).unwrap_or(Format::Toml);
        // Uploads are validated, so a stored playbook that no longer parses means the row was
        // changed behind our back: a final error, not something a retry fixes.
        let playbook = Arc::new(
            Playbook::parse_stored(&stored.source, format)
                .map_err(|e| StoreError::Corrupt(Box::new(e)))?,
        );
        self.parsed.insert((tenant_id, version), playbook.clone());
        Ok((playbook, version))
    }
}

/// The built-in default, shared.
fn default_arc() -> Arc<Playbook> {
    static DEFAULT: OnceLock<Arc<Playbook>> = OnceLock::new();
    DEFAULT
        .get_or_init(|| Arc::new(Playbook::default_playbook().clone()))
        .clone()
}
