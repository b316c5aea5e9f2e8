//! Phase 2, **claim** (keyed signals): the key row inserted with the decision frozen on it,
//! or what holds the key learnt (a takeover resumes from the decision it recorded).

use uuid::Uuid;

use super::{Decided, Holding, Ingest, IngestError, Mapping, Prepared, Reply, ignored, record};
use crate::store::{Claim, ClaimOutcome, HeldKey, KeyRef, RecoveryPoint, StoreError};

impl Ingest {
    /// A claim of the key for this request, with the decision frozen on it.
    pub(super) fn new_claim(
        &self,
        signal: &Prepared<'_>,
        key: &KeyRef,
        decided: &Decided,
        now: i64,
    ) -> Claim {
        Claim {
            key: key.clone(),
            fingerprint: signal.inbound.fingerprint.0.to_vec(),
            event_id: Uuid::now_v7(),
            lock_token: Uuid::new_v4(),
            now,
            locked_until: now.saturating_add(self.settings.lock_timeout_ms),
            expires_at: now.saturating_add(self.settings.key_ttl_ms),
            ruling: record::json(decided),
        }
    }

    /// Commits the claim on its own, or learns what holds the key (at once when the key is
    /// `known_taken`). `Err(reply)` when the key's stored response answers the request.
    pub(super) async fn claim(
        &self,
        signal: &Prepared<'_>,
        key: &KeyRef,
        claim: Claim,
        decided: Decided,
        known_taken: bool,
    ) -> Result<Result<Holding, Reply>, IngestError> {
        let holding = |event_id, decided, expires_at| Holding {
            held: HeldKey {
                key: key.clone(),
                lock_token: claim.lock_token,
            },
            event_id,
            decided,
            expires_at,
        };
        if !known_taken && self.commits.claim(claim.clone(), &signal.approach).await? {
            return Ok(Ok(holding(claim.event_id, decided, claim.expires_at)));
        }
        Ok(match self.store.claim(&claim).await? {
            ClaimOutcome::Started => Ok(holding(claim.event_id, decided, claim.expires_at)),
            ClaimOutcome::TakenOver {
                event_id,
                from: RecoveryPoint::Calling { response },
                expires_at,
            } => {
                tracing::info!(%event_id, "took over a key with connector calls outstanding");
                let held = HeldKey {
                    key: key.clone(),
                    lock_token: claim.lock_token,
                };
                match self.resume_calls(&held, event_id, response).await {
                    Ok(response) => {
                        self.remember(signal, key, &response, expires_at);
                        return Ok(Err(Reply::Fresh(response)));
                    }
                    Err(err) => {
                        self.settle_failure(&err, &held).await;
                        return Err(err);
                    }
                }
            }
            ClaimOutcome::TakenOver {
                event_id,
                from,
                expires_at,
            } => {
                tracing::info!(%event_id, "took over an abandoned idempotency key");
                let taken = holding(event_id, decided, expires_at);
                match recorded_decision(from) {
                    Ok(recorded) => Ok(Holding {
                        decided: recorded.unwrap_or(taken.decided),
                        ..taken
                    }),
                    Err(err) => {
                        // The key is ours now: a final error is stored, not left locked.
                        let err = IngestError::from(err);
                        self.settle_failure(&err, &taken.held).await;
                        return Err(err);
                    }
                }
            }
            ClaimOutcome::InProgress => return Err(IngestError::InProgress),
            ClaimOutcome::Mismatch => return Err(IngestError::KeyReused),
            ClaimOutcome::Completed {
                response,
                expires_at,
            } => {
                self.remember(signal, key, &response, expires_at);
                Err(Reply::Replayed(response))
            }
        })
    }
}

/// The decision a taken-over row recorded; `None` for a v1 row claimed before decisions were
/// recorded (nothing of it was applied by this version, so deciding now is deciding once).
pub(super) fn recorded_decision(from: RecoveryPoint) -> Result<Option<Decided>, StoreError> {
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(Box::new(e));
    Ok(match from {
        RecoveryPoint::InFlight { ruling: None } => None,
        RecoveryPoint::InFlight {
            ruling: Some(ruling),
        } => {
            let mut recorded: Decided = serde_json::from_str(&ruling).map_err(corrupt)?;
            // Recorded before the mapping was kept: an ignored feed event says so by its rule.
            if recorded.mapping.is_none() && recorded.rule == ignored::IGNORED_RULE {
                recorded.mapping = Some(Mapping::Unmapped);
            }
            Some(recorded)
        }
        RecoveryPoint::Dispatched { action_results } => Some(Decided::from_v1_record(
            serde_json::from_str(&action_results).map_err(corrupt)?,
        )),
        // Finished by `resume_calls`, never decided again.
        RecoveryPoint::Calling { .. } => {
            return Err(StoreError::Corrupt(
                "a key with calls outstanding has no decision to act on".into(),
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::playbook::{Decision, SubjectFacts};

    fn in_flight(ruling: serde_json::Value) -> RecoveryPoint {
        RecoveryPoint::InFlight {
            ruling: Some(ruling.to_string()),
        }
    }

    #[test]
    fn a_recorded_decision_keeps_its_mapping_and_subject() {
        let decided = Decided {
            decision: Decision::Deny,
            rule: "recent_sim_swap".into(),
            actions: vec![],
            playbook_version: 3,
            evaluated_at: 1,
            facts: SubjectFacts::default(),
            mapping: Some(Mapping::Type(crate::signal::SignalType::PortOut)),
            subject: Some([7; 32]),
            bound: Default::default(),
        };
        let ruling = serde_json::to_value(&decided).unwrap();
        assert_eq!(recorded_decision(in_flight(ruling)).unwrap(), Some(decided));
    }

    #[test]
    fn an_ignored_event_recorded_before_mappings_were_kept_is_still_unmapped() {
        let ruling = serde_json::json!({
            "decision": "allow", "rule": "unmapped_event_type", "actions": [],
            "playbook_version": 2, "evaluated_at": 1, "facts": { "locked": false },
        });
        let recorded = recorded_decision(in_flight(ruling)).unwrap().unwrap();
        assert_eq!(recorded.mapping, Some(Mapping::Unmapped));
        assert_eq!(recorded.subject, None);
    }

    #[test]
    fn a_signal_recorded_before_mappings_were_kept_has_none() {
        let ruling = serde_json::json!({
            "decision": "deny", "rule": "recent_sim_swap", "actions": ["lock_account"],
            "playbook_version": 2, "evaluated_at": 1, "facts": { "locked": false },
        });
        let recorded = recorded_decision(in_flight(ruling)).unwrap().unwrap();
        assert_eq!(recorded.mapping, None);
    }

    #[test]
    fn a_recorded_subject_that_is_not_a_digest_is_corrupt() {
        let ruling = serde_json::json!({
            "decision": "deny", "rule": "r", "actions": [], "playbook_version": 2,
            "evaluated_at": 1, "facts": { "locked": false }, "subject": "c2hvcnQ=",
        });
        assert!(matches!(
            recorded_decision(in_flight(ruling)),
            Err(StoreError::Corrupt(_))
        ));
    }
}
