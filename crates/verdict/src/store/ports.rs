//! The consumers' ports: each the sum of the aggregate traits one consumer uses, with a blanket
//! impl, so a consumer takes exactly what it reads and writes. They are named here, beside
//! [`super::Store`], because trait upcasting reaches only supertraits: the composition root's
//! `Arc<dyn Store>` converts to each because `Store` names them.

use super::{
    ActionStore, ActivityStore, ApiKeyStore, ConnectorStore, ConsoleSessionStore, DeliveryStore,
    EndpointStore, EventStore, FeedStore, KeyStore, OperatorStore, PipelineStore, PlaybookStore,
    SweepStore, TenantStore,
};

/// What tenant administration and [`Credentials`] read and write: tenants, their secrets,
/// their API keys and their callback endpoints (a tenant's callback URL is its `default`
/// endpoint).
pub trait TenantPort: TenantStore + ApiKeyStore + EndpointStore + Send + Sync {}

impl<T: ?Sized + TenantStore + ApiKeyStore + EndpointStore + Send + Sync> TenantPort for T {}

/// What endpoint administration reads and writes: the tenants' callback endpoints.
pub trait EndpointPort: EndpointStore + Send + Sync {}

impl<T: ?Sized + EndpointStore + Send + Sync> EndpointPort for T {}

/// What delivery reads and writes: the outbox and its attempts, the connectors action
/// requests go to, and the tenants' webhook secrets (through [`tenant::Credentials`]).
pub trait DeliveryPort: DeliveryStore + ConnectorStore + TenantPort {}

impl<T: ?Sized + DeliveryStore + ConnectorStore + TenantPort> DeliveryPort for T {}

/// What the feeds' registrations and CAMARA notifications read and write: their transmitters
/// and subscriptions, and the tenant they belong to.
pub trait FeedPort: FeedStore + TenantStore + Send + Sync {}

impl<T: ?Sized + FeedStore + TenantStore + Send + Sync> FeedPort for T {}

/// What the pipeline reads and writes: idempotency keys, playbooks and what a decision reads,
/// the group commit, and the action requests a takeover calls again.
pub trait IngestStore:
    KeyStore + PlaybookStore + PipelineStore + DeliveryStore + Send + Sync
{
}

impl<T: ?Sized + KeyStore + PlaybookStore + PipelineStore + DeliveryStore + Send + Sync> IngestStore
    for T
{
}

/// What retention deletes from: events (with their deliveries), playbook versions and ended
/// console sessions, and the expired idempotency keys the pruner deletes beside them; and
/// where its sweep has got to.
pub trait RetentionStore:
    EventStore + PlaybookStore + KeyStore + ConsoleSessionStore + SweepStore + Send + Sync
{
}

impl<
    T: ?Sized + EventStore + PlaybookStore + KeyStore + ConsoleSessionStore + SweepStore + Send + Sync,
> RetentionStore for T
{
}

/// What a playbook upload reads and writes: the tenant's playbook versions, and the
/// connectors its actions may bind.
pub trait PlaybookPort: PlaybookStore + ConnectorStore + Send + Sync {}

impl<T: ?Sized + PlaybookStore + ConnectorStore + Send + Sync> PlaybookPort for T {}

/// What the console reads and writes: its sessions, activity, events and their deliveries,
/// playbooks (and the connectors a playbook binds).
pub trait ConsoleStore:
    ConsoleSessionStore + ActivityStore + EventStore + DeliveryStore + PlaybookPort
{
}

impl<T: ?Sized + ConsoleSessionStore + ActivityStore + EventStore + DeliveryStore + PlaybookPort>
    ConsoleStore for T
{
}

/// What connector administration reads and writes: the tenants' connectors.
pub trait ConnectorPort: ConnectorStore + Send + Sync {}

impl<T: ?Sized + ConnectorStore + Send + Sync> ConnectorPort for T {}

/// What subjects read and write: the actions' state and the operators' undoing, with the
/// idempotency keys a way back may carry and the action requests a keyed retry finishes.
pub trait SubjectPort:
    ActionStore + OperatorStore + KeyStore + DeliveryStore + Send + Sync
{
}

impl<T: ?Sized + ActionStore + OperatorStore + KeyStore + DeliveryStore + Send + Sync> SubjectPort
    for T
{
}
