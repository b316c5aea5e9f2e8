//! Phase 1, **decide**: one batched read (the playbook version in force and the subject's
//! facts before this signal), then the playbook, in process.

use tracing::Instrument;

use super::phases::{self, Phase};
use super::{Decided, Destination, Ingest, Mapping, Prepared};
use crate::clock::to_ms;
use crate::playbook::SubjectFacts;
use crate::store::{DecisionInputs, StoreError};
use crate::telemetry;

impl Ingest {
    /// Where the signal's callback goes, read now.
    pub(super) async fn destination(
        &self,
        signal: &Prepared<'_>,
    ) -> Result<Destination, StoreError> {
        Ok(Destination::of(self.inputs(signal).await?))
    }

    /// What a decision reads about the signal's tenant and subject, in one batched read.
    pub(super) async fn inputs(&self, signal: &Prepared<'_>) -> Result<DecisionInputs, StoreError> {
        self.reads
            .read(signal.inbound.tenant.id, &signal.subject_hash)
            .await?
            // The tenant authenticated a moment ago; gone now means it was deleted under us.
            .ok_or_else(|| StoreError::Corrupt("the tenant is gone".into()))
    }

    /// Decides the signal from the playbook in force and the subject's facts before it, in a
    /// `decide` span (traces only) that records the decision and the playbook's version.
    pub(super) async fn decide(
        &self,
        signal: &Prepared<'_>,
    ) -> Result<(Decided, Destination), StoreError> {
        let span = telemetry::span!(
            "decide",
            decision = tracing::field::Empty,
            playbook_version = tracing::field::Empty,
        );
        let decided = phases::timed(
            Phase::Decide,
            self.decide_now(signal).instrument(span.clone()),
        )
        .await?;
        span.record("decision", decided.0.decision.as_str());
        span.record("playbook_version", decided.0.playbook_version);
        Ok(decided)
    }

    async fn decide_now(
        &self,
        signal: &Prepared<'_>,
    ) -> Result<(Decided, Destination), StoreError> {
        let tenant_id = signal.inbound.tenant.id;
        let inputs = self.inputs(signal).await?;
        let (playbook, playbook_version) = self
            .playbooks
            .get(&*self.store, tenant_id, inputs.playbook_version)
            .await?;
        let facts = SubjectFacts {
            locked: inputs.subject_locked,
        };
        let now = crate::clock::now_utc();
        let ruling = playbook.decide(&signal.inbound.signal, facts, now);
        let bound = playbook.bindings_of(&ruling.actions);
        let decided = Decided {
            decision: ruling.decision,
            rule: ruling.rule,
            actions: ruling.actions,
            playbook_version,
            evaluated_at: to_ms(now),
            facts,
            mapping: Some(Mapping::Type(signal.inbound.signal.signal_type)),
            subject: Some(signal.subject_hash),
            bound,
        };
        Ok((decided, Destination::of(inputs)))
    }
}
