//! How an event's action outcomes are stored: as their JSON, or, when no action has a
//! connector (most decisions), as a short list: each action's name, followed by `=` and its
//! outcome unless it is `done`, comma-separated (`lock_account,deny,callback=failed: no
//! callback URL is configured`). The list is a third of the JSON's bytes in every event row,
//! and reads back as the same JSON.

use std::borrow::Cow;

use super::{ActionResult, Outcome, UnknownAction};

/// Why stored action outcomes cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum StoredActionsError {
    #[error("a stored action is not one")]
    Action(#[from] UnknownAction),
    #[error("the stored actions are not action results")]
    Json(#[from] serde_json::Error),
}

/// The stored form of `results`, whose JSON is `json`: the short list when no action has a
/// connector, no outcome holds a comma, and the list reads back as `json` byte for byte;
/// else `json`.
pub fn stored_form(results: &[ActionResult], json: &str) -> String {
    if results.is_empty() || results.iter().any(|r| r.connector.is_some()) {
        return json.to_owned();
    }
    let mut entries = Vec::with_capacity(results.len());
    for r in results {
        match &r.outcome {
            Outcome::Done => entries.push(r.action.as_str().to_owned()),
            other => {
                let Ok(serde_json::Value::String(outcome)) = serde_json::to_value(other) else {
                    return json.to_owned();
                };
                if outcome.contains(',') {
                    return json.to_owned();
                }
                entries.push(format!("{}={outcome}", r.action));
            }
        }
    }
    let list = entries.join(",");
    match as_json(&list) {
        Ok(back) if back == json => list,
        _ => json.to_owned(),
    }
}

/// The JSON of stored action outcomes, whichever form they were stored in.
pub fn as_json(stored: &str) -> Result<Cow<'_, str>, StoredActionsError> {
    // JSON is an array; no action's name starts with `[`.
    if stored.starts_with('[') {
        return Ok(Cow::Borrowed(stored));
    }
    let results = stored
        .split(',')
        .map(|entry| {
            let (name, outcome) = match entry.split_once('=') {
                Some((name, outcome)) => (
                    name,
                    serde_json::from_value(serde_json::Value::String(outcome.to_owned()))?,
                ),
                None => (entry, Outcome::Done),
            };
            Ok(ActionResult {
                action: name.parse()?,
                outcome,
                connector: None,
            })
        })
        .collect::<Result<Vec<_>, StoredActionsError>>()?;
    // Action results are names and strings: serialising them cannot fail.
    Ok(Cow::Owned(
        serde_json::to_string(&results).unwrap_or_default(),
    ))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::ActionKind;

    fn result(action: ActionKind, outcome: Outcome) -> ActionResult {
        ActionResult {
            action,
            outcome,
            connector: None,
        }
    }

    #[test]
    fn actions_all_done_are_stored_by_name_and_read_back_as_their_json() {
        let results = vec![
            result(ActionKind::LockAccount, Outcome::Done),
            result(ActionKind::Callback, Outcome::Done),
        ];
        let json = serde_json::to_string(&results).unwrap();
        let stored = stored_form(&results, &json);
        assert_eq!(stored, "lock_account,callback");
        assert_eq!(as_json(&stored).unwrap(), json);
    }

    #[test]
    fn other_outcomes_are_stored_after_their_names() {
        let results = vec![
            result(ActionKind::Deny, Outcome::Done),
            result(ActionKind::OpenCase, Outcome::AlreadyDone),
            result(
                ActionKind::Callback,
                Outcome::Failed("no callback URL is configured".into()),
            ),
        ];
        let json = serde_json::to_string(&results).unwrap();
        let stored = stored_form(&results, &json);
        assert_eq!(
            stored,
            "deny,open_case=already_done,callback=failed: no callback URL is configured"
        );
        assert_eq!(as_json(&stored).unwrap(), json);
    }

    #[test]
    fn a_connector_or_a_comma_in_an_outcome_keeps_the_json() {
        let comma = vec![result(ActionKind::OpenCase, Outcome::Failed("a, b".into()))];
        let json = serde_json::to_string(&comma).unwrap();
        assert_eq!(stored_form(&comma, &json), json);
        let bound = vec![ActionResult {
            connector: Some("cases".parse().unwrap()),
            ..result(ActionKind::OpenCase, Outcome::Done)
        }];
        let json = serde_json::to_string(&bound).unwrap();
        assert_eq!(stored_form(&bound, &json), json);
        assert_eq!(stored_form(&[], "[]"), "[]");
        assert_eq!(as_json("[]").unwrap(), "[]");
    }

    #[test]
    fn a_name_that_is_no_action_is_refused() {
        assert!(as_json("lock_account,Nope").is_err());
        assert!(as_json("Nope=done").is_err());
        assert!(as_json("").is_err());
    }

    proptest! {
        #[test]
        fn every_stored_form_reads_back_as_the_json_it_was_made_from(
            picks in proptest::collection::vec((0usize..9, 0usize..6, any::<bool>()), 0..8),
        ) {
            let outcomes = [
                Outcome::Done,
                Outcome::AlreadyDone,
                Outcome::Pending,
                Outcome::Failed("x, \"y\"".into()),
                Outcome::Failed("=no: \"y\" é".into()),
                Outcome::Unknown,
            ];
            let results: Vec<ActionResult> = picks
                .iter()
                .map(|&(action, outcome, bound)| ActionResult {
                    action: ActionKind::BUILT_IN[action % ActionKind::BUILT_IN.len()],
                    outcome: outcomes[outcome].clone(),
                    connector: bound.then(|| "idp".parse().unwrap()),
                })
                .collect();
            let json = serde_json::to_string(&results).unwrap();
            let stored = stored_form(&results, &json);
            prop_assert_eq!(as_json(&stored).unwrap(), json);
        }
    }
}
