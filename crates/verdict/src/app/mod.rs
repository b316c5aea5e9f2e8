//! What the HTTP edges (the API and the console) share: the state every handler gets, the
//! error every handler can fail with, how connections are accepted, and the layers every
//! request passes through.

pub mod body_deadline;
pub mod connections;
pub mod error;
mod layers;

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::delivery::Deliverer;
use crate::feeds::set::SetReceiver;
use crate::ingest::Ingest;
use crate::rate_limit::RateLimits;
use crate::secrets::Keyring;
use crate::store::Store;
use crate::tenant::Credentials;

pub use layers::{DECISION_FIELD, EVENT_ID_FIELD, RESPONSE_LOG_TARGET, layered};

/// What handlers share, behind one `Arc`: axum clones the state for every request (and its
/// middleware), and one reference count is cheaper to move than eight.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    /// Shares `shared` with every handler.
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }

    /// What an operator's way back runs on, from the API or the console.
    pub fn way_back_means(&self) -> crate::subjects::Means<'_> {
        let settings = self.ingest.settings();
        crate::subjects::Means {
            store: self.store.clone(),
            keys: &self.keys,
            deliverer: self.deliverer.clone(),
            background: self.ingest.background(),
            keying: crate::subjects::Keying {
                key_ttl_ms: settings.key_ttl_ms,
                lock_timeout_ms: settings.lock_timeout_ms,
            },
        }
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`AppState`] holds.
pub struct Shared {
    pub store: Arc<dyn Store>,
    pub keys: Arc<Keyring>,
    pub ingest: Arc<Ingest>,
    pub deliverer: Arc<Deliverer>,
    /// What API keys grant and tenants' secrets, cached for at most 5 s.
    pub credentials: Arc<Credentials>,
    /// Each tenant's rate limiter.
    pub rate_limits: Arc<RateLimits>,
    /// Verifies Security Event Tokens against each tenant's transmitter.
    pub sets: Arc<SetReceiver>,
    /// The console's session lifetimes and sign-in throttle.
    pub console: Arc<crate::console::Console>,
    pub metrics: Option<PrometheusHandle>,
    /// The bearer token `GET /metrics` requires, if one is configured.
    pub metrics_token: Option<crate::config::MetricsToken>,
    /// Each tenant's daily quota of events, as this instance knows it.
    pub quota: Arc<crate::quota::DailyQuota>,
    /// The playbook simulations running now: one per tenant, a few across tenants.
    pub simulations: crate::playbook::simulation::Simulations,
}
