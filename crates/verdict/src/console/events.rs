//! Events, one event with its deliveries and attempts, the deliveries list, redelivery, and the
//! resolution of an unknown outcome.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::layout::{self, Notice, Section};
use super::{CsrfOnly, Operator};
use crate::app::AppState;
use crate::delivery::resolve::{self, ResolveError, Settled};
use crate::delivery::{DeliveryStatus, Redelivered, current_outcomes};
use crate::domain::{ActionResult, EndpointName, MAX_REASON_CHARS};
use crate::secrets::hex;
use crate::store::{DeliveryRecord, EventFilter, EventRecord, Scope};

/// Rows per page.
const PAGE: i64 = 50;

/// The events list's filters, as the form sends them (empty fields mean "any").
#[derive(Debug, Default, Deserialize)]
pub struct EventsQuery {
    #[serde(rename = "type", default)]
    signal_type: String,
    #[serde(default)]
    decision: String,
    /// A date (`YYYY-MM-DD`) or an RFC 3339 time.
    #[serde(default)]
    since: String,
    #[serde(default)]
    before: String,
}

const TYPES: [&str; 4] = ["sim_swap", "port_out", "credential_breach", "unmapped"];
/// `ignored`: a feed event whose type the playbook does not map; it decided nothing.
const DECISIONS: [&str; 4] = ["allow", "step_up", "deny", "ignored"];

/// Unix ms of a `YYYY-MM-DD` date (midnight UTC) or an RFC 3339 time.
fn parse_since(text: &str) -> Option<i64> {
    use time::format_description::well_known::Rfc3339;
    let date_format = time::macros::format_description!("[year]-[month]-[day]");
    time::OffsetDateTime::parse(text, &Rfc3339)
        .ok()
        .or_else(|| {
            time::Date::parse(text, &date_format)
                .ok()
                .map(|d| d.midnight().assume_utc())
        })
        .map(crate::clock::to_ms)
}

/// `GET /console/events`.
pub async fn list(
    State(app): State<AppState>,
    operator: Operator,
    Query(q): Query<EventsQuery>,
) -> Response {
    let tenant = match operator.tenant(Scope::Read) {
        Ok(t) => t,
        Err(refused) => return refused.into_response(),
    };
    let pick = |value: &str, allowed: &[&str]| allowed.contains(&value).then(|| value.to_owned());
    let filter = EventFilter {
        signal_type: pick(&q.signal_type, &TYPES),
        decision: pick(&q.decision, &DECISIONS),
        since: parse_since(q.since.trim()),
        until: None,
    };
    let before = Uuid::parse_str(&q.before).ok();
    let events = match app
        .console_store()
        .filtered_events(tenant.id, &filter, before, PAGE)
        .await
    {
        Ok(events) => events,
        Err(err) => return unavailable(&err),
    };
    let next = (events.len() as i64 == PAGE)
        .then(|| events.last().map(|e| e.id))
        .flatten();
    let body = html! {
        form.filters method="get" action="/console/events" {
            label { "Type "
                select name="type" {
                    option value="" { "any" }
                    @for t in TYPES { option value=(t) selected[q.signal_type == t] { (t) } }
                }
            }
            label { "Decision "
                select name="decision" {
                    option value="" { "any" }
                    @for d in DECISIONS { option value=(d) selected[q.decision == d] { (d) } }
                }
            }
            label { "Since " input type="date" name="since" value=(q.since); }
            button type="submit" { "Filter" }
        }
        @if events.is_empty() {
            p { "No events match." }
        } @else {
            table.events {
                thead { tr { th { "Created (UTC)" } th { "Type" } th { "Feed" } th { "Decision" } th { "Rule" } th { "Playbook" } } }
                tbody {
                    @for e in &events {
                        tr {
                            td { a href={ "/console/events/" (e.id) } { (layout::time(e.created_at)) } }
                            td { (e.signal_type) }
                            td { (e.feed) }
                            td { (layout::decision(e.decision.as_str())) }
                            td { (e.rule) }
                            td { "v" (e.playbook_version) }
                        }
                    }
                }
            }
        }
        @if let Some(next) = next {
            p { a href={ "/console/events?type=" (q.signal_type) "&decision=" (q.decision) "&since=" (q.since) "&before=" (next) } { "Older events →" } }
        }
    };
    layout::page("Events", &operator, Section::Events, body)
}

/// `GET /console/events/{id}`: the signal without raw identifiers, the decision and each
/// delivery with every attempt.
pub async fn show(
    State(app): State<AppState>,
    operator: Operator,
    Path(id): Path<String>,
    Query(done): Query<layout::DoneQuery>,
) -> Response {
    let tenant = match operator.tenant(Scope::Read) {
        Ok(t) => t,
        Err(refused) => return refused.into_response(),
    };
    let Ok(id) = Uuid::parse_str(&id) else {
        return layout::refusal(StatusCode::NOT_FOUND, "No such event.");
    };
    let event = match app.console_store().event(tenant.id, id).await {
        Ok(Some(event)) => event,
        Ok(None) => return layout::refusal(StatusCode::NOT_FOUND, "No such event."),
        Err(err) => return unavailable(&err),
    };
    let deliveries = match app
        .console_store()
        .deliveries_for_event(tenant.id, id)
        .await
    {
        Ok(d) => d,
        Err(err) => return unavailable(&err),
    };
    let mut delivery_sections = Vec::new();
    for delivery in &deliveries {
        match delivery_section(&app, &operator, tenant.id, delivery).await {
            Ok(section) => delivery_sections.push(section),
            Err(err) => return unavailable(&err),
        }
    }
    let actions = current_actions(&event.actions(), &deliveries);
    let body = html! {
        (layout::notice(done.notice()))
        (event_summary(&event, &actions))
        h2 { "Deliveries" }
        @if deliveries.is_empty() { p { "This decision sent no callback." } }
        @for section in delivery_sections { (section) }
    };
    layout::page("Event", &operator, Section::Events, body)
}

fn pretty(json: &str) -> String {
    serde_json::from_str::<Value>(json)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| json.to_owned())
}

/// The event's action outcomes, each connector call's as its request stands now.
fn current_actions(stored: &str, deliveries: &[DeliveryRecord]) -> Vec<Value> {
    let current = serde_json::from_str::<Vec<ActionResult>>(stored)
        .ok()
        .and_then(|results| serde_json::to_value(current_outcomes(results, deliveries)).ok());
    match current {
        Some(Value::Array(actions)) => actions,
        _ => serde_json::from_str(stored).unwrap_or_default(),
    }
}

fn event_summary(e: &EventRecord, actions: &[Value]) -> Markup {
    html! {
        dl.event {
            dt { "Event" } dd { code { (e.id) } }
            dt { "Type" } dd { (e.signal_type) }
            dt { "Feed" } dd { (e.feed) }
            dt { "Subject (digest)" } dd { code { (hex(&e.subject_hash)) } }
            dt { "Observed" } dd { (layout::time(e.observed_at)) }
            dt { "Decided" } dd { (layout::time(if e.evaluated_at > 0 { e.evaluated_at } else { e.created_at })) }
            dt { "Decision" } dd { (layout::decision(e.decision.as_str())) }
            dt { "Rule" } dd { (e.rule) }
            dt { "Playbook" } dd { "version " (e.playbook_version) }
            dt { "Facts evaluated" } dd { code { (e.facts) } }
        }
        h2 { "Actions" }
        table.actions {
            thead { tr { th { "Action" } th { "Outcome" } } }
            tbody {
                @for a in actions {
                    tr {
                        td { (a["action"].as_str().unwrap_or("?")) }
                        td { (a["outcome"].as_str().unwrap_or("?")) }
                    }
                }
            }
        }
        h2 { "Signal" }
        p.hint { "Identifiers are never stored; the subject appears only as its digest." }
        h3 { "Attributes" } pre { (pretty(&e.attributes)) }
        h3 { "Metadata" } pre { (pretty(&e.metadata())) }
    }
}

/// A delivery and its attempts, read again together in one snapshot: the list's row may be
/// older than an attempt recorded since, which would show an attempt on a pending delivery.
async fn delivery_section(
    app: &AppState,
    operator: &Operator,
    tenant_id: Uuid,
    listed: &DeliveryRecord,
) -> Result<Markup, crate::store::StoreError> {
    let (d, attempts) = match app
        .console_store()
        .delivery_with_attempts(tenant_id, listed.id)
        .await?
    {
        Some((d, attempts)) => (d, attempts),
        // Gone since the list was read (pruned): shown as listed, without attempts.
        None => (listed.clone(), Vec::new()),
    };
    let d = &d;
    let redeliverable = matches!(d.status, DeliveryStatus::Dead | DeliveryStatus::Failed);
    let resolvable = d.status == DeliveryStatus::Unknown && d.action != crate::delivery::CALLBACK;
    Ok(html! {
        section.delivery id={ "delivery-" (d.id) } {
            h3 {
                @if d.action == "callback" { "Callback " } @else { "Action " code { (d.action) } " to connector " code { (d.connector.as_deref().unwrap_or("")) } " " }
                code { (d.webhook_id()) } " " span class={ "badge " (d.status.as_str()) } { (d.status.as_str()) }
            }
            @if let Some(err) = &d.last_error { p.error { "Last error: " (err) } }
            @if redeliverable && operator.can_act() {
                form method="post" action={ "/console/deliveries/" (d.id) "/redeliver" } {
                    (layout::csrf(operator))
                    button type="submit" { "Redeliver" }
                }
            }
            @if resolvable && operator.can_act() {
                form.resolve method="post" action={ "/console/deliveries/" (d.id) "/resolve" } {
                    (layout::csrf(operator))
                    p.hint { "The connector may or may not have acted: ask the tenant's system, then say what it did." }
                    label { "Reason " input type="text" name="reason" required minlength="1" maxlength=(MAX_REASON_CHARS); }
                    button type="submit" name="outcome" value="done" { "Resolve done" }
                    " "
                    button type="submit" name="outcome" value="failed" { "Resolve failed" }
                }
            }
            table.attempts {
                caption { (attempts.len()) " attempt(s)" }
                thead { tr { th { "Time (UTC)" } th { "Trigger" } th { "Status" } th { "Latency" } th { "Error" } th { "Response" } } }
                tbody {
                    @for a in &attempts {
                        tr {
                            td { (layout::time(a.attempted_at)) }
                            td { (a.trigger) }
                            td { @if let Some(code) = a.status_code { (code) } @else { "-" } }
                            td { (a.latency_ms) " ms" }
                            td { (a.error.as_deref().unwrap_or("")) }
                            td { code { (a.response_excerpt.as_deref().map(String::from_utf8_lossy).unwrap_or_default()) } }
                        }
                    }
                }
            }
        }
    })
}

#[derive(Debug, Default, Deserialize)]
pub struct StatusQuery {
    #[serde(default)]
    status: String,
    /// Only the callbacks of the endpoint of this name (empty: every delivery).
    #[serde(default)]
    endpoint: String,
    done: Option<String>,
}

impl StatusQuery {
    /// The notice its `done` names, if any.
    fn notice(&self) -> Option<layout::Notice> {
        layout::Notice::named(self.done.as_deref()?)
    }
}

/// `GET /console/deliveries?status=&endpoint=`: deliveries by status, and by endpoint; dead
/// letters can be redelivered.
pub async fn deliveries(
    State(app): State<AppState>,
    operator: Operator,
    Query(q): Query<StatusQuery>,
) -> Response {
    let tenant = match operator.tenant(Scope::Read) {
        Ok(t) => t,
        Err(refused) => return refused.into_response(),
    };
    let status: Option<DeliveryStatus> = q.status.parse().ok();
    // A name that is no endpoint name is refused, not taken for "every delivery".
    let endpoint = match q.endpoint.as_str() {
        "" => None,
        text => match text.parse::<EndpointName>() {
            Ok(name) => Some(name),
            Err(_) => return layout::refusal(StatusCode::NOT_FOUND, "No such endpoint."),
        },
    };
    let rows = match app
        .console_store()
        .deliveries(tenant.id, status, endpoint.as_ref(), None, PAGE)
        .await
    {
        Ok(rows) => rows,
        Err(err) => return unavailable(&err),
    };
    // The status tabs keep the endpoint chosen.
    let of_endpoint = endpoint
        .as_ref()
        .map(|e| endpoint_param(e.as_str()))
        .unwrap_or_default();
    let all_href = match &endpoint {
        Some(_) => format!("/console/deliveries?{of_endpoint}"),
        None => "/console/deliveries".to_owned(),
    };
    let body = html! {
        (layout::notice(q.notice()))
        @if let Some(name) = &endpoint {
            p.hint {
                "Callbacks to the endpoint " code { (name) } ". "
                a href="/console/deliveries" { "Every delivery" }
                " · "
                a href="/console/endpoints" { "Endpoints" }
            }
        }
        nav.tabs aria-label="Status" {
            a href=(all_href) aria-current=[status.is_none().then_some("page")] { "all" }
            @for s in DeliveryStatus::ALL {
                a href={ "/console/deliveries?status=" (s.as_str()) @if endpoint.is_some() { "&" (of_endpoint) } } aria-current=[(status == Some(s)).then_some("page")] {
                    @if s == DeliveryStatus::Dead { "dead letters" } @else { (s.as_str()) }
                }
            }
        }
        @if rows.is_empty() { p { "No deliveries." } } @else {
            table.deliveries {
                thead { tr { th { "Created (UTC)" } th { "Status" } th { "Endpoint" } th { "Attempts" } th { "Last error" } th { "Event" } th {} } }
                tbody {
                    @for d in &rows {
                        tr {
                            td { (layout::time(d.created_at)) }
                            td { span class={ "badge " (d.status.as_str()) } { (d.status.as_str()) } }
                            td {
                                @if let Some(name) = &d.endpoint {
                                    a href={ "/console/deliveries?" (endpoint_param(name)) } { code { (name) } }
                                } @else if let Some(connector) = &d.connector {
                                    span.hint { "connector " code { (connector) } }
                                }
                            }
                            td { (d.attempts) }
                            td { (d.last_error.as_deref().unwrap_or("")) }
                            td { a href={ "/console/events/" (d.event_id) "#delivery-" (d.id) } { "event" } }
                            td {
                                @if matches!(d.status, DeliveryStatus::Dead | DeliveryStatus::Failed) && operator.can_act() {
                                    form method="post" action={ "/console/deliveries/" (d.id) "/redeliver" } {
                                        (layout::csrf(&operator))
                                        button type="submit" { "Redeliver" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    layout::page("Deliveries", &operator, Section::Deliveries, body)
}

/// The query parameter that filters the deliveries page by endpoint: the name, URL-encoded
/// (a stored name is a slug, but a URL is built as if it might not be).
pub(super) fn endpoint_param(name: &str) -> String {
    let encoded: String = url::form_urlencoded::byte_serialize(name.as_bytes()).collect();
    format!("endpoint={encoded}")
}

/// `POST /console/deliveries/{id}/redeliver`: one more round of attempts, same `webhook-id`.
pub async fn redeliver(
    State(app): State<AppState>,
    operator: Operator,
    Path(id): Path<String>,
    axum::Form(form): axum::Form<CsrfOnly>,
) -> Response {
    let (tenant, id) = match acting_on_delivery(&operator, &form.csrf, &id) {
        Ok(found) => found,
        Err(refused) => return *refused,
    };
    let delivery = match app.console_store().delivery(tenant.id, id).await {
        Ok(Some(d)) => d,
        Ok(None) => return layout::refusal(StatusCode::NOT_FOUND, "No such delivery."),
        Err(err) => return unavailable(&err),
    };
    let notice = match app.deliverer.redeliver(tenant.id, id).await {
        Ok(Redelivered::Attempted(_)) => Notice::Redelivered,
        Ok(Redelivered::TooSoon(_)) => Notice::RedeliveredTooSoon,
        Ok(Redelivered::Unavailable) => Notice::NotRedelivered,
        Err(err) => return unavailable(&err),
    };
    back_to_event(delivery.event_id, id, notice)
}

/// The resolution form: the session's CSRF token, what the request did, and why.
#[derive(Debug, Deserialize)]
pub struct ResolveForm {
    csrf: String,
    #[serde(default)]
    outcome: String,
    #[serde(default)]
    reason: String,
}

/// `POST /console/deliveries/{id}/resolve`: settles an action request whose outcome is
/// `unknown` as done or failed (admin), as `POST /v1/deliveries/{id}/resolve` does.
pub async fn resolve(
    State(app): State<AppState>,
    operator: Operator,
    Path(id): Path<String>,
    axum::Form(form): axum::Form<ResolveForm>,
) -> Response {
    let (tenant, id) = match acting_on_delivery(&operator, &form.csrf, &id) {
        Ok(found) => found,
        Err(refused) => return *refused,
    };
    let Ok(settled) = form.outcome.parse::<Settled>() else {
        return layout::refusal(StatusCode::BAD_REQUEST, "Resolve as done or failed.");
    };
    let resolved = resolve::resolve(
        &*app.store,
        tenant.id,
        id,
        settled,
        &form.reason,
        operator.key_id(),
    )
    .await;
    let delivery = match resolved {
        Ok(d) => d,
        Err(ResolveError::NotFound) => {
            return layout::refusal(StatusCode::NOT_FOUND, "No such delivery.");
        }
        Err(ResolveError::Store(err)) => return unavailable(&err),
        Err(err @ ResolveError::Reason(_)) => {
            return layout::refusal(StatusCode::BAD_REQUEST, &format!("Not resolved: {err}."));
        }
        Err(err @ ResolveError::NotUnknown(_)) => {
            return layout::refusal(StatusCode::CONFLICT, &format!("Not resolved: {err}."));
        }
    };
    let notice = match settled {
        Settled::Done => Notice::ResolvedDone,
        Settled::Failed => Notice::ResolvedFailed,
    };
    back_to_event(delivery.event_id, id, notice)
}

/// The tenant and delivery id of a form that acts on a delivery: this session's, with an
/// admin key, and an id that parses.
fn acting_on_delivery(
    operator: &Operator,
    csrf: &str,
    id: &str,
) -> Result<(crate::store::TenantRecord, Uuid), Box<Response>> {
    let tenant = operator
        .acting(csrf, Scope::Admin)
        .map_err(|refused| Box::new(refused.into_response()))?;
    let id = Uuid::parse_str(id)
        .map_err(|_| Box::new(layout::refusal(StatusCode::NOT_FOUND, "No such delivery.")))?;
    Ok((tenant, id))
}

/// Back to the event a delivery belongs to, at the delivery, with `notice`.
fn back_to_event(event_id: Uuid, delivery_id: Uuid, notice: Notice) -> Response {
    Redirect::to(&format!(
        "/console/events/{event_id}?done={}#delivery-{delivery_id}",
        notice.name()
    ))
    .into_response()
}

fn unavailable(err: &crate::store::StoreError) -> Response {
    tracing::warn!(error = ?err, "console page failed");
    layout::refusal(
        StatusCode::SERVICE_UNAVAILABLE,
        "The database did not answer; try again in a moment.",
    )
}
