//! Live numbers for the last hour: signals per minute, decisions by kind, delivery success
//! rate and queue depth, drawn as small SVG charts on the server.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use super::Operator;
use super::layout::{self, Section};
use crate::app::AppState;
use crate::clock::now_ms;
use crate::store::{Activity, Scope};

const MINUTES: i64 = 60;

/// `GET /console/live`.
pub async fn show(State(app): State<AppState>, operator: Operator) -> Response {
    let tenant = match operator.tenant(Scope::Read) {
        Ok(t) => t,
        Err(refused) => return refused.into_response(),
    };
    let now = now_ms();
    let since = now - MINUTES * 60_000;
    let activity = match app.console_store().activity(tenant.id, since).await {
        Ok(a) => a,
        Err(err) => {
            tracing::warn!(error = ?err, "console live page failed");
            return layout::refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database did not answer.",
            );
        }
    };
    let first_minute = since / 60_000 + 1;
    let per_minute = minutes(&activity, first_minute);
    let total: i64 = per_minute.iter().sum();
    let by_decision = ["allow", "step_up", "deny"].map(|d| {
        let n: i64 = activity
            .per_minute
            .iter()
            .filter(|m| m.decision == d)
            .map(|m| m.events)
            .sum();
        (d, n)
    });
    let success = (activity.attempts > 0)
        .then(|| activity.attempts_succeeded as f64 * 100.0 / activity.attempts as f64);
    let body = html! {
        p.hint { "The last hour, per minute (UTC). Reload for fresh numbers." }
        div.cards {
            section.card {
                h2 { "Signals per minute" }
                p.big { (total) " in the hour" }
                (bars(&per_minute))
            }
            section.card {
                h2 { "Decisions" }
                (decision_bars(&by_decision))
            }
            section.card {
                h2 { "Delivery success" }
                p.big { @if let Some(rate) = success { (format!("{rate:.1}")) "%" } @else { "no attempts" } }
                p { (activity.attempts_succeeded) " of " (activity.attempts) " attempts got a 2xx" }
            }
            section.card {
                h2 { "Queue depth" }
                p.big { (activity.queue_depth) }
                p { "deliveries waiting for an attempt" }
            }
        }
    };
    layout::page("Live", &operator, Section::Live, body)
}

/// Events in each of the last 60 minutes, oldest first.
fn minutes(activity: &Activity, first_minute: i64) -> Vec<i64> {
    let mut counts = vec![0; MINUTES as usize];
    for m in &activity.per_minute {
        if let Ok(i) = usize::try_from(m.minute - first_minute)
            && let Some(slot) = counts.get_mut(i)
        {
            *slot += m.events;
        }
    }
    counts
}

/// A bar chart of the per-minute counts.
fn bars(counts: &[i64]) -> Markup {
    let max = counts.iter().copied().max().unwrap_or(0).max(1);
    let (w, h) = (4_i64, 60_i64);
    let width = w * counts.len() as i64;
    html! {
        svg.chart viewBox={ "0 0 " (width) " " (h) } width="100%" height="60" role="img"
            aria-label={ "Signals per minute, highest " (max) } {
            @for (i, n) in counts.iter().enumerate() {
                @let bar = n * (h - 2) / max;
                rect x=(i as i64 * w) y=(h - bar) width=(w - 1) height=(bar) fill="#2f6fb0" {
                    title { (n) }
                }
            }
        }
    }
}

fn decision_bars(counts: &[(&str, i64)]) -> Markup {
    let max = counts.iter().map(|(_, n)| *n).max().unwrap_or(0).max(1);
    html! {
        table.decisions {
            tbody {
                @for (decision, n) in counts {
                    tr {
                        td { (layout::decision(decision)) }
                        td {
                            svg width="120" height="12" role="img" aria-label={ (n) " " (decision) } {
                                rect x="0" y="1" width=(n * 120 / max) height="10" fill="#2f6fb0";
                            }
                        }
                        td.num { (n) }
                    }
                }
            }
        }
    }
}
