//! Subjects: found by the phone number or account id an analyst holds, with its lock, standing
//! deny, open cases and newest events, and (with an admin key) the way back: unlock the account,
//! lift the deny, close the case.
//!
//! The identifier travels only in POST bodies: the lookup form's, and a hidden field of each
//! way-back form, which carries back what the operator typed. It is digested by
//! [`subjects::lookup`] and [`subjects::undo`], never put in a URL, a log line or a row. What a
//! way back did is told from a fixed set of messages, chosen by its action and outcome.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::Operator;
use super::layout::{self, Section};
use crate::app::AppState;
use crate::domain::{ActionKind, Outcome};
use crate::secrets::hex;
use crate::signal::{Subject, subject_of};
use crate::store::{Scope, StoreError, SubjectState};
use crate::subjects::{self, MAX_REASON_CHARS, SubjectError, Undone};

/// The kinds of identifier the form takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Phone,
    Account,
}

impl Kind {
    const ALL: [(Kind, &'static str, &'static str); 2] = [
        (Kind::Phone, "phone", "Phone number (E.164)"),
        (Kind::Account, "account", "Account id"),
    ];

    fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|(_, n, _)| *n == name)
            .map(|(kind, _, _)| kind)
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Phone => "phone",
            Self::Account => "account",
        }
    }
}

/// The subject an operator named: the identifier as typed (trimmed), and the checked subject.
struct Named {
    kind: Kind,
    identifier: String,
    subject: Subject,
}

impl Named {
    /// The subject a form names, checked as a signal's is; the refusal says why, never what.
    fn from_form(kind: &str, identifier: &str) -> Result<Self, String> {
        let kind = Kind::parse(kind).ok_or("Choose a phone number or an account id.")?;
        let identifier = identifier.trim().to_owned();
        let raw = identifier.clone();
        let subject = match kind {
            Kind::Phone => subject_of(Some(raw), None),
            Kind::Account => subject_of(None, Some(raw)),
        }
        .map_err(|e| e.to_string())?;
        Ok(Self {
            kind,
            identifier,
            subject,
        })
    }
}

/// `POST /console/subjects/lookup`. Every field defaults to empty, so a form with one missing
/// is refused by the checks below (the CSRF token's first) rather than by the extractor.
#[derive(Deserialize)]
pub struct LookupForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    identifier: String,
}

/// `POST /console/subjects/unlock`, `/lift-deny`, `/close-case`.
#[derive(Deserialize)]
pub struct WayBackForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    identifier: String,
    #[serde(default)]
    reason: String,
}

/// `GET /console/subjects`: the lookup form.
pub async fn show(operator: Operator) -> Response {
    if let Err(refused) = operator.tenant(Scope::Read) {
        return refused.into_response();
    }
    let body = html! {
        (lookup_form(&operator, None))
        p.hint { "The identifier is posted, digested on the server and never stored or logged." }
    };
    layout::page("Subjects", &operator, Section::Subjects, body)
}

/// `POST /console/subjects/lookup`: the subject's state, as `POST /v1/subjects/lookup` has it.
pub async fn lookup(
    State(app): State<AppState>,
    operator: Operator,
    axum::Form(form): axum::Form<LookupForm>,
) -> Response {
    let tenant = match operator.acting(&form.csrf, Scope::Read) {
        Ok(t) => t,
        Err(refused) => return refused.into_response(),
    };
    match Named::from_form(&form.kind, &form.identifier) {
        Ok(named) => subject_page(&app, &operator, tenant.id, &named, html! {}).await,
        Err(why) => refused_input(&operator, &why),
    }
}

/// `POST /console/subjects/unlock`.
pub async fn unlock(
    State(app): State<AppState>,
    operator: Operator,
    axum::Form(form): axum::Form<WayBackForm>,
) -> Response {
    way_back(&app, &operator, ActionKind::UnlockAccount, form).await
}

/// `POST /console/subjects/lift-deny`.
pub async fn lift_deny(
    State(app): State<AppState>,
    operator: Operator,
    axum::Form(form): axum::Form<WayBackForm>,
) -> Response {
    way_back(&app, &operator, ActionKind::LiftDeny, form).await
}

/// `POST /console/subjects/close-case`.
pub async fn close_case(
    State(app): State<AppState>,
    operator: Operator,
    axum::Form(form): axum::Form<WayBackForm>,
) -> Response {
    way_back(&app, &operator, ActionKind::CloseCase, form).await
}

/// Takes the way back through [`subjects::undo`] under the playbook in force, then shows what
/// it did above the subject's state as it now stands.
async fn way_back(
    app: &AppState,
    operator: &Operator,
    action: ActionKind,
    form: WayBackForm,
) -> Response {
    let tenant = match operator.acting(&form.csrf, Scope::Admin) {
        Ok(t) => t,
        Err(refused) => return refused.into_response(),
    };
    let named = match Named::from_form(&form.kind, &form.identifier) {
        Ok(named) => named,
        Err(why) => return refused_input(operator, &why),
    };
    let (playbook, version) = match app.ingest.playbook_in_force(tenant.id).await {
        Ok(in_force) => in_force,
        Err(err) => return unavailable(&err),
    };
    let asker = subjects::Operator {
        tenant_id: tenant.id,
        key_id: operator.grant.key_id,
    };
    let asked = subjects::Asked {
        operator: asker,
        playbook: (&playbook, version),
        action,
        subject: &named.subject,
        reason: &form.reason,
        // A form posted again (a reload) finds nothing left to undo: `already_done`.
        key: None,
    };
    match subjects::undo(&app.way_back_means(), &asked).await {
        Ok(subjects::Answer::Fresh(undone)) => {
            let above = outcome(&undone);
            subject_page(app, operator, tenant.id, &named, above).await
        }
        // Only a request with a key is replayed, and this one has none.
        Ok(subjects::Answer::Replayed(_)) => {
            let above = html! { p.notice { "This was already done." } };
            subject_page(app, operator, tenant.id, &named, above).await
        }
        Err(err @ SubjectError::Reason(_)) => {
            let above = html! { p.error role="alert" { (err) } };
            let page = subject_page(app, operator, tenant.id, &named, above).await;
            (StatusCode::BAD_REQUEST, page).into_response()
        }
        // Only a request with a key can meet these, and this one has none.
        Err(SubjectError::InProgress | SubjectError::KeyReused) => layout::refusal(
            StatusCode::CONFLICT,
            "Another way back for this subject is in progress; try again in a moment.",
        ),
        Err(SubjectError::Store(err)) => unavailable(&err),
    }
}

/// The page for a subject: `above` (an outcome or a refusal), the lookup form, and its state
/// with the way-back forms, or a note that no event names it.
async fn subject_page(
    app: &AppState,
    operator: &Operator,
    tenant_id: uuid::Uuid,
    named: &Named,
    above: Markup,
) -> Response {
    let found = match subjects::lookup(&*app.store, &app.keys, tenant_id, &named.subject).await {
        Ok(found) => found,
        Err(err) => return unavailable(&err),
    };
    let body = html! {
        (above)
        (lookup_form(operator, Some(named)))
        @match &found {
            Some((digest, state)) => {
                (state_view(digest, state))
                (way_back_forms(operator, named))
            }
            None => p.notice role="status" { "No event names this subject: verdict has decided nothing about it." },
        }
    };
    layout::page("Subjects", operator, Section::Subjects, body)
}

/// A form that could not name a subject, refused with why.
fn refused_input(operator: &Operator, why: &str) -> Response {
    let body = html! {
        p.error role="alert" { (why) }
        (lookup_form(operator, None))
    };
    (
        StatusCode::BAD_REQUEST,
        layout::page("Subjects", operator, Section::Subjects, body),
    )
        .into_response()
}

fn lookup_form(operator: &Operator, named: Option<&Named>) -> Markup {
    let kind = named.map_or(Kind::Phone, |n| n.kind);
    html! {
        form.lookup method="post" action="/console/subjects/lookup" {
            (layout::csrf(operator))
            label { "Identifier "
                select name="kind" {
                    @for (k, name, label) in Kind::ALL {
                        option value=(name) selected[k == kind] { (label) }
                    }
                }
            }
            label { "Value "
                input #identifier type="text" name="identifier" required autocomplete="off"
                    spellcheck="false" value=[named.map(|n| n.identifier.as_str())];
            }
            button type="submit" { "Look up" }
        }
    }
}

fn event_link(id: uuid::Uuid) -> Markup {
    html! { a href={ "/console/events/" (id) } { code { (id) } } }
}

/// A lock or deny: since when and the event that caused it, or that there is none.
fn standing(what: &str, none: &str, standing: Option<(uuid::Uuid, i64)>) -> Markup {
    html! {
        @if let Some((event, since)) = standing {
            span.badge.deny { (what) } " since " (layout::time(since)) " UTC, by event " (event_link(event))
        } @else {
            span.badge.allow { (none) }
        }
    }
}

fn state_view(digest: &[u8], state: &SubjectState) -> Markup {
    html! {
        section.subject {
            dl.event {
                dt { "Subject (digest)" } dd { code { (hex(digest)) } }
                dt { "Account" } dd.lock { (standing("locked", "not locked", state.lock)) }
                dt { "Deny" } dd.deny { (standing("deny stands", "no deny", state.deny)) }
                dt { "Open cases" } dd.cases { (state.open_cases.len()) }
            }
            @if !state.open_cases.is_empty() {
                h2 { "Open cases" }
                table.cases {
                    thead { tr { th { "Case" } th { "Opened (UTC)" } th { "Events" } } }
                    tbody {
                        @for (id, opened_at, events) in &state.open_cases {
                            tr {
                                td { code { (id) } }
                                td { (layout::time(*opened_at)) }
                                td { @for e in events { (event_link(*e)) " " } }
                            }
                        }
                    }
                }
            }
            h2 { "Recent events" }
            p.hint { "Newest first, at most 50." }
            ol.subject-events {
                @for e in &state.events { li { (event_link(*e)) } }
            }
        }
    }
}

/// The three ways back, each a form with a required reason; for a read key, a note instead.
fn way_back_forms(operator: &Operator, named: &Named) -> Markup {
    const WAYS: [(&str, &str, &str); 3] = [
        ("unlock", "/console/subjects/unlock", "Unlock account"),
        ("lift-deny", "/console/subjects/lift-deny", "Lift deny"),
        ("close-case", "/console/subjects/close-case", "Close case"),
    ];
    html! {
        h2 { "The way back" }
        @if operator.can_act() {
            p.hint { "Each is recorded as an event with your key and reason, and carried to the \
                      tenant's system through the connector its action is bound to. A repeat \
                      finds nothing to undo." }
            div.way-back {
                @for (id, action, label) in WAYS {
                    form.way-back id=(id) method="post" action=(action) {
                        (layout::csrf(operator))
                        input type="hidden" name="kind" value=(named.kind.as_str());
                        input type="hidden" name="identifier" value=(named.identifier);
                        label for={ "reason-" (id) } { "Reason (1 to " (MAX_REASON_CHARS) " characters)" }
                        input id={ "reason-" (id) } type="text" name="reason" required
                            maxlength=(MAX_REASON_CHARS) autocomplete="off";
                        button type="submit" { (label) }
                    }
                }
            }
        } @else {
            p.hint { "Unlocking an account, lifting a deny and closing a case need an admin key." }
        }
    }
}

/// What a way back did, in words chosen by its action and outcome, with the event it recorded.
fn outcome(undone: &Undone) -> Markup {
    let label = serde_json::to_value(&undone.outcome)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let badge = match &undone.outcome {
        Outcome::Done | Outcome::AlreadyDone => "succeeded",
        Outcome::Pending | Outcome::Unknown => "pending",
        Outcome::Failed(_) => "failed",
    };
    html! {
        section.outcome role="status" {
            h2 { (title(undone.action)) }
            p { "Outcome: " code class={ "badge outcome " (badge) } { (label) } }
            p.message { (message(undone.action, &undone.outcome)) }
            @if let Some(connector) = &undone.connector {
                p { "Connector: " code { (connector.to_string()) } }
            }
            @if let Some(event) = undone.event_id {
                p { "Recorded as event " (event_link(event)) "." }
            }
        }
    }
}

fn title(action: ActionKind) -> &'static str {
    match action {
        ActionKind::LiftDeny => "Lift deny",
        ActionKind::CloseCase => "Close case",
        _ => "Unlock account",
    }
}

fn message(action: ActionKind, outcome: &Outcome) -> &'static str {
    use ActionKind::{CloseCase, LiftDeny};
    match (outcome, action) {
        (Outcome::AlreadyDone, LiftDeny) => "No deny stood: nothing to lift, nothing recorded.",
        (Outcome::AlreadyDone, CloseCase) => {
            "No case was open: nothing to close, nothing recorded."
        }
        (Outcome::AlreadyDone, _) => {
            "The account held no lock: nothing to unlock, nothing recorded."
        }
        (Outcome::Done, LiftDeny) => "The deny is lifted.",
        (Outcome::Done, CloseCase) => "The case is closed.",
        (Outcome::Done, _) => "The account is unlocked.",
        (Outcome::Pending, _) => {
            "Undone here; the connector has not confirmed it yet, and the worker will try \
             again. The event shows where it stands."
        }
        (Outcome::Unknown, _) => {
            "Undone here; the connector's answer was lost and it is not called twice. Check \
             the tenant's system; the event shows the attempt."
        }
        (Outcome::Failed(_), _) => {
            "Undone here, but the connector refused the request; the event's delivery says why."
        }
    }
}

fn unavailable(err: &StoreError) -> Response {
    tracing::warn!(error = ?err, "console subjects page failed");
    layout::refusal(
        StatusCode::SERVICE_UNAVAILABLE,
        "The database did not answer; try again in a moment.",
    )
}
