//! Signing in and out. A sign-in is refused when the browser says another site sent it (login
//! CSRF: signing a victim into the attacker's tenant), throttled per client address and key
//! prefix ([`super::throttle`]), and opens a server-side session ([`super::sessions`]);
//! sign-out deletes it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::Extension;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::layout;
use super::sessions;
use super::{CsrfOnly, Operator};
use crate::app::AppState;
use crate::clock::now_ms;
use crate::problem::Problem;
use crate::secrets::api_key_hash;
use crate::store::Scope;

/// Longest key a sign-in looks up: keys are 46 characters; a longer one is not a key.
const MAX_KEY_CHARS: usize = 256;

fn form(error: Option<&str>) -> Markup {
    html! {
        form.sign-in method="post" action="/console/sign-in" {
            h1 { "verdict console" }
            @if let Some(error) = error {
                p.error role="alert" { (error) }
            }
            label for="api_key" { "API key (read or admin scope)" }
            input #api_key type="password" name="api_key" autocomplete="off" required;
            button type="submit" { "Sign in" }
        }
    }
}

/// `GET /console/sign-in`.
pub async fn page() -> Response {
    layout::bare("Sign in", form(None))
}

/// The sign-in page again, with why the last one was refused.
fn refused(status: StatusCode, why: &str) -> Response {
    (status, layout::bare("Sign in", form(Some(why)))).into_response()
}

/// The sign-in form's one field.
#[derive(Deserialize)]
pub struct SignIn {
    api_key: String,
}

/// Whether the browser says another site sent this request: `Sec-Fetch-Site` other than
/// `same-origin` or `none` (typed or bookmarked), or an `Origin` that is not this server as
/// the `Host` header names it. Clients that send neither (scripts, older browsers) pass; a
/// browser that a cross-site page drives sends at least one.
fn from_another_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        let ours = site
            .to_str()
            .is_ok_and(|s| s.eq_ignore_ascii_case("same-origin") || s.eq_ignore_ascii_case("none"));
        if !ours {
            return true;
        }
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let (Ok(origin), Some(host)) = (origin.to_str(), host) else {
        return true;
    };
    // Either scheme: TLS usually ends at a proxy in front, which may not say so, and an
    // origin on this very host is not another site.
    let ours = ["http://", "https://"].iter().any(|scheme| {
        origin
            .strip_prefix(scheme)
            .is_some_and(|rest| rest.eq_ignore_ascii_case(host))
    });
    !ours
}

/// Whether the request reached us over TLS (directly or through a proxy that says so).
fn over_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

/// `POST /console/sign-in`: a read or admin key opens a session.
pub async fn sign_in(
    State(app): State<AppState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<SignIn>,
) -> Response {
    if from_another_site(&headers) {
        tracing::info!("console sign-in from another site refused");
        return refused(
            StatusCode::FORBIDDEN,
            "Sign-in forms posted from another site are refused; open the console here and \
             sign in.",
        );
    }
    let key = form.api_key.trim();
    // Without the accept loop's address (never in `serve`), every client shares one budget:
    // stricter, never looser.
    let address = peer.map_or(
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        |Extension(ConnectInfo(a))| a.ip(),
    );
    let attempt = match app.console.throttle.attempt(address, key) {
        Ok(attempt) => attempt,
        Err(throttled) => {
            tracing::info!(%address, "console sign-in throttled");
            let mut response = refused(
                StatusCode::TOO_MANY_REQUESTS,
                "Too many failed sign-ins; wait a few minutes and try again.",
            );
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(throttled.retry_after_secs),
            );
            return response;
        }
    };
    let well_formed =
        !key.is_empty() && key.len() <= MAX_KEY_CHARS && key.bytes().all(|b| b.is_ascii_graphic());
    if !well_formed {
        return refused(StatusCode::UNAUTHORIZED, "That is not a valid API key.");
    }
    // From the database, not the key cache: a key revoked a moment ago opens no session
    // (which its first page would refuse anyway).
    let grant = match app.store.grant_by_key_hash(&api_key_hash(key)).await {
        Ok(Some(grant)) => grant,
        Ok(None) => return refused(StatusCode::UNAUTHORIZED, "That API key is not valid."),
        Err(err) => {
            attempt.succeeded();
            tracing::warn!(error = ?err, "console sign-in failed");
            return Problem::unavailable().into_response();
        }
    };
    // A real key is no guess, whatever its scope.
    attempt.succeeded();
    if !grant.scope.allows(Scope::Read) {
        return refused(
            StatusCode::FORBIDDEN,
            "An ingest key can only send signals; sign in with a read or admin key.",
        );
    }
    let token =
        match sessions::open(app.console_store(), app.console.sessions, &grant, now_ms()).await {
            Ok(token) => token,
            Err(err) => {
                tracing::warn!(error = ?err, "opening a console session failed");
                return Problem::unavailable().into_response();
            }
        };
    tracing::info!(tenant_id = %grant.tenant.id, key_id = %grant.key_id, "console sign-in");
    let mut response = Redirect::to("/console/events").into_response();
    if let Some(cookie) = sessions::cookie(&token, over_tls(&headers)) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

/// `POST /console/sign-out`: ends the session, so its cookie signs no one in again.
pub async fn sign_out(
    State(app): State<AppState>,
    operator: Operator,
    axum::Form(form): axum::Form<CsrfOnly>,
) -> Response {
    if let Err(refused) = operator.acting(&form.csrf, Scope::Read) {
        return refused.into_response();
    }
    if let Err(err) = sessions::end(app.console_store(), &operator.session).await {
        tracing::warn!(error = ?err, "ending a console session failed");
        return Problem::unavailable().into_response();
    }
    let mut response = Redirect::to("/console/sign-in").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, sessions::cleared());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(*name, HeaderValue::from_static(value));
        }
        h
    }

    #[test]
    fn only_sign_ins_from_this_origin_or_without_browser_headers_pass() {
        let host = ("host", "console.example:8080");
        for ours in [
            headers(&[host]),
            headers(&[host, ("sec-fetch-site", "same-origin")]),
            headers(&[host, ("sec-fetch-site", "none")]),
            headers(&[host, ("origin", "http://console.example:8080")]),
            headers(&[host, ("origin", "https://Console.Example:8080")]),
        ] {
            assert!(!from_another_site(&ours), "{ours:?}");
        }
        for theirs in [
            headers(&[host, ("sec-fetch-site", "cross-site")]),
            headers(&[host, ("sec-fetch-site", "same-site")]),
            headers(&[host, ("sec-fetch-site", "whatever")]),
            headers(&[host, ("origin", "https://evil.example")]),
            headers(&[host, ("origin", "http://console.example:8081")]),
            headers(&[host, ("origin", "http://console.example:8080.evil.example")]),
            headers(&[host, ("origin", "null")]),
            headers(&[("origin", "http://console.example:8080")]),
            headers(&[
                host,
                ("sec-fetch-site", "same-origin"),
                ("origin", "https://evil.example"),
            ]),
        ] {
            assert!(from_another_site(&theirs), "{theirs:?}");
        }
    }
}
