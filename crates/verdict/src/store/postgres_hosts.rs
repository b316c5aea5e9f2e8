//! The hosts a PostgreSQL URL names, and which of them takes writes.
//!
//! `VERDICT_DATABASE_URL` may name several hosts, as libpq's URLs do:
//! `postgres://user@h1:5432,h2:5433/db?options`. They are tried in order, and new connections go
//! to the first that accepts writes (`SHOW transaction_read_only` answers `off`: not a standby
//! in recovery, not read-only by configuration). While the pool runs, [`follow_writable`] checks
//! once a second, with one statement on a pooled connection, that the pool still reaches a host
//! that takes writes, and when it does not (killed, or demoted), probes the hosts in order and
//! moves new connections to the first that does, closing the older ones as they come back to
//! the pool: a standby promoted after a failover is used without a restart. It never moves away
//! from a host that still takes writes, so an old primary that comes back is not written to
//! beside the new one.
//!
//! With a single host none of this runs: the pool connects to it as sqlx would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{ConnectOptions, Connection, PgConnection};
use tokio::sync::Notify;

/// A URL with an empty host in its list (`h1,,h2` or a trailing comma).
#[derive(Debug, thiserror::Error)]
#[error("the database URL names an empty host in its host list")]
pub struct EmptyHost;

/// One single-host URL per host a `postgres://` URL names, in order; any other URL (or one with
/// a single host) comes back unchanged, as the only element.
pub fn split_hosts(url: &str) -> Result<Vec<String>, EmptyHost> {
    let Some(scheme_end) = ["postgres://", "postgresql://"]
        .iter()
        .find(|scheme| url.starts_with(*scheme))
        .map(|scheme| scheme.len())
    else {
        return Ok(vec![url.to_owned()]);
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    // Userinfo ends at the last '@' (a literal '@' in a password must be percent-encoded, but
    // splitting at the last one is what URL parsers do).
    let hosts_start = authority.rfind('@').map_or(0, |at| at + 1);
    let hosts = &authority[hosts_start..];
    if !hosts.contains(',') {
        return Ok(vec![url.to_owned()]);
    }
    let (prefix, suffix) = (&url[..scheme_end + hosts_start], &rest[authority_end..]);
    hosts
        .split(',')
        .map(|host| match host.trim() {
            "" => Err(EmptyHost),
            host => Ok(format!("{prefix}{host}{suffix}")),
        })
        .collect()
}

/// How often the host new connections go to is checked.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long one host may take to connect and answer whether it takes writes.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// `host:port`, for logs (never the user or password).
pub fn label(options: &PgConnectOptions) -> String {
    format!("{}:{}", options.get_host(), options.get_port())
}

/// Whether a connection's server takes writes.
pub async fn takes_writes(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let read_only: String = sqlx::query_scalar("SHOW transaction_read_only")
        .fetch_one(conn)
        .await?;
    Ok(read_only == "off")
}

/// Connects to one host and asks whether it takes writes; `Err` says why not, for logs.
async fn probe(options: &PgConnectOptions) -> Result<(), String> {
    let attempt = async {
        let mut conn = options.connect().await?;
        let writable = takes_writes(&mut conn).await;
        let _ = conn.close().await;
        writable
    };
    match tokio::time::timeout(PROBE_TIMEOUT, attempt).await {
        Ok(Ok(true)) => Ok(()),
        Ok(Ok(false)) => Err("read-only (a standby, or transaction_read_only)".into()),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
    }
}

/// The first host, in order, that takes writes now; `Err` lists why each one does not.
pub async fn first_writable(hosts: &[PgConnectOptions]) -> Result<usize, String> {
    let mut why = Vec::new();
    for (i, options) in hosts.iter().enumerate() {
        match probe(options).await {
            Ok(()) => return Ok(i),
            Err(reason) => why.push(format!("{}: {reason}", label(options))),
        }
    }
    Err(why.join("; "))
}

/// Whether the pool still reaches a host that takes writes: one statement on a pooled
/// connection, no new connection while all is well.
async fn pool_takes_writes(pool: &PgPool) -> bool {
    let check = async {
        let mut conn = pool.acquire().await?;
        takes_writes(&mut conn).await
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, check).await,
        Ok(Ok(true))
    )
}

/// When new connections last moved to another host. A pooled connection opened before then is
/// closed instead of handed out (`PgPoolOptions::before_acquire`), so none lingers on a host
/// that stopped taking writes but still answers (a demoted primary).
#[derive(Debug, Default)]
pub struct Switched(std::sync::Mutex<Option<Instant>>);

impl Switched {
    fn mark(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// Whether a connection opened `age` ago was opened since the last switch.
    pub fn is_current(&self, age: Duration) -> bool {
        match *self.0.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(at) => age < at.elapsed(),
            None => true,
        }
    }
}

/// Keeps the pools' new connections on a host that takes writes, until the first pool is
/// closed; each pool has its own options per host, in the same order. The first pool is the
/// one checked. `wake` checks at once (a new connection found its host read-only).
pub async fn follow_writable(
    pools: Vec<(PgPool, Arc<[PgConnectOptions]>)>,
    mut current: usize,
    wake: Arc<Notify>,
    switched: Arc<Switched>,
) {
    let mut unavailable_since: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(CHECK_EVERY) => {}
            _ = wake.notified() => {}
        }
        let Some((pool, hosts)) = pools.first() else {
            return;
        };
        if pool.is_closed() {
            return;
        }
        if pool_takes_writes(pool).await {
            continue;
        }
        match first_writable(hosts).await {
            Ok(found) => {
                if found != current {
                    tracing::warn!(
                        from = %label(&hosts[current]),
                        to = %label(&hosts[found]),
                        "database failover: new connections go to the host that takes writes"
                    );
                    for (pool, hosts) in &pools {
                        pool.set_connect_options(hosts[found].clone());
                    }
                    switched.mark();
                    current = found;
                }
                if let Some(since) = unavailable_since.take() {
                    tracing::info!(
                        host = %label(&hosts[current]),
                        after_ms = since.elapsed().as_millis() as u64,
                        "a database host takes writes again"
                    );
                }
            }
            Err(why) if unavailable_since.is_none() => {
                tracing::warn!(
                    hosts = %why,
                    "no database host takes writes; checking again every second"
                );
                unavailable_since = Some(Instant::now());
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_host_url_comes_back_unchanged() {
        for url in [
            "postgres://u:p@db.example:5432/verdict?sslmode=require",
            "postgresql://localhost/verdict",
            "postgres:///verdict?host=/var/run/postgresql",
            "sqlite://verdict.db",
        ] {
            assert_eq!(split_hosts(url).unwrap(), vec![url.to_owned()]);
        }
    }

    #[test]
    fn several_hosts_become_one_url_each_in_order() {
        assert_eq!(
            split_hosts("postgres://verdict:s3cr%40t@h1:5432,h2:5433,h3/db?sslmode=prefer")
                .unwrap(),
            vec![
                "postgres://verdict:s3cr%40t@h1:5432/db?sslmode=prefer",
                "postgres://verdict:s3cr%40t@h2:5433/db?sslmode=prefer",
                "postgres://verdict:s3cr%40t@h3/db?sslmode=prefer",
            ]
        );
    }

    #[test]
    fn hosts_without_userinfo_or_path_and_ipv6_literals_are_split() {
        assert_eq!(
            split_hosts("postgresql://[::1]:5432,127.0.0.1:5433").unwrap(),
            vec!["postgresql://[::1]:5432", "postgresql://127.0.0.1:5433"]
        );
        assert_eq!(
            split_hosts("postgres://u@a,b?application_name=x").unwrap(),
            vec![
                "postgres://u@a?application_name=x",
                "postgres://u@b?application_name=x"
            ]
        );
    }

    #[test]
    fn a_comma_after_the_host_list_is_not_a_host() {
        let url = "postgres://u@h1/db?options=-c%20a=1,2";
        assert_eq!(split_hosts(url).unwrap(), vec![url.to_owned()]);
    }

    #[test]
    fn an_empty_host_in_the_list_is_refused() {
        assert!(split_hosts("postgres://u@h1,,h2/db").is_err());
        assert!(split_hosts("postgres://u@h1,/db").is_err());
    }

    #[test]
    fn only_connections_opened_since_the_last_switch_are_current() {
        let switched = Switched::default();
        assert!(
            switched.is_current(Duration::from_secs(3600)),
            "no switch yet"
        );
        switched.mark();
        std::thread::sleep(Duration::from_millis(20));
        assert!(switched.is_current(Duration::from_millis(1)));
        assert!(!switched.is_current(Duration::from_secs(1)));
    }

    #[test]
    fn every_split_url_parses_as_the_host_it_names() {
        let hosts: Vec<PgConnectOptions> =
            split_hosts("postgres://verdict@10.0.0.1:6432,db-2.internal:5433/verdict")
                .unwrap()
                .iter()
                .map(|u| u.parse().unwrap())
                .collect();
        let labels: Vec<String> = hosts.iter().map(label).collect();
        assert_eq!(labels, ["10.0.0.1:6432", "db-2.internal:5433"]);
        assert!(hosts.iter().all(|h| h.get_database() == Some("verdict")));
        assert!(hosts.iter().all(|h| h.get_username() == "verdict"));
    }
}
