//! Playbook parsing, limits and decisions.

use super::*;
use crate::signal::Subject;
use time::macros::datetime;

const NOW: OffsetDateTime = datetime!(2026-11-30 12:00 UTC);

fn signal(signal_type: SignalType, observed_at: OffsetDateTime, attributes: Value) -> Signal {
    Signal {
        signal_type,
        subject: Subject::Account("a".into()),
        observed_at,
        attributes: attributes.as_object().cloned().unwrap_or_default(),
        metadata: Default::default(),
    }
}

#[test]
fn default_playbook_is_valid_and_denies_a_recent_sim_swap() {
    let pb = Playbook::default_playbook();
    let recent = signal(SignalType::SimSwap, NOW - Duration::hours(1), Value::Null);
    let v = pb.decide(&recent, SubjectFacts::default(), NOW);
    assert_eq!(
        (v.decision, v.rule.as_str()),
        (Decision::Deny, "recent_sim_swap")
    );
    let old = signal(SignalType::PortOut, NOW - Duration::hours(73), Value::Null);
    assert_eq!(
        pb.decide(&old, SubjectFacts::default(), NOW).decision,
        Decision::Allow
    );
    let breach = signal(SignalType::CredentialBreach, NOW, Value::Null);
    assert_eq!(
        pb.decide(&breach, SubjectFacts::default(), NOW).decision,
        Decision::StepUp
    );
    let locked = SubjectFacts { locked: true };
    assert_eq!(pb.decide(&old, locked, NOW).rule, "subject_already_locked");
}

#[test]
fn attribute_conditions_match_as_documented() {
    let pb = Playbook::parse(
        r#"
        [[rule]]
        name = "swap_near_observation"
        when = { type = ["sim_swap"], attribute_within_hours = { attribute = "swapped_at", hours = 24 } }
        decision = "deny"
        actions = ["lock_account"]

        [[rule]]
        name = "risky_carrier"
        when = { attribute_in = { attribute = "to_carrier", values = ["burner"] } }
        decision = "step_up"

        [[rule]]
        name = "severe"
        when = { attribute_at_least = { attribute = "severity", value = 7 } }
        decision = "deny"
        "#,
        Format::Toml,
    )
    .unwrap();
    let facts = SubjectFacts::default();
    let swap = signal(
        SignalType::SimSwap,
        NOW,
        serde_json::json!({"swapped_at": "2026-11-30T01:00:00Z"}),
    );
    assert_eq!(pb.decide(&swap, facts, NOW).rule, "swap_near_observation");
    let stale = signal(
        SignalType::SimSwap,
        NOW,
        serde_json::json!({"swapped_at": "2026-11-01T01:00:00Z"}),
    );
    assert_eq!(pb.decide(&stale, facts, NOW).rule, "no_rule_matched");
    let port = signal(
        SignalType::PortOut,
        NOW,
        serde_json::json!({"to_carrier": "burner"}),
    );
    assert_eq!(pb.decide(&port, facts, NOW).decision, Decision::StepUp);
    let breach = signal(
        SignalType::CredentialBreach,
        NOW,
        serde_json::json!({"severity": 9}),
    );
    assert_eq!(pb.decide(&breach, facts, NOW).rule, "severe");
    let mild = signal(
        SignalType::CredentialBreach,
        NOW,
        serde_json::json!({"severity": 2}),
    );
    assert_eq!(pb.decide(&mild, facts, NOW).decision, Decision::Allow);
}

#[test]
fn json_playbooks_parse_like_toml() {
    let pb = Playbook::parse(
        r#"{"rule":[{"name":"all","decision":"step_up","actions":["callback"]}]}"#,
        Format::Json,
    )
    .unwrap();
    assert_eq!(pb.rules[0].actions, vec![ActionKind::Callback]);
}

#[test]
fn invalid_playbooks_are_refused_with_an_error_naming_the_problem() {
    let cases = [
        ("[[rule]]\nname = \"a\"\ndecision = \"maybe\"\n", "maybe"),
        (
            "[[rule]]\nname = \"a\"\ndecision = \"deny\"\nactions = [\"launch_missiles\"]\n",
            "launch_missiles",
        ),
        (
            "[[rule]]\nname = \"a\"\ndecision = \"deny\"\nwhen = { colour = \"red\" }\n",
            "colour",
        ),
        (
            "[[rule]]\nname = \"a\"\ndecision = \"deny\"\n[[rule]]\nname = \"a\"\ndecision = \"allow\"\n",
            "same name",
        ),
        (
            "[[rule]]\nname = \"a\"\ndecision = \"deny\"\nwhen = { observed_within_hours = -1 }\n",
            "observed_within_hours",
        ),
        ("", "at least one"),
    ];
    for (source, expected) in cases {
        let err = Playbook::parse(source, Format::Toml)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("invalid playbook"), "{err}");
        assert!(
            err.contains(expected),
            "{err:?} should mention {expected:?}"
        );
    }
    let err = Playbook::parse(
        "[[rule]]\nname = \"a\"\n\ndecision = \"maybe\"\n",
        Format::Toml,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("line 4"), "TOML errors name the line: {err}");
}

#[test]
fn playbooks_over_a_limit_are_refused_without_quoting_the_offender() {
    let rule = |name: &str, when: &str| {
        format!("[[rule]]\nname = \"{name}\"\ndecision = \"deny\"\nwhen = {{ {when} }}\n")
    };
    let long_name = "n".repeat(MAX_RULE_NAME_CHARS + 1);
    let many: String = (0..=MAX_RULES)
        .map(|i| rule(&format!("r{i}"), ""))
        .collect();
    let values: Vec<String> = (0..=MAX_ATTRIBUTE_VALUES)
        .map(|i| format!("\"v{i}\""))
        .collect();
    let cases = [
        (rule(&long_name, ""), "`name` is longer than 64"),
        (many, "101 rules"),
        (rule("a", "observed_within_hours = 1e16"), "ten years"),
        (
            rule(
                "a",
                "attribute_within_hours = { attribute = \"x\", hours = 87700 }",
            ),
            "ten years",
        ),
        (
            rule(
                "a",
                &format!("attribute_in = {{ attribute = \"{long_name}\", values = [\"x\"] }}"),
            ),
            "attribute name",
        ),
        (
            rule(
                "a",
                &format!(
                    "attribute_in = {{ attribute = \"c\", values = [{}] }}",
                    values.join(",")
                ),
            ),
            "at most 100 values",
        ),
    ];
    for (source, expected) in cases {
        let err = Playbook::parse(&source, Format::Toml).unwrap_err();
        assert!(matches!(err, PlaybookError::OverLimit(_)), "{err}");
        let text = err.to_string();
        assert!(
            text.contains(expected),
            "{text:?} should mention {expected:?}"
        );
        assert!(!text.contains(&long_name), "the error quotes the long name");
    }
    let big = format!("{}# {}\n", rule("a", ""), "x".repeat(MAX_PLAYBOOK_BYTES));
    assert!(matches!(
        Playbook::parse(&big, Format::Toml),
        Err(PlaybookError::TooLarge(_))
    ));
    assert!(Playbook::parse(&rule("a", "observed_within_hours = 87600"), Format::Toml).is_ok());
}

#[test]
fn a_stored_version_from_before_the_limits_still_decides() {
    let many: String = (0..=MAX_RULES)
        .map(|i| format!("[[rule]]\nname = \"r{i}\"\ndecision = \"allow\"\n"))
        .collect();
    assert!(Playbook::parse(&many, Format::Toml).is_err());
    assert_eq!(
        Playbook::parse_stored(&many, Format::Toml)
            .unwrap()
            .rules
            .len(),
        101
    );
}

#[test]
fn a_huge_window_decides_without_panicking() {
    let when = Conditions {
        observed_within_hours: Some(1e300),
        ..Conditions::default()
    };
    let signal = signal(SignalType::SimSwap, NOW, Value::Null);
    assert!(when.hold(&Observation::of(&signal), SubjectFacts::default(), NOW));
}

#[test]
fn feeds_map_set_event_types_with_a_built_in_for_risc_credential_compromise() {
    const CHANGED: &str = "https://schemas.openid.net/secevent/risc/event-type/identifier-changed";
    let pb = Playbook::parse(
        &format!(
            "[[rule]]\nname = \"a\"\ndecision = \"allow\"\n\n[feeds]\nset_events = {{ \"{CHANGED}\" = \"sim_swap\" }}\n"
        ),
        Format::Toml,
    )
    .unwrap();
    assert_eq!(pb.set_event_signal(CHANGED), Some(SignalType::SimSwap));
    assert_eq!(
        pb.set_event_signal(crate::domain::RISC_CREDENTIAL_COMPROMISE),
        Some(SignalType::CredentialBreach)
    );
    assert_eq!(
        pb.set_event_signal("https://schemas.openid.net/secevent/caep/event-type/session-revoked"),
        None
    );
    assert_eq!(Playbook::default_playbook().set_event_signal(CHANGED), None);
    let json = Playbook::parse(
        &format!(r#"{{"rule":[{{"name":"a","decision":"allow"}}],"feeds":{{"set_events":{{"{CHANGED}":"port_out"}}}}}}"#),
        Format::Json,
    )
    .unwrap();
    assert_eq!(json.set_event_signal(CHANGED), Some(SignalType::PortOut));
}

#[test]
fn feed_mappings_are_validated_and_bounded() {
    let with = |events: &str| {
        Playbook::parse(
            &format!(
                "[[rule]]\nname = \"a\"\ndecision = \"allow\"\n[feeds]\nset_events = {{ {events} }}\n"
            ),
            Format::Toml,
        )
    };
    assert!(matches!(
        with("\"not a uri\" = \"sim_swap\""),
        Err(PlaybookError::Invalid(_))
    ));
    assert!(matches!(
        with("\"urn:x\" = \"weather\""),
        Err(PlaybookError::Invalid(_))
    ));
    let long = format!("\"https://e.example/{}\" = \"sim_swap\"", "x".repeat(300));
    assert!(matches!(with(&long), Err(PlaybookError::OverLimit(_))));
    let many: Vec<String> = (0..=MAX_SET_EVENTS)
        .map(|i| format!("\"urn:e:{i}\" = \"sim_swap\""))
        .collect();
    assert!(matches!(
        with(&many.join(", ")),
        Err(PlaybookError::OverLimit(_))
    ));
    assert!(
        Playbook::parse(
            "[[rule]]\nname = \"a\"\ndecision = \"allow\"\n[feeds]\nother = 1\n",
            Format::Toml
        )
        .is_err()
    );
}

#[test]
fn no_matching_rule_allows_with_no_actions() {
    let pb = Playbook::parse(
        "[[rule]]\nname = \"only_breaches\"\nwhen = { type = [\"credential_breach\"] }\ndecision = \"deny\"\n",
        Format::Toml,
    )
    .unwrap();
    let v = pb.decide(
        &signal(SignalType::SimSwap, NOW, Value::Null),
        SubjectFacts::default(),
        NOW,
    );
    assert_eq!(v.decision, Decision::Allow);
    assert!(v.actions.is_empty());
}
