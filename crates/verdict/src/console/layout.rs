//! The console's page frame and the small pieces every page uses.

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

use super::Operator;

/// The console's sections, for the navigation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Events,
    Deliveries,
    Endpoints,
    Playbook,
    Live,
    Subjects,
}

impl Section {
    const ALL: [(Section, &'static str, &'static str); 6] = [
        (Section::Events, "Events", "/console/events"),
        (Section::Deliveries, "Deliveries", "/console/deliveries"),
        (Section::Endpoints, "Endpoints", "/console/endpoints"),
        (Section::Subjects, "Subjects", "/console/subjects"),
        (Section::Playbook, "Playbook", "/console/playbook"),
        (Section::Live, "Live", "/console/live"),
    ];
}

fn head(title: &str) -> Markup {
    html! {
        meta charset="utf-8";
        meta name="viewport" content="width=device-width, initial-scale=1";
        title { (title) " · verdict" }
        link rel="stylesheet" href="/console/static/console.css";
        link rel="icon" type="image/svg+xml" href="/console/static/favicon.svg";
    }
}

/// A page of a signed-in operator.
pub fn page(title: &str, operator: &Operator, section: Section, body: Markup) -> Response {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head { (head(title)) }
            body {
                header.top {
                    span.brand { "verdict" }
                    nav aria-label="Sections" {
                        ul {
                            @for (s, name, href) in Section::ALL {
                                li {
                                    @if s == section {
                                        a href=(href) aria-current="page" { (name) }
                                    } @else {
                                        a href=(href) { (name) }
                                    }
                                }
                            }
                        }
                    }
                    form.sign-out method="post" action="/console/sign-out" {
                        input type="hidden" name="csrf" value=(operator.csrf);
                        span.who { (operator.grant.tenant.name) " · " (operator.grant.scope.as_str()) " key" }
                        button type="submit" { "Sign out" }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    };
    Html(markup.into_string()).into_response()
}

/// A page without navigation (sign-in).
pub fn bare(title: &str, body: Markup) -> Response {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head { (head(title)) }
            body.bare { main { (body) } }
        }
    };
    Html(markup.into_string()).into_response()
}

/// A refusal shown as a page.
pub fn refusal(status: StatusCode, message: &str) -> Response {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head { (head("Refused")) }
            body.bare {
                main {
                    h1 { "Refused" }
                    p.error role="alert" { (message) }
                    p { a href="/console/events" { "Back to the console" } }
                }
            }
        }
    };
    (status, Html(markup.into_string())).into_response()
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS` UTC.
pub fn time(ms: i64) -> String {
    let format = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&format).ok())
        .unwrap_or_else(|| "-".into())
}

/// A decision as a labelled badge.
pub fn decision(decision: &str) -> Markup {
    html! { span class={ "badge " (decision) } { (decision) } }
}

/// A hidden CSRF field for a form that acts.
pub fn csrf(operator: &Operator) -> Markup {
    html! { input type="hidden" name="csrf" value=(operator.csrf); }
}

/// The `done` query parameter a page is redirected with after an action.
#[derive(Debug, Default, serde::Deserialize)]
pub struct DoneQuery {
    pub done: Option<String>,
}

impl DoneQuery {
    /// The notice the parameter names; anything else (a forged link's text) shows nothing.
    pub fn notice(&self) -> Option<Notice> {
        Notice::named(self.done.as_deref()?)
    }
}

/// What a page may say after an action: a fixed set, so a link cannot put its own words (or
/// markup) on a console page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice {
    /// A redelivery was attempted.
    Redelivered,
    /// A redelivery came too soon after the last.
    RedeliveredTooSoon,
    /// A redelivery found an attempt in progress or the endpoint disabled.
    NotRedelivered,
    /// An `unknown` request was resolved as done.
    ResolvedDone,
    /// An `unknown` request was resolved as failed.
    ResolvedFailed,
    /// A playbook was published (the page names the version in force).
    Published,
    /// A callback endpoint was enabled.
    EndpointEnabled,
    /// A callback endpoint was disabled.
    EndpointDisabled,
}

impl Notice {
    const ALL: [Notice; 8] = [
        Self::Redelivered,
        Self::RedeliveredTooSoon,
        Self::NotRedelivered,
        Self::ResolvedDone,
        Self::ResolvedFailed,
        Self::Published,
        Self::EndpointEnabled,
        Self::EndpointDisabled,
    ];

    /// Its name in a `done` parameter.
    pub fn name(self) -> &'static str {
        match self {
            Self::Redelivered => "redelivered",
            Self::RedeliveredTooSoon => "redelivered-too-soon",
            Self::NotRedelivered => "not-redelivered",
            Self::ResolvedDone => "resolved-done",
            Self::ResolvedFailed => "resolved-failed",
            Self::Published => "published",
            Self::EndpointEnabled => "endpoint-enabled",
            Self::EndpointDisabled => "endpoint-disabled",
        }
    }

    /// The notice named `name`, if any.
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|n| n.name() == name)
    }

    /// What the page shows.
    pub fn text(self) -> &'static str {
        match self {
            Self::Redelivered => "Redelivered: the new attempt is listed below.",
            Self::RedeliveredTooSoon => "Redelivered too recently; try again in a few seconds.",
            Self::NotRedelivered => {
                "Not redelivered: an attempt is in progress or the endpoint is disabled."
            }
            Self::ResolvedDone => "Resolved done: recorded with your reason.",
            Self::ResolvedFailed => "Resolved failed: recorded with your reason.",
            Self::Published => "Published: the new version is now in force.",
            Self::EndpointEnabled => {
                "Enabled: its callbacks suspended meanwhile are each sent once."
            }
            Self::EndpointDisabled => {
                "Disabled: its callbacks are stored suspended until it is enabled."
            }
        }
    }
}

/// A message after an action, if there is one.
pub fn notice(notice: Option<Notice>) -> Markup {
    html! {
        @if let Some(notice) = notice {
            p.notice role="status" { (notice.text()) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_fixed_notices_are_shown() {
        for n in Notice::ALL {
            assert_eq!(Notice::named(n.name()), Some(n));
        }
        for forged in [
            "<script>alert(1)</script>",
            "Your key expired: call +1 555",
            "",
        ] {
            assert_eq!(Notice::named(forged), None, "{forged}");
            let q = DoneQuery {
                done: Some(forged.into()),
            };
            assert!(notice(q.notice()).into_string().is_empty());
        }
    }
}
