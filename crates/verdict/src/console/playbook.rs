//! The playbook: the version in force and its history, an editor that validates on the server
//! and shows an error at its line, and the simulation summary before publishing.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::Operator;
use super::layout::{self, Section};
use crate::app::AppState;
use crate::playbook::simulation::{self, Simulation, Window};
use crate::playbook::{self, Format, Playbook, PlaybookError, PlaybookStoreError};
use crate::store::Scope;

/// Versions shown in the history.
const HISTORY: i64 = 20;

/// `GET /console/playbook`.
pub async fn show(
    State(app): State<AppState>,
    operator: Operator,
    Query(q): Query<layout::DoneQuery>,
) -> Response {
    let tenant = match operator.tenant(Scope::Read) {
        Ok(t) => t,
        Err(refused) => return refused.into_response(),
    };
    let current = playbook::current_source(app.console_store(), tenant.id).await;
    let history = app
        .console_store()
        .playbook_history(tenant.id, HISTORY)
        .await;
    let (current, history) = match (current, history) {
        (Ok(c), Ok(h)) => (c, h),
        (Err(err), _) | (_, Err(err)) => {
            tracing::warn!(error = ?err, "console playbook page failed");
            return layout::refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database did not answer.",
            );
        }
    };
    let format = Format::from_name(&current.format).unwrap_or(Format::Toml);
    let body = html! {
        @if q.notice() == Some(layout::Notice::Published) {
            // The version is read, not taken from the link: a link cannot name one.
            p.notice role="status" { "Version " (current.version) " is now in force." }
        } @else {
            (layout::notice(q.notice()))
        }
        p { "In force: " strong { "version " (current.version) }
            @if current.version == 0 { " (the built-in default)" } }
        (editor(&operator, &current.source, format))
        h2 { "History" }
        @if history.is_empty() { p { "No uploads yet; the built-in default is in force." } } @else {
            table.history {
                thead { tr { th { "Version" } th { "Format" } th { "Uploaded (UTC)" } } }
                tbody {
                    @for v in &history {
                        tr { td { (v.version) } td { (v.format) } td { (layout::time(v.created_at)) } }
                    }
                }
            }
        }
    };
    layout::page("Playbook", &operator, Section::Playbook, body)
}

fn editor(operator: &Operator, source: &str, format: Format) -> Markup {
    html! {
        form.editor method="post" action="/console/playbook/check" {
            (layout::csrf(operator))
            label for="source" { "Playbook (" (format.as_str()) ")" }
            textarea #source name="source" rows="24" spellcheck="false" { (source) }
            label { "Format "
                select name="format" {
                    option value="toml" selected[format == Format::Toml] { "TOML" }
                    option value="json" selected[format == Format::Json] { "JSON" }
                }
            }
            button type="submit" { "Check and simulate" }
        }
    }
}

#[derive(Deserialize)]
pub struct Candidate {
    csrf: String,
    source: String,
    format: String,
}

impl Candidate {
    fn format(&self) -> Format {
        Format::from_name(&self.format).unwrap_or(Format::Toml)
    }
}

/// `POST /console/playbook/check`: validate; show the error at its line, or what the candidate
/// would have changed over the newest 1,000 events, with a publish button.
pub async fn check(
    State(app): State<AppState>,
    operator: Operator,
    axum::Form(form): axum::Form<Candidate>,
) -> Response {
    let tenant = match operator.acting(&form.csrf, Scope::Read) {
        Ok(t) => t,
        Err(refused) => return refused.into_response(),
    };
    let format = form.format();
    let body = match Playbook::parse(&form.source, format) {
        Err(err) => html! {
            (refused_at_line(&form.source, &err))
            (editor(&operator, &form.source, format))
        },
        Ok(candidate) => {
            let window = Window {
                since: None,
                limit: simulation::DEFAULT_SIMULATED_EVENTS,
            };
            match simulation::simulate(app.console_store(), tenant.id, &candidate, window).await {
                Ok(result) => html! {
                    p.notice role="status" { "The playbook is valid." }
                    (summary(&result))
                    @if operator.can_act() {
                        form.publish method="post" action="/console/playbook/publish" {
                            (layout::csrf(&operator))
                            input type="hidden" name="source" value=(form.source);
                            input type="hidden" name="format" value=(format.as_str());
                            button type="submit" { "Publish" }
                        }
                    } @else {
                        p.hint { "Publishing needs an admin key." }
                    }
                    (editor(&operator, &form.source, format))
                },
                Err(err) => {
                    tracing::warn!(error = ?err, "console simulation failed");
                    return layout::refusal(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "The simulation could not read the history.",
                    );
                }
            }
        }
    };
    layout::page("Playbook", &operator, Section::Playbook, body)
}

/// `POST /console/playbook/publish`: upload (validated again) and make it the version in force.
pub async fn publish(
    State(app): State<AppState>,
    operator: Operator,
    axum::Form(form): axum::Form<Candidate>,
) -> Response {
    let tenant = match operator.acting(&form.csrf, Scope::Admin) {
        Ok(t) => t,
        Err(refused) => return refused.into_response(),
    };
    match playbook::upload(app.console_store(), tenant.id, &form.source, form.format()).await {
        Ok(version) => {
            tracing::info!(tenant_id = %tenant.id, version, "playbook published from the console");
            Redirect::to(&format!(
                "/console/playbook?done={}",
                layout::Notice::Published.name()
            ))
            .into_response()
        }
        Err(PlaybookStoreError::Invalid(err)) => {
            let body = html! {
                (refused_at_line(&form.source, &err))
                (editor(&operator, &form.source, form.format()))
            };
            layout::page("Playbook", &operator, Section::Playbook, body)
        }
        Err(PlaybookStoreError::Store(err)) => {
            tracing::warn!(error = ?err, "console publish failed");
            layout::refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database did not answer.",
            )
        }
    }
}

fn summary(result: &Simulation) -> Markup {
    html! {
        section.simulation {
            h2 { "Simulation" }
            p { strong { (result.changed) } " of " (result.examined) " recent events would be decided differently." }
            @if !result.changes.is_empty() {
                table.changes {
                    thead { tr { th { "From" } th { "To" } th { "Events" } } }
                    tbody {
                        @for c in &result.changes {
                            tr {
                                td { (c.from_rule) " " (layout::decision(c.from_decision.as_str())) }
                                td { (c.to_rule) " " (layout::decision(c.to_decision.as_str())) }
                                td { (c.events) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The error, and the source around the line it names, that line marked.
fn refused_at_line(source: &str, err: &PlaybookError) -> Markup {
    let line = error_line(source, &err.to_string());
    let lines: Vec<&str> = source.lines().collect();
    let window = line.map(|l| (l.saturating_sub(3).max(1), (l + 2).min(lines.len())));
    html! {
        div.refused role="alert" {
            p.error {
                "Refused"
                @if let Some(l) = line { " at line " strong.line { (l) } }
                ": " (first_line(&err.to_string()))
            }
            @if let (Some(l), Some((from, to))) = (line, window) {
                ol.source start=(from) {
                    @for n in from..=to {
                        @if n == l {
                            li.marked aria-current="true" { code { (lines.get(n - 1).copied().unwrap_or("")) } }
                        } @else {
                            li { code { (lines.get(n - 1).copied().unwrap_or("")) } }
                        }
                    }
                }
            }
        }
    }
}

fn first_line(message: &str) -> &str {
    message.lines().next().unwrap_or(message)
}

/// The line an error names: "line N" (TOML and JSON parsers), or "rule N", mapped to the line
/// of the N-th `[[rule]]`.
fn error_line(source: &str, message: &str) -> Option<usize> {
    let number_after = |word: &str| {
        message.find(word).and_then(|at| {
            let digits: String = message[at + word.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse::<usize>().ok()
        })
    };
    if let Some(line) = number_after("line ") {
        return Some(line);
    }
    let rule = number_after("rule ")?;
    source
        .lines()
        .enumerate()
        .filter(|(_, l)| {
            l.trim_start().starts_with("[[rule]]") || l.trim_start().starts_with("[[rules]]")
        })
        .nth(rule.checked_sub(1)?)
        .map(|(i, _)| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_point_at_their_line() {
        let source = "[[rule]]\nname = \"a\"\ndecision = \"maybe\"\n";
        let err = Playbook::parse(source, Format::Toml).unwrap_err();
        assert_eq!(error_line(source, &err.to_string()), Some(3));
        let source = "[[rule]]\nname = \"a\"\ndecision = \"deny\"\n\n[[rule]]\nname = \"a\"\ndecision = \"allow\"\n";
        let err = Playbook::parse(source, Format::Toml).unwrap_err();
        assert_eq!(error_line(source, &err.to_string()), Some(5), "{err}");
    }
}
