//! A sender that sends one signal until it gets a final answer, as a careful client does: the
//! same key (or none) and the same body bytes on every retry, with a fresh `Verdict-Timestamp`
//! and signature each time; connection errors, a gateway's 502 or 504, 409 and 503 are
//! retried. A [`Tally`] counts what the senders of a scenario met on the way.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{Reply, Tenant, now, signed};

/// The actions the default playbook's `recent_sim_swap` rule runs, in order.
pub const SIM_SWAP_ACTIONS: [&str; 5] = [
    "lock_account",
    "open_case",
    "alert_customer",
    "deny",
    "callback",
];

/// The longest a 503 may take: the outage contract.
pub const UNAVAILABLE_WITHIN: Duration = Duration::from_secs(2);

/// What the senders of one scenario met.
#[derive(Default)]
pub struct Tally {
    pub sends: AtomicUsize,
    pub connection_errors: AtomicUsize,
    /// 502s and 504s from a balancer in front of the servers (not a problem from verdict): the
    /// instance it forwarded to died with the request in flight.
    pub gateway_errors: AtomicUsize,
    pub conflicts_409: AtomicUsize,
    pub unavailable_503: AtomicUsize,
    /// 503s that came without a `Retry-After` header.
    pub unavailable_without_retry_after: AtomicUsize,
    /// 503s that took longer than [`UNAVAILABLE_WITHIN`].
    pub unavailable_slow: AtomicUsize,
    pub slowest_503_ms: AtomicU64,
    /// The slowest answer of any status (connection errors aside), and how many took longer
    /// than [`UNAVAILABLE_WITHIN`].
    pub slowest_answer_ms: AtomicU64,
    pub slow_answers: AtomicUsize,
    pub replayed_answers: AtomicUsize,
    /// When the last 409 was answered.
    pub last_conflict: Mutex<Option<Instant>>,
}

impl Tally {
    pub fn get(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::Relaxed)
    }

    /// Retries: sends beyond the first of each of `signals`.
    pub fn retries(&self, signals: usize) -> usize {
        Tally::get(&self.sends).saturating_sub(signals)
    }

    /// One line: what was sent and what came back on the way to the final answers.
    pub fn summary(&self) -> String {
        format!(
            "{} sends ({} connection errors, {} gateway 502/504, {} × 409, {} × 503 (slowest {} \
             ms, {} over {} ms, {} without Retry-After), {} final answers replayed from the \
             record; slowest answer {} ms, {} over {} ms)",
            Tally::get(&self.sends),
            Tally::get(&self.connection_errors),
            Tally::get(&self.gateway_errors),
            Tally::get(&self.conflicts_409),
            Tally::get(&self.unavailable_503),
            self.slowest_503_ms.load(Ordering::Relaxed),
            Tally::get(&self.unavailable_slow),
            UNAVAILABLE_WITHIN.as_millis(),
            Tally::get(&self.unavailable_without_retry_after),
            Tally::get(&self.replayed_answers),
            self.slowest_answer_ms.load(Ordering::Relaxed),
            Tally::get(&self.slow_answers),
            UNAVAILABLE_WITHIN.as_millis(),
        )
    }

    /// Counts how long an answer took, whatever its status.
    pub fn answered(&self, took: Duration) {
        if took > UNAVAILABLE_WITHIN {
            self.slow_answers.fetch_add(1, Ordering::Relaxed);
        }
        self.slowest_answer_ms
            .fetch_max(took.as_millis() as u64, Ordering::Relaxed);
    }

    /// Counts one 503 and how it came.
    pub fn unavailable(&self, reply: &Reply, took: Duration) {
        self.unavailable_503.fetch_add(1, Ordering::Relaxed);
        if reply.header("retry-after").is_none() {
            self.unavailable_without_retry_after
                .fetch_add(1, Ordering::Relaxed);
        }
        if took > UNAVAILABLE_WITHIN {
            self.unavailable_slow.fetch_add(1, Ordering::Relaxed);
        }
        self.slowest_503_ms
            .fetch_max(took.as_millis() as u64, Ordering::Relaxed);
    }
}

/// How long a sender waits before retrying.
#[derive(Clone, Copy, Debug)]
pub struct Waits {
    pub after_connection_error: Duration,
    pub after_409: Duration,
    pub after_503: Duration,
}

impl Default for Waits {
    /// Shorter than the `Retry-After` the server asks for, to keep the pressure on the fault.
    fn default() -> Self {
        Waits {
            after_connection_error: Duration::from_millis(50),
            after_409: Duration::from_millis(250),
            after_503: Duration::from_millis(100),
        }
    }
}

/// Sends one signal to whichever server `base` names now until it gets a final answer (neither
/// a connection error, nor a gateway's 502 or 504, nor 409, nor 503), or panics after
/// `deadline`.
pub async fn send_until_answered(
    client: &reqwest::Client,
    base: &Mutex<String>,
    tenant: &Tenant,
    key: Option<&str>,
    body: &str,
    tally: &Tally,
    deadline: Duration,
) -> Reply {
    let waits = Waits::default();
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < deadline,
            "signal {key:?} got no final answer within {deadline:?}"
        );
        let url = format!("{}/v1/signals", base.lock().unwrap());
        tally.sends.fetch_add(1, Ordering::Relaxed);
        let sent = Instant::now();
        let req = signed(client.post(url), tenant, key, body, now());
        let Ok(resp) = req.send().await else {
            tally.connection_errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(waits.after_connection_error).await;
            continue;
        };
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let Ok(bytes) = resp.bytes().await else {
            // The process died while the response was on its way.
            tally.connection_errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(waits.after_connection_error).await;
            continue;
        };
        let reply = Reply {
            status,
            headers,
            body: bytes.to_vec(),
        };
        tally.answered(sent.elapsed());
        match status {
            // The balancer's own page: for the sender the same as a connection lost on the way.
            502 | 504 if !reply.is_problem() => {
                tally.gateway_errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(waits.after_connection_error).await;
            }
            409 => {
                tally.conflicts_409.fetch_add(1, Ordering::Relaxed);
                *tally.last_conflict.lock().unwrap() = Some(Instant::now());
                tokio::time::sleep(waits.after_409).await;
            }
            503 => {
                tally.unavailable(&reply, sent.elapsed());
                tokio::time::sleep(waits.after_503).await;
            }
            _ => {
                if reply.replayed() {
                    tally.replayed_answers.fetch_add(1, Ordering::Relaxed);
                }
                return reply;
            }
        }
    }
}

/// A client for senders: no redirects, a 30 s deadline per request.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// What is wrong with a final answer to a fresh SIM swap, if anything: it must be a 200 with
/// the default playbook's `recent_sim_swap` decision and every action done.
pub fn wrong_sim_swap_answer(reply: &Reply) -> Option<String> {
    if reply.status != 200 {
        return Some(format!(
            "status {}: {}",
            reply.status,
            String::from_utf8_lossy(&reply.body)
        ));
    }
    let json = reply.json();
    let actions = action_outcomes(&json);
    let expected: Vec<(String, String)> = SIM_SWAP_ACTIONS
        .iter()
        .map(|a| ((*a).to_owned(), "done".to_owned()))
        .collect();
    if json["decision"] != "deny" || json["rule"] != "recent_sim_swap" || actions != expected {
        return Some(format!(
            "decision {} rule {} actions {:?}",
            json["decision"], json["rule"], actions
        ));
    }
    None
}

/// A decision's `(action, outcome)` pairs, in order.
pub fn action_outcomes(json: &serde_json::Value) -> Vec<(String, String)> {
    json["actions"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    (
                        x["action"].as_str().unwrap_or("?").to_owned(),
                        x["outcome"].as_str().unwrap_or("?").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}
