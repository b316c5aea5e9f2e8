//! The operator console at `/console/`: server-rendered pages for events, decisions, deliveries
//! and dead letters, callback endpoints, the playbook with its simulation before publishing,
//! live numbers, and subjects: one found by the phone number or account id posted in a form, and the way back
//! from a rule's effect on it (unlock, lift the deny, close the case).
//!
//! No script runs on any page: forms post, the server redirects (or, for a form that carries a
//! subject's identifier, which must stay out of URLs, answers with the page), charts are SVG
//! drawn on the server. The content security policy allows only the console's own stylesheet. Sign-in takes
//! an API key (`read` to look, `admin` to act) and opens a server-side session whose random
//! token is all the `HttpOnly`, `SameSite=Strict` cookie scoped to `/console` holds (`Secure`
//! when the request came over TLS); every form that acts carries a CSRF token derived from the
//! session.

mod endpoints;
mod events;
mod layout;
mod live;
mod playbook;
mod sessions;
mod sign_in;
mod subjects;
mod throttle;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::app::AppState;
use crate::clock::now_ms;
use crate::problem::Problem;
use crate::secrets::hex;
use crate::store::{KeyGrant, Scope, TenantRecord};

pub use crate::store::ports::ConsoleStore;
pub use sessions::SessionLifetimes;
pub use throttle::SignInThrottle;

/// What the console keeps between requests on this instance: how long sessions last, and the
/// sign-in throttle's counts.
#[derive(Default)]
pub struct Console {
    /// How long sessions last.
    pub sessions: SessionLifetimes,
    /// Failed sign-ins by address and key prefix.
    pub throttle: SignInThrottle,
}

impl Console {
    /// A console whose sessions last `sessions`.
    pub fn new(sessions: SessionLifetimes) -> Self {
        Self {
            sessions,
            throttle: SignInThrottle::new(),
        }
    }
}

impl AppState {
    /// The console's port onto the store.
    pub(crate) fn console_store(&self) -> &dyn ConsoleStore {
        &*self.store
    }
}

/// Largest form a console page posts (a 64 KiB playbook, form-encoded).
const MAX_FORM_BYTES: usize = 256 * 1024;
/// Only the console's own stylesheet; no script, no frames, forms post only here.
const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

/// The console's routes, to nest at `/console`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/console/events") }))
        .route("/sign-in", get(sign_in::page).post(sign_in::sign_in))
        .route("/sign-out", post(sign_in::sign_out))
        .route("/events", get(events::list))
        .route("/events/{id}", get(events::show))
        .route("/deliveries", get(events::deliveries))
        .route("/deliveries/{id}/redeliver", post(events::redeliver))
        .route("/deliveries/{id}/resolve", post(events::resolve))
        .route("/endpoints", get(endpoints::list))
        .route("/endpoints/{name}/enable", post(endpoints::enable))
        .route("/endpoints/{name}/disable", post(endpoints::disable))
        .route("/playbook", get(playbook::show))
        .route("/playbook/check", post(playbook::check))
        .route("/playbook/publish", post(playbook::publish))
        .route("/live", get(live::show))
        .route("/subjects", get(subjects::show))
        .route("/subjects/lookup", post(subjects::lookup))
        .route("/subjects/unlock", post(subjects::unlock))
        .route("/subjects/lift-deny", post(subjects::lift_deny))
        .route("/subjects/close-case", post(subjects::close_case))
        .route("/static/console.css", get(stylesheet))
        .route("/static/favicon.svg", get(favicon))
        .layer(DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(axum::middleware::map_response(security_headers))
}

async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // No referrer to other sites; to this one, the form posts' `Origin` (under `no-referrer`
    // a browser sends `Origin: null`, which the sign-in's same-origin check must refuse).
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        include_str!("console.css"),
    )
        .into_response()
}

async fn favicon() -> Response {
    (
        [
            (header::CONTENT_TYPE, "image/svg+xml"),
            (header::CACHE_CONTROL, "public, max-age=86400"),
        ],
        include_str!("favicon.svg"),
    )
        .into_response()
}

/// A signed-in operator: the session's key grant, the session, and its CSRF token.
pub struct Operator {
    grant: KeyGrant,
    /// The digest the session is stored under.
    session: [u8; 32],
    csrf: String,
}

impl Operator {
    /// The tenant, if the key may do `needed`.
    fn tenant(&self, needed: Scope) -> Result<TenantRecord, Refused> {
        if self.grant.scope.allows(needed) {
            Ok(self.grant.tenant.clone())
        } else {
            Err(Refused::NeedsAdmin)
        }
    }

    /// The tenant, for a form that acts: its CSRF token must be this session's, and the key
    /// may do `needed`.
    fn acting(&self, posted_csrf: &str, needed: Scope) -> Result<TenantRecord, Refused> {
        if !self.csrf_ok(posted_csrf) {
            return Err(Refused::StaleForm);
        }
        self.tenant(needed)
    }

    /// Whether a posted token is this session's.
    fn csrf_ok(&self, posted: &str) -> bool {
        bool::from(self.csrf.as_bytes().ct_eq(posted.as_bytes()))
    }

    fn can_act(&self) -> bool {
        self.grant.scope.allows(Scope::Admin)
    }

    /// The signed-in API key, for the record of what it did.
    fn key_id(&self) -> uuid::Uuid {
        self.grant.key_id
    }
}

impl FromRequestParts<AppState> for Operator {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, Response> {
        let to_sign_in = |clear: bool| {
            let mut response = Redirect::to("/console/sign-in").into_response();
            if clear {
                // An ended session's cookie is of no more use; the browser may drop it.
                response
                    .headers_mut()
                    .insert(header::SET_COOKIE, sessions::cleared());
            }
            response
        };
        let Some(session) = sessions::Token::digest_from(&parts.headers) else {
            return Err(to_sign_in(false));
        };
        let found = sessions::resume(
            app.console_store(),
            app.console.sessions,
            &session,
            now_ms(),
        )
        .await;
        let grant = match found {
            Ok(Some(found)) if found.grant.scope.allows(Scope::Read) => found.grant,
            Ok(_) => return Err(to_sign_in(true)),
            Err(err) => {
                tracing::warn!(error = ?err, "console session check failed");
                return Err(Problem::unavailable().into_response());
            }
        };
        if let Err(err) = app.rate_limits.admit(&grant.tenant) {
            return Err(crate::app::error::ApiError::from(err).into_response());
        }
        Ok(Self {
            csrf: csrf_token(app, &session),
            session,
            grant,
        })
    }
}

/// Why a signed-in operator may not do what a page asked.
pub enum Refused {
    /// A read key tried to act.
    NeedsAdmin,
    /// A form without this session's CSRF token.
    StaleForm,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let message = match self {
            Self::NeedsAdmin => "This needs an admin key; you are signed in with a read key.",
            Self::StaleForm => "The form has expired; reload the page.",
        };
        layout::refusal(StatusCode::FORBIDDEN, message)
    }
}

/// The session's CSRF token: a keyed digest of the session's stored digest, so it needs no
/// storage of its own, cannot be made without the master key, and ends with the session.
fn csrf_token(app: &AppState, session: &[u8; 32]) -> String {
    hex(&app.keys.digest(&[b"console csrf v2", session]))
}

#[derive(Deserialize)]
struct CsrfOnly {
    csrf: String,
}
