//! The tenant's callback endpoints: each with its URL, filter, state and whose secret signs it
//! (never the secret), a link to its deliveries, and (with an admin key) a button that
//! disables or enables it through [`endpoints::set`], as `PUT /v1/endpoints/{name}` would.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};

use super::Operator;
use super::layout::{self, DoneQuery, Notice, Section};
use crate::app::AppState;
use crate::domain::{EndpointFilter, EndpointName};
use crate::endpoints::{self, EndpointError, EndpointView, SecretOwner};
use crate::store::Scope;

/// `GET /console/endpoints`.
pub async fn list(
    State(app): State<AppState>,
    operator: Operator,
    Query(q): Query<DoneQuery>,
) -> Response {
    let tenant = match operator.tenant(Scope::Read) {
        Ok(t) => t,
        Err(refused) => return refused.into_response(),
    };
    let rows = match endpoints::list(&*app.store, tenant.id).await {
        Ok(rows) => rows,
        Err(err) => return failed(&err),
    };
    let body = html! {
        (layout::notice(q.notice()))
        @if rows.is_empty() { p { "No callback endpoints: decisions are sent nowhere." } } @else {
            table.endpoints {
                thead { tr { th { "Name" } th { "URL" } th { "Takes" } th { "State" } th { "Signed with" } th { "Deliveries" } th {} } }
                tbody {
                    @for e in &rows { (row(&operator, e)) }
                }
            }
        }
        p.hint {
            "Endpoints are set with " code { "PUT /v1/endpoints/{name}" } " or "
            code { "verdict endpoint set" } "; " code { "default" }
            " is the tenant's callback URL. Secrets are shown once, when made, and never here."
        }
    };
    layout::page("Endpoints", &operator, Section::Endpoints, body)
}

/// An endpoint's URL as the console shows it to any operator: without the query, fragment or
/// userinfo, which may carry a receiver's token (the API shows it whole to admin keys).
fn shown_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut url) => {
            crate::delivery::attempt::redact(&mut url);
            url.to_string()
        }
        Err(_) => String::new(),
    }
}

fn row(operator: &Operator, e: &EndpointView) -> Markup {
    let deliveries = format!(
        "/console/deliveries?{}",
        super::events::endpoint_param(e.name.as_str())
    );
    html! {
        tr {
            td { code { (e.name) } }
            td { code { (shown_url(&e.url)) } }
            td { (filter(&e.filter)) }
            td {
                @if e.enabled { span.badge.succeeded { "enabled" } }
                @else { span.badge.suspended { "disabled" } }
            }
            td {
                @match e.secret {
                    SecretOwner::Tenant => "the tenant's webhook secrets",
                    SecretOwner::Own => "its own secret",
                }
            }
            td { a href=(deliveries) { "deliveries" } }
            td {
                @if operator.can_act() {
                    @let (verb, label) = if e.enabled { ("disable", "Disable") } else { ("enable", "Enable") };
                    form method="post" action={ "/console/endpoints/" (e.name) "/" (verb) } {
                        (layout::csrf(operator))
                        button type="submit" { (label) }
                    }
                }
            }
        }
    }
}

/// A filter as each list that narrows it, or "every decision".
fn filter(f: &EndpointFilter) -> Markup {
    let lists = [
        (
            "signal types",
            f.signal_types
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>(),
        ),
        (
            "decisions",
            f.decisions.iter().map(|v| v.as_str()).collect(),
        ),
        ("feeds", f.feeds.iter().map(|v| v.as_str()).collect()),
    ];
    html! {
        @if f.is_empty() { "every decision" } @else {
            ul.filter {
                @for (what, values) in lists {
                    @if !values.is_empty() { li { (what) ": " (values.join(", ")) } }
                }
            }
        }
    }
}

/// The enable and disable forms: the session's CSRF token only. It defaults to empty, so a
/// form without one is refused as a stale form (403) rather than by the extractor.
#[derive(serde::Deserialize)]
pub struct StateForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /console/endpoints/{name}/enable`: enables it; its callbacks suspended meanwhile are
/// each sent once, as `PUT` without `leave_suspended` does.
pub async fn enable(
    State(app): State<AppState>,
    operator: Operator,
    Path(name): Path<String>,
    axum::Form(form): axum::Form<StateForm>,
) -> Response {
    set_enabled(&app, &operator, &name, &form.csrf, true).await
}

/// `POST /console/endpoints/{name}/disable`: disables it; its callbacks are stored suspended.
pub async fn disable(
    State(app): State<AppState>,
    operator: Operator,
    Path(name): Path<String>,
    axum::Form(form): axum::Form<StateForm>,
) -> Response {
    set_enabled(&app, &operator, &name, &form.csrf, false).await
}

/// Enables or disables the endpoint, changing nothing else.
async fn set_enabled(
    app: &AppState,
    operator: &Operator,
    name: &str,
    csrf: &str,
    enabled: bool,
) -> Response {
    let tenant = match operator.acting(csrf, Scope::Admin) {
        Ok(t) => t,
        Err(refused) => return refused.into_response(),
    };
    let Ok(name) = name.parse::<EndpointName>() else {
        return layout::refusal(StatusCode::NOT_FOUND, "No such endpoint.");
    };
    // One statement changes the state alone: a concurrent PUT's URL or filter is kept.
    if let Err(err) = endpoints::set_enabled(&*app.store, tenant.id, &name, enabled).await {
        return failed(&err);
    }
    let notice = if enabled {
        Notice::EndpointEnabled
    } else {
        Notice::EndpointDisabled
    };
    Redirect::to(&format!("/console/endpoints?done={}", notice.name())).into_response()
}

fn failed(err: &EndpointError) -> Response {
    match err {
        EndpointError::NotFound(_) | EndpointError::NoTenant => {
            layout::refusal(StatusCode::NOT_FOUND, "No such endpoint.")
        }
        // The stored URL no longer passes the destination guard, say.
        e if e.is_input() => {
            layout::refusal(StatusCode::BAD_REQUEST, &format!("Not changed: {e}."))
        }
        e => {
            tracing::warn!(error = ?e, "console endpoints page failed");
            layout::refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "The endpoints could not be read or changed; try again in a moment.",
            )
        }
    }
}
