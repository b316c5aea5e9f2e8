//! How an event's action outcomes are stored: as their JSON, or, when every action came out
//! `done` with no connector (most decisions), as their names alone, comma-separated. The names
//! are a quarter of the JSON's bytes in every event row, and read back as the same JSON.

use std::borrow::Cow;

use super::{ActionResult, Outcome, UnknownAction};

/// The stored form of `results`, whose JSON is `json`: their names when every one came out
/// `done` with no connector and the names read back as `json` byte for byte; else `json`.
pub fn stored_form(results: &[ActionResult], json: &str) -> String {
    let all_done = results
        .iter()
        .all(|r| r.outcome == Outcome::Done && r.connector.is_none());
    if results.is_empty() || !all_done {
        return json.to_owned();
    }
    let names = results
        .iter()
        .map(|r| r.action.as_str())
        .collect::<Vec<_>>()
        .join(",");
    match as_json(&names) {
        Ok(back) if back == json => names,
        _ => json.to_owned(),
    }
}

/// The JSON of stored action outcomes, whichever form they were stored in.
pub fn as_json(stored: &str) -> Result<Cow<'_, str>, UnknownAction> {
    // JSON is an array; no action's name starts with `[`.
    if stored.starts_with('[') {
        return Ok(Cow::Borrowed(stored));
    }
    let results = stored
        .split(',')
        .map(|name| {
            Ok(ActionResult {
                action: name.parse()?,
                outcome: Outcome::Done,
                connector: None,
            })
        })
        .collect::<Result<Vec<_>, UnknownAction>>()?;
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
    fn any_other_outcome_or_a_connector_keeps_the_json() {
        let failed = vec![
            result(ActionKind::Deny, Outcome::Done),
            result(ActionKind::OpenCase, Outcome::Failed("no".into())),
        ];
        let json = serde_json::to_string(&failed).unwrap();
        assert_eq!(stored_form(&failed, &json), json);
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
        assert!(as_json("").is_err());
    }

    proptest! {
        #[test]
        fn every_stored_form_reads_back_as_the_json_it_was_made_from(
            picks in proptest::collection::vec((0usize..9, 0usize..4, any::<bool>()), 0..8),
        ) {
            let outcomes = [
                Outcome::Done,
                Outcome::AlreadyDone,
                Outcome::Pending,
                Outcome::Failed("x, \"y\"".into()),
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
