//! The operator console at `/console/`: server-rendered pages for events, decisions, deliveries
//! and dead letters, the playbook with its simulation before publishing, live numbers, and
//! subjects: one found by the phone number or account id posted in a form, and the way back
//! from a rule's effect on it (unlock, lift the deny, close the case).
//!
//! No script runs on any page: forms post, the server redirects (or, for a form that carries a
//! subject's identifier, which must stay out of URLs, answers with the page), charts are SVG
//! drawn on the server. The content security policy allows only the console's own stylesheet. Sign-in takes
//! an API key (`read` to look, `admin` to act) and keeps it in an `HttpOnly`, `SameSite=Strict`
//! cookie scoped to `/console` (`Secure` when the request came over TLS); every form that acts
//! carries a CSRF token derived from the key.

mod events;
mod layout;
mod live;
mod playbook;
mod subjects;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::html;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::app::AppState;
use crate::problem::Problem;
use crate::secrets::{api_key_hash, hex};
use crate::store::{KeyGrant, Scope, TenantRecord};

pub use crate::store::ports::ConsoleStore;

impl AppState {
    /// The console's port onto the store.
    pub(crate) fn console_store(&self) -> &dyn ConsoleStore {
        &*self.store
    }
}

/// The cookie that holds the signed-in API key.
const COOKIE: &str = "verdict_console";
/// Largest form a console page posts (a 64 KiB playbook, form-encoded).
const MAX_FORM_BYTES: usize = 256 * 1024;
/// Only the console's own stylesheet; no script, no frames, forms post only here.
const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

/// The console's routes, to nest at `/console`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/console/events") }))
        .route("/sign-in", get(sign_in_page).post(sign_in))
        .route("/sign-out", post(sign_out))
        .route("/events", get(events::list))
        .route("/events/{id}", get(events::show))
        .route("/deliveries", get(events::deliveries))
        .route("/deliveries/{id}/redeliver", post(events::redeliver))
        .route("/deliveries/{id}/resolve", post(events::resolve))
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
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
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

/// A signed-in operator: the key's grant, and its CSRF token.
pub struct Operator {
    grant: KeyGrant,
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
        let to_sign_in = || Redirect::to("/console/sign-in").into_response();
        let Some(key) = cookie(&parts.headers) else {
            return Err(to_sign_in());
        };
        let grant = match app.credentials.grant(key).await {
            Ok(Some(grant)) if grant.scope.allows(Scope::Read) => grant,
            Ok(_) => return Err(to_sign_in()),
            Err(err) => {
                tracing::warn!(error = ?err, "console sign-in check failed");
                return Err(Problem::unavailable().into_response());
            }
        };
        if let Err(err) = app.rate_limits.admit(&grant.tenant) {
            return Err(crate::app::error::ApiError::from(err).into_response());
        }
        Ok(Self {
            csrf: csrf_token(app, key),
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

/// The session's CSRF token: a keyed digest of the API key, so it needs no storage and cannot
/// be made without the key.
fn csrf_token(app: &AppState, api_key: &str) -> String {
    hex(&app
        .keys
        .digest(&[b"console csrf v1", &api_key_hash(api_key)]))
}

fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
        .filter(|v| !v.is_empty())
}

/// Whether the request reached us over TLS (directly or through a proxy that says so).
fn over_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

async fn sign_in_page() -> Response {
    layout::bare(
        "Sign in",
        html! {
            form.sign-in method="post" action="/console/sign-in" {
                h1 { "verdict console" }
                label for="api_key" { "API key (read or admin scope)" }
                input #api_key type="password" name="api_key" autocomplete="off" required;
                button type="submit" { "Sign in" }
            }
        },
    )
}

#[derive(Deserialize)]
struct SignIn {
    api_key: String,
}

async fn sign_in(
    State(app): State<AppState>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<SignIn>,
) -> Response {
    let key = form.api_key.trim();
    let refused = |why: &str| {
        layout::bare(
            "Sign in",
            html! {
                form.sign-in method="post" action="/console/sign-in" {
                    h1 { "verdict console" }
                    p.error role="alert" { (why) }
                    label for="api_key" { "API key (read or admin scope)" }
                    input #api_key type="password" name="api_key" autocomplete="off" required;
                    button type="submit" { "Sign in" }
                }
            },
        )
    };
    let cookie_safe = !key.is_empty() && key.bytes().all(|b| b.is_ascii_graphic() && b != b';');
    if !cookie_safe {
        return (
            StatusCode::UNAUTHORIZED,
            refused("That is not a valid API key."),
        )
            .into_response();
    }
    match app.credentials.grant(key).await {
        Ok(Some(grant)) if grant.scope.allows(Scope::Read) => {
            tracing::info!(tenant_id = %grant.tenant.id, key_id = %grant.key_id, "console sign-in");
            let secure = if over_tls(&headers) { "; Secure" } else { "" };
            let cookie =
                format!("{COOKIE}={key}; Path=/console; HttpOnly; SameSite=Strict{secure}");
            let mut response = Redirect::to("/console/events").into_response();
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            response
        }
        Ok(Some(_)) => (
            StatusCode::FORBIDDEN,
            refused("An ingest key can only send signals; sign in with a read or admin key."),
        )
            .into_response(),
        Ok(None) => (
            StatusCode::UNAUTHORIZED,
            refused("That API key is not valid."),
        )
            .into_response(),
        Err(err) => {
            tracing::warn!(error = ?err, "console sign-in failed");
            Problem::unavailable().into_response()
        }
    }
}

#[derive(Deserialize)]
struct CsrfOnly {
    csrf: String,
}

async fn sign_out(operator: Operator, axum::Form(form): axum::Form<CsrfOnly>) -> Response {
    if let Err(refused) = operator.acting(&form.csrf, Scope::Read) {
        return refused.into_response();
    }
    let mut response = Redirect::to("/console/sign-in").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "verdict_console=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0",
        ),
    );
    response
}
